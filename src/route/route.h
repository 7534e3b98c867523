// The routing predicates, one per routed collective. Pure, and every input is alike on every rank:
// whether the communicator's route was committed (agreed by every rank, route_setup.h), the
// settings (in the agreed fingerprint), and the op's count and datatype, which NCCL requires
// to be equal on every rank. Nothing local — addresses, in-place-ness, memory type, capture
// state — may enter here: a rank-divergent route is a hang.
#pragma once

#include <cstdint>

#include "config.h"

namespace zc {

enum class RouteKind { kPassthrough, kCe };

struct RouteInputs {
  RouteMode mode = RouteMode::kAuto;
  bool committed = false;    // every rank agreed on the route for this communicator
  const char* why_not = "";  // why not, when !committed
  uint64_t total_bytes = 0;  // sendcount * typesize * nranks
  bool bytes_valid = true;   // datatype known and no overflow
  uint64_t min_bytes = 0;
  // auto routes on up to this many ranks (0 = any): a communicator may have committed for the
  // reduce-scatter's setting on more ranks than the all-gather's auto takes.
  int nranks = 0;
  uint64_t auto_max_ranks = 0;
};

struct RouteDecision {
  RouteKind route;
  const char* why;  // a static string, for logs
};

RouteDecision choose_allgather_route(const RouteInputs& in);

// What a reduce-scatter's ncclRedOp_t is to the route (premul_sums.h resolves it).
enum class RsReduce : uint8_t { kSum, kAvg, kPreMulSum, kOther };

// A reduce-scatter's: besides the mode and the agreement, what the route can sum (chunk_sum.h)
// and where its peers push (rs_scratch.h). A pre-multiplied sum's scalar is each rank's own
// (ncclRedOpCreatePreMulSum): the ranks push theirs beside their slices.
struct RsRouteInputs {
  RouteMode mode = RouteMode::kNccl;
  bool committed = false;      // every rank agreed on the route for this communicator
  const char* why_not = "";    // why not, when !committed
  bool every_scratch = false;  // every rank published a scratch (the agreed facts)
  int nranks = 0;
  int datatype = 0;  // ncclDataType_t
  RsReduce reduce = RsReduce::kSum;
  int scalar_datatype = 0;   // a pre-multiplied sum's, which NCCL requires to be the op's
  uint64_t total_bytes = 0;  // recvcount * typesize * nranks: the input
  bool bytes_valid = true;   // no overflow
  uint64_t min_bytes = 0;
  uint64_t auto_max_ranks = 0;  // auto routes up to this many ranks
  uint64_t slice = 0;           // rs_slice_bytes: 0 when the scratch holds no slice
};

RouteDecision choose_reduce_scatter_route(const RsRouteInputs& in);

// Bytes of one element of an NCCL datatype, 0 for an unknown one.
uint64_t nccl_type_size(int datatype);

}  // namespace zc
