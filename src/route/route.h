// The one routing predicate for all-gathers. Pure, and every input is alike on every rank:
// whether the communicator's route was committed (agreed by every rank, route_setup.h), the
// settings (in the agreed fingerprint), and the op's count and datatype, which NCCL requires
// to be equal on every rank. Nothing local — addresses, in-place-ness, memory type, capture
// state — may enter here: a rank-divergent route is a hang.
#pragma once

#include <cstdint>

#include "config.h"

namespace zc {

enum class AgRoute { kPassthrough, kCe };

struct RouteInputs {
  AllGatherMode mode = AllGatherMode::kAuto;
  bool committed = false;    // every rank agreed on the route for this communicator
  const char* why_not = "";  // why not, when !committed
  uint64_t total_bytes = 0;  // sendcount * typesize * nranks
  bool bytes_valid = true;   // datatype known and no overflow
  uint64_t min_bytes = 0;
};

struct RouteDecision {
  AgRoute route;
  const char* why;  // a static string, for logs
};

RouteDecision choose_allgather_route(const RouteInputs& in);

// Bytes of one element of an NCCL datatype, 0 for an unknown one.
uint64_t nccl_type_size(int datatype);

}  // namespace zc
