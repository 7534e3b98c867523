// The one routing predicate for all-gathers. Pure: its inputs are either agreed by every rank
// (the copy-engine pool, the config fingerprint) or properties of the op that NCCL requires
// to be identical on every rank (count, datatype). The only local input, `app_windows`,
// mirrors a collective fact: window registration is collective, so an SPMD application
// that registered its buffers did so on every rank.
#pragma once

#include <cstdint>

#include "config.h"

namespace zc {

enum class AgRoute { kPassthrough, kCe, kNcclCe, kNcclStaged };

struct RouteInputs {
  AllGatherMode mode = AllGatherMode::kAuto;
  bool ce_ready = false;        // the comm's pool was agreed by every rank
  const char* ce_missing = "";  // why not, when !ce_ready
  uint64_t total_bytes = 0;     // sendcount * typesize * nranks
  bool bytes_valid = true;      // datatype known and no overflow
  uint64_t min_bytes = 0;
  uint64_t nranks = 0;          // the communicator's size
  uint64_t auto_max_ranks = 0;  // auto routes only communicators up to this size (0 = any)
  bool app_windows = false;     // both buffers lie in windows the application registered
};

struct RouteDecision {
  AgRoute route;
  const char* why;  // a static string, for logs
};

RouteDecision choose_allgather_route(const RouteInputs& in);

// Bytes of one element of an NCCL datatype, 0 for an unknown one.
uint64_t nccl_type_size(int datatype);

}  // namespace zc
