// Reading side of the counters in stats.h: snapshot, reset and the JSON file. Kept apart from
// stats.h because only the public C API (zerocta_api.cc) and tests need it; the collective
// wrappers only count.
#pragma once

#include <sys/types.h>

#include <string>

#include "config.h"
#include "zerocta.h"

namespace zc {

// Copies every counter (each one read atomically; a call in flight on another thread may be
// in calls but not yet in bytes).
void stats_snapshot(zerocta_stats_t* out);

// The phases of a routed op's host time (stats.h HostTimes), then the whole call.
constexpr int kHostPhases = 6;
constexpr const char* kHostPhaseNames[kHostPhases] = {"post",  "arrive", "pair_wait",
                                                      "reach", "issue",  "call"};
struct HostQuantiles {
  double p50 = 0, p90 = 0, p99 = 0;
};

// The route's own doings (stats.h), as counted so far.
struct RouteStats {
  uint64_t pairs_each_pushes = 0, pairs_later_does_both = 0;
  uint64_t peer_mappings = 0, peer_mapped_bytes = 0, peer_map_micros = 0;
  uint64_t peer_unmapped_bytes = 0;
  uint64_t staged_ops = 0;
  // Pushes into later ranks the push issuer made (push_issuer.h), and the time from the op's
  // call to each peer's claim, summed.
  uint64_t pushes_deferred = 0, deferred_claim_micros = 0;
  uint64_t captured_ops = 0;  // all-gathers captured into CUDA graphs on the route
  uint64_t local_group_ops = 0;  // ... issued with every rank at once by one thread
  // Host time of the routed ops (stats.h HostTimes), summed over host_ops ops.
  uint64_t host_ops = 0, host_post_micros = 0, host_arrive_micros = 0,
           host_pair_wait_micros = 0, host_reach_micros = 0, host_issue_micros = 0;
  // Their median, 90th and 99th percentile (to ~12 %, stats.cc), per phase and for the whole
  // call, in the order of kHostPhaseNames.
  HostQuantiles host_quantiles[kHostPhases];
  // NCCL's own calls of the collectives forwarded to it, in the same process: how many, and
  // the quantiles of their host time (stats_nccl_call_time).
  uint64_t nccl_calls = 0;
  HostQuantiles nccl_call;
  // Gauges, not counters (a reset keeps them): the peers' memory mapped here now, and the bound
  // on it per communicator.
  uint64_t peer_held_bytes = 0, peer_held_budget_bytes = 0;
};
RouteStats route_stats_snapshot();

// Zeroes every counter. pool_bytes is a gauge of memory held now, not a counter, so it stays.
void stats_reset();

// The snapshot as one JSON object (see zerocta_write_stats_json), newline-terminated; the
// route's doings under "route".
std::string stats_json(const zerocta_stats_t& stats, pid_t pid, const RouteStats& route = {});

// Writes stats_json(current snapshot, getpid()) to path: never follows a final symlink, creates
// with mode 0600, refuses (EPERM) anything but a regular file owned by the effective user.
// Returns 0 or an errno value.
int stats_write_json(const char* path);
// The same with a given snapshot.
int stats_write_json(const char* path, const zerocta_stats_t& stats);

// What the patterns of a ZEROCTA_STATS path stand for.
struct StatsPathFields {
  std::string host;  // %h: the host name up to its first '.'
  long pid = 0;      // %p
  std::string rank;  // %r
};

// Pure: the ZEROCTA_STATS path with %h, %p and %r replaced, so each rank of a job writes its
// own file ("%%" is a literal '%'; any other '%' is kept as is).
std::string stats_expand_path(const char* pattern, const StatsPathFields& fields);

// Pure: the rank for %r: the first of RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID that
// is set to a number (torchrun, Open MPI, MPICH/Intel MPI, Slurm), else the pid.
std::string stats_rank(const EnvLookup& getenv_fn, pid_t pid);

// The fields of this process (host name, getpid(), stats_rank(getenv)).
StatsPathFields stats_path_fields();

}  // namespace zc
