// The zero-copy all-gather of every rank of a communicator at once, when one thread issues all
// of them in one group (nccl-tests -g N, ncclCommInitAll programs: a group over every local
// GPU). That thread holds every rank's buffers, so no exchange is needed to learn them: each
// rank's part is a direct plan (direct_plan.h) in which every pair "each pushes" — every rank
// writes its own chunk into every peer's receive buffer (every GPU's copy engines at work) and
// out of place also copies it into its own. The ranks hand over through the ring flags of the
// communicator's op region in host memory (op_exchange.h: ready, done), as ranks in separate
// processes do.
//
// Flags rather than events between the GPUs, though an event round trip between two GPUs is
// the shorter one alone (8.4 against 13.3 us, tests/gpu/probes/flag_latency_probe.cu): within
// an op the flags' plan is ahead. Measured on 2 H200s, one process, in place, 50 ops back to
// back (tests/gpu/probes/local_group_probe.cu, two runs): 97.1-97.4 us an op at 64 MiB
// against 102.5-102.9 with every push stream waiting for every rank's start event and every
// user stream for every push stream's end; 356.4-357.9 against 359.0-359.3 at 256 MiB (the
// unsynchronized pushes: 89.8 and 346.3).
//
// Pure (addresses are integers), like direct_plan.h.
#pragma once

#include <cstdint>

#include "direct_plan.h"

namespace zc {

struct LocalGroupRank {
  uint64_t send = 0, recv = 0;  // its buffers, as its own GPU addresses them
  // Where the other GPUs write into recv: recv itself, or a second mapping of it open to them
  // (local_aliases.h) where its owner did not grant them access. 0: recv.
  uint64_t recv_for_peers = 0;
};

struct LocalGroupView {
  int nranks = 0;
  uint64_t chunk = 0;  // bytes per rank
  LocalGroupRank ranks[kMaxRanks];
};

// Rank `me`'s view of the set's op, but for its number and flags (the caller's: the ring's,
// as for any eager op). Every field it sets is overwritten; the rest is left alone.
void local_group_rank_view(const LocalGroupView& g, int me, DirectOpView* v);

}  // namespace zc
