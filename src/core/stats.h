// Per-collective x per-route counters (calls, bytes), thread-safe and lock-free on the hot
// path; printed at exit with ZEROCTA_STATS=1 or written as JSON to the path it names.
#pragma once

#include <chrono>

#include <cstdint>

#include "zerocta.h"

namespace zc {

void stats_count(zerocta_op_t op, zerocta_route_t route, uint64_t bytes);
void stats_comm_created(bool zero_policy);
void stats_comm_ce_ready();
void stats_pool_bytes_add(int64_t delta);
void stats_inner_call();
// The route's own doings, beside the per-op counters (JSON "route", one line at exit): how
// each pair of ranks moved its chunks (counted by the later rank of the pair), and what
// mapping peers' buffers cost — the first op on a new buffer pays it, later ones reuse it.
void stats_pair_settled(bool each_pushes);
void stats_peer_mapped(uint64_t mappings, uint64_t bytes, uint64_t micros);
void stats_peer_unmapped(uint64_t bytes);
// The peers' memory this process maps now (a gauge, like pool_bytes, which includes it), reported
// beside its bound per communicator (peer_memory.h kPeerHeldBudget).
void stats_peer_held_add(int64_t delta);
void stats_peer_held_budget(uint64_t bytes);
// An op in which this rank's buffers were reached through its stage (stage_buffer.h).
void stats_op_staged();
// A push the push issuer made for a later rank that claimed `claim_waited_us` after the call
// handed it over.
void stats_push_deferred(int64_t claim_waited_us);
void stats_op_captured();  // an all-gather captured into a CUDA graph on the route
// An all-gather issued with every other rank of its communicator by one thread, in one group
// (local_group_allgather.h).
void stats_op_local_group();
// Where one routed op's time on the application's thread went, in microseconds: describing and
// posting its buffers, arriving (waiting for room in the op ring), waiting for a later peer to
// claim "each pushes", reaching the peers' buffers (imports and mappings; the first op on a
// buffer pays them), and building and issuing the plan.
struct HostTimes {
  int64_t post = 0, arrive = 0, pair_wait = 0, reach = 0, issue = 0;
};
void stats_op_host_times(const HostTimes& t);
// The host time of NCCL's own call for a collective the wrappers forward to it, in
// microseconds: what the route's host time per op is compared with, in the same job.
void stats_nccl_call_time(int64_t us);
// Runs `call` (NCCL's own function for a forwarded collective) and counts its host time.
template <typename Call>
auto timed_nccl_call(Call&& call) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = call();
  stats_nccl_call_time(std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - t0)
                           .count());
  return r;
}

// Installs the at-exit reporter and the fork handler once (called lazily at the first NCCL
// call, never from a constructor). Only the process that gathered the counters reports them:
// a forked child starts from zero and reports its own.
void stats_install_reporter();

// With ZEROCTA_STATS=PATH, writes the counters to PATH now (the at-exit report writes them
// again). Called at every ncclCommFinalize and ncclCommDestroy, so that a rank that never runs
// its exit handlers (torchrun's SIGTERM, os._exit) still leaves its counters as of its last
// communicator teardown. Cheap and idempotent: nothing is written when the counters did not
// change since the last write to the same path; thread-safe; warns at most once per process
// when the file cannot be written. Does nothing with ZEROCTA_STATS unset, 0 or 1 (stderr is
// printed at exit only), before stats_install_reporter(), or in a child that did not fork.
void stats_write_now();

}  // namespace zc
