// Setting up (and tearing down) a communicator's copy-engine pool. Everything that could turn
// out differently per rank is agreed before anyone relies on it:
//   1. facts all-gather: host, NCCL version, config fingerprint, device UUID, the NCCL settings
//      window registration depends on. Every rank sees the same array and so reaches the same
//      verdict;
//   2. local checks (P2P to every peer's device, ncclMemAlloc of the arena), agreed by a MIN
//      all-reduce;
//   3. collective window registration, then peer pointers resolved and verified by reading a
//      marker every peer wrote into its own arena; agreed by a second MIN all-reduce.
// Any "no" leaves every rank on the pass-through route with one WARN naming the reason.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm_state.h"

namespace zc {

struct RankFacts {
  uint64_t magic;
  uint64_t host_hash;
  uint64_t fingerprint;
  uint64_t pool_bytes;
  int32_t nccl_version;
  int32_t rank;
  unsigned char uuid[16];
  uint64_t nccl_env_hash;  // the NCCL_* settings the pool's window depends on (ce_setup.cc)
};
static_assert(sizeof(RankFacts) == 64, "RankFacts is exchanged as 64 raw bytes");

// Pure: nullptr when every rank's facts allow the copy-engine route, else the reason.
// `staged`: the pool is for the nccl-staged route (the same on every rank whose fingerprint
// matches), which needs NCCL 2.28.9 or later.
const char* facts_disagreement(const RankFacts* all, int nranks, bool staged = false);

// The oldest NCCL the nccl-staged route runs on: with 2.28.3, NCCL's own copy-engine
// all-gather inside the pool of a split non-blocking communicator (ranks in reverse order)
// hung in tests/gpu/gpu_nonblocking_test.cc; 2.28.9 passed the same test.
constexpr int kStagedMinNcclVersion = 22809;

// Sets up the pools of communicators created together by one thread (one comm, or every
// comm of an ncclCommInitAll / a grouped init). Blocking; never call it inside a group or
// during graph capture. Each state must have rank, nranks and device filled in.
void ce_setup(const std::vector<std::shared_ptr<CommState>>& comms);

// Releases every device-side wait of ours on this comm (abort/revoke), without locks that a
// thread blocked in NCCL could hold.
void ce_release_waits(CommState& st);

// Frees the pool: deregisters the window (unless the comm is being aborted, where NCCL
// tears windows down itself) and frees the arena, streams and events.
void ce_teardown(CommState& st, bool aborting);

}  // namespace zc
