// The identity of one communicator instance, alike on every rank that creates it, as a keyed
// hash. It names the instance's out-of-band channel (channel.h), so it must be
//   - equal on every rank: built only from what every rank passes to NCCL (the unique ids) or
//     counts the same way (how often this process used that id; how often a parent was split);
//   - unique per instance: NCCL_COMM_ID gives every communicator of a job the same unique id,
//     so how often this process made a communicator of that id *as that rank* tells them apart
//     (each rank creates its communicators in the same order, as NCCL requires; a process may
//     hold several ranks of one communicator, e.g. one thread creating one per GPU);
//   - opaque: a unique id holds the bootstrap root's address, so only its hash is ever shown;
//   - private: every name is keyed by a secret hashed from the root's unique-id bytes, which
//     NCCL's users hand only to the job's ranks. A child's name is not a function of its
//     parent's (public) name alone, so no other user can compute it and take it first.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

namespace zc {

// A 128-bit SipHash key.
struct SipKey {
  uint64_t k0 = 0, k1 = 0;
};

struct CommKey {
  uint64_t lo = 0, hi = 0;  // public: the channel's name
  // The job's secret, hashed from the root's unique-id bytes and inherited by every child: the
  // key of the names. Held in memory by the ranks only, never printed nor written to a channel.
  SipKey secret;
  CommKey() = default;
  CommKey(uint64_t lo_, uint64_t hi_) : lo(lo_), hi(hi_) {}
  bool valid() const { return lo != 0 || hi != 0; }
  // Equal names (within a job, the secret is the same for all).
  bool operator==(const CommKey& o) const { return lo == o.lo && hi == o.hi; }
  std::string hex() const;  // 32 hex digits
};

// SipHash-2-4 with a 128-bit key (pure; the test vectors of the SipHash paper hold).
uint64_t siphash24(const void* data, size_t n, uint64_t k0, uint64_t k1);

// The key of a communicator made by ncclCommInitRank* from `ids` (one, or InitRankScalable's
// list): the ids' hash plus how many communicators this process made from the same ids as
// `rank` before. Not pure: it counts.
CommKey key_for_init(const ncclUniqueId* ids, int nids, int rank);

// Pure: the key of a child of `parent` (keyed by its secret). `ordinal` is the parent's count of
// Split calls (NOCOLOR ones included) or of Shrink calls before this one, each counted alike on
// every rank that makes them; a split names its color, a shrink its sorted exclude list.
CommKey key_for_split(const CommKey& parent, uint64_t ordinal, int color);
CommKey key_for_shrink(const CommKey& parent, uint64_t ordinal, std::vector<int> excluded);

// Clears the per-process id counts (a forked child inherits the parent's counts, which the
// parent's peers know nothing of; tests also reset them).
void reset_key_counts();

}  // namespace zc
