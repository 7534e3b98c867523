// Reads zerocta's own counters in a rank process, through dlsym(RTLD_DEFAULT, ...) so the
// bench never links the shim: on the non-shim paths the symbols are simply absent. The counts
// are what lets a report tell zerocta's "ce" route from a silent fallback to NCCL.
#pragma once

#include <cstdint>

#include "zerocta.h"

namespace zcb {

struct ShimProbe {
  bool loaded = false;  // zerocta_version is visible in this process
  int version = 0;
};
ShimProbe probe_shim();

// Calls of one collective per route so far (all zero when the shim is not loaded).
struct RouteCounts {
  uint64_t calls[zerocta_route_count] = {};
};
RouteCounts shim_routes(zerocta_op_t op);
inline RouteCounts shim_allgather_routes() { return shim_routes(zerocta_op_allgather); }
RouteCounts operator-(const RouteCounts& a, const RouteCounts& b);

// The whole snapshot; false when the shim is absent or the call failed.
bool shim_stats(zerocta_stats_t* out);

}  // namespace zcb
