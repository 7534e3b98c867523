// Per-collective x per-route counters (calls, bytes), thread-safe and lock-free on the hot
// path; printed at exit with ZEROCTA_STATS=1 or written as JSON to the path it names.
#pragma once

#include <cstdint>

#include "zerocta.h"

namespace zc {

void stats_count(zerocta_op_t op, zerocta_route_t route, uint64_t bytes);
void stats_comm_created(bool zero_policy);
void stats_comm_ce_ready();
void stats_pool_bytes_add(int64_t delta);
void stats_inner_call();

// Installs the at-exit reporter and the fork handler once (called lazily at the first NCCL
// call, never from a constructor). Only the process that gathered the counters reports them:
// a forked child starts from zero and reports its own.
void stats_install_reporter();

}  // namespace zc
