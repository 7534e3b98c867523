// The flags of all-gathers captured into CUDA graphs (captured_ops.h), in the communicator's
// channel segment after the per-op exchange (op_exchange.h): host memory every member maps and
// registered with CUDA, so that streams wait on and write them and any process can release
// them with plain stores.
//
// An eager op's flags are counters in a ring (op_exchange.h): each op writes its own number, and
// waits are "greater or equal". A graph replays the values it captured, so a captured op cannot
// count: it gets a block of its own, and each flag is consumed and reset — the one rank that
// waits on it resets it to 0 right after its wait, before anything that lets the writer write
// it again. Replays of two ranks' graphs thus pair in launch order, replay k with replay k.
//
// Glossary
//   block    one captured op's flags on one rank (its "owner"), claimed by the owner at capture
//            and named in its post by (index, generation). The peers of that op hold references
//            to it; it is claimed again only when every reference was dropped (every graph
//            holding the op was destroyed), with the next generation.
//   word     64 bits: the low half is the signal (a stream writes 1, the waiter resets it to 0;
//            32-bit writes leave the high half alone), the high half is the release (set by
//            the host on abort, poison or orphaning, never cleared while the block lives). A
//            stream waits until (word & (release | signal)) != 0, so a released wait stays
//            released for every later replay too.
//   started  written 1 by the owner's stream at the start of every replay (never reset): the
//            op was replayed at least once.
//   ready    ready_push[p] / ready_pull[p]: the owner's buffers are ready for peer p's push
//            stream / pull stream (two words: a flag has exactly one consumer).
//   done     done_from[p]: peer p has finished with the owner's buffers.
//   token    a captured reduce-scatter's (reduce_scatter_plan.h) instead of ready and done:
//            rs_token(owner, ref, p, which, b), buffer b of the owner's scratch or of peer p's,
//            in the block of whichever of the two arrived first (the later one reads its
//            post; the earlier one never waits to learn of the later one's block). Two
//            writers take turns on it (free, landed), each after waiting for the other's state.
//   orphan   a block whose owner destroyed the graph holding it before ever replaying it, while
//            a peer still holds it: that peer's replays can never pair. Every wait on it is
//            released and the peer's host, seeing its own replay started, poisons the
//            communicator (captured_ops.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace zc {

// A block as a post names it (the owner is the posting rank).
struct CaptureRef {
  static constexpr uint32_t kNone = ~0u;
  uint32_t index = kNone;
  uint32_t gen = 0;
  bool valid() const { return index != kNone; }
};

// A stream's wait on a word: satisfied by the signal or the release.
constexpr uint64_t kCaptureWaitMask = (uint64_t{1} << 32) | 1;

class CaptureBlocks {
 public:
  // Bytes the blocks of `nranks` ranks need (a multiple of 64).
  static size_t region_bytes(uint32_t nranks);
  // Captured ops one rank can hold at once on a communicator of `nranks` ranks.
  static uint32_t blocks_per_rank(uint32_t nranks);
  // Over a zero-filled region of region_bytes(nranks) bytes at `base`.
  CaptureBlocks(void* base, uint32_t nranks);

  // A fresh block of `owner` (words zeroed, one reference: the owner's); false when every block
  // is held.
  bool claim(uint32_t owner, CaptureRef* out);
  // One more reference to `owner`'s block `ref`; false when the block is no longer that one
  // (its owner already dropped it: the owner's graph is gone).
  bool hold(uint32_t owner, CaptureRef ref);
  // Drops one reference; returns the references left.
  uint32_t drop(uint32_t owner, CaptureRef ref);
  uint32_t refs(uint32_t owner, CaptureRef ref) const;
  // Marks the block orphaned and releases every word in it.
  void orphan(uint32_t owner, CaptureRef ref);
  bool orphaned(uint32_t owner, CaptureRef ref) const;
  // Bumped by every orphan(): hosts look for orphans only when it moved.
  uint64_t orphan_epoch() const;

  uint64_t* started(uint32_t owner, CaptureRef ref);
  uint64_t* ready_push(uint32_t owner, CaptureRef ref, uint32_t peer);
  uint64_t* ready_pull(uint32_t owner, CaptureRef ref, uint32_t peer);
  uint64_t* done_from(uint32_t owner, CaptureRef ref, uint32_t peer);
  // A reduce-scatter's pair (owner, peer), the owner the earlier to arrive: the token of buffer
  // b of the owner's scratch (kOwnersBuffer: the peer pushes into it) or of the peer's.
  enum class TokenOf : uint8_t { kOwnersBuffer = 0, kPeersBuffer = 1 };
  static constexpr int kTokenBuffers = 2;
  // A word's release (its high half's lowest bit): a stream waits for (word & (bit | state)).
  static constexpr uint64_t kReleaseBit = uint64_t{1} << 32;
  uint64_t* rs_token(uint32_t owner, CaptureRef ref, uint32_t peer, TokenOf which, int b);

  // Sets the release half of a word / of every word of every block (abort, poison).
  static void release(uint64_t* word);
  void release_all();
  // Whether a word's signal half is set (the host reading what a stream wrote).
  static bool signalled(const uint64_t* word);

 private:
  std::atomic<uint64_t>* state(uint32_t owner, uint32_t index) const;
  uint64_t* words(uint32_t owner, uint32_t index) const;
  // The word of set `set` (below started) for `peer`.
  uint64_t* word(uint32_t owner, CaptureRef ref, uint32_t set, uint32_t peer) const;
  size_t block_bytes() const;
  char* base_;
  uint32_t nranks_;
  uint32_t per_rank_;
};

}  // namespace zc
