#include "capture_blocks.h"

#include <algorithm>
#include <cstring>

namespace zc {
namespace {

// The region: an epoch word (its own cache line), then [nranks][per_rank] blocks of
//   state      (generation << 32) | orphan bit << 16 | references
//   started, then kSets sets of nranks words (64-bit): an all-gather's ready_push, ready_pull
//   and done_from; a reduce-scatter's tokens, a set per (which, buffer).
constexpr size_t kHeader = 64;
constexpr uint64_t kOrphanBit = uint64_t{1} << 16;
constexpr uint64_t kRefsMask = kOrphanBit - 1;
// Up to 1024 captured ops alive per rank and communicator, within 4 MiB of pinned memory for
// the whole communicator at any size (at 64 ranks: 31 each).
constexpr uint32_t kMaxBlocks = 1024;
constexpr size_t kBudget = size_t{4} << 20;
// A word's low half is its first four bytes: the signal a 32-bit stream write sets.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "words are split into halves by address");

constexpr uint32_t kSets = 2 * CaptureBlocks::kTokenBuffers;  // the reduce-scatter's need most
constexpr uint32_t kReadyPush = 0, kReadyPull = 1, kDoneFrom = 2;
// The words a block's release covers: started and every set.
size_t words_of_block(uint32_t nranks) { return 1 + kSets * size_t{nranks}; }
size_t bytes_of_block(uint32_t nranks) { return (8 * (1 + words_of_block(nranks)) + 63) / 64 * 64; }

uint32_t gen_of(uint64_t s) { return static_cast<uint32_t>(s >> 32); }

}  // namespace

uint32_t CaptureBlocks::blocks_per_rank(uint32_t nranks) {
  const size_t fit = kBudget / (size_t{nranks} * bytes_of_block(nranks));
  return static_cast<uint32_t>(std::min<size_t>(kMaxBlocks, std::max<size_t>(fit, 1)));
}

size_t CaptureBlocks::region_bytes(uint32_t nranks) {
  // The largest of any smaller communicator too: a channel sized for a parent's room holds
  // the blocks of whichever child commits in it.
  size_t most = 0;
  for (uint32_t n = 1; n <= nranks; ++n)
    most = std::max(most, kHeader + size_t{n} * blocks_per_rank(n) * bytes_of_block(n));
  return most;
}

CaptureBlocks::CaptureBlocks(void* base, uint32_t nranks)
    : base_(static_cast<char*>(base)), nranks_(nranks), per_rank_(blocks_per_rank(nranks)) {}

size_t CaptureBlocks::block_bytes() const { return bytes_of_block(nranks_); }

std::atomic<uint64_t>* CaptureBlocks::state(uint32_t owner, uint32_t index) const {
  return reinterpret_cast<std::atomic<uint64_t>*>(
      base_ + kHeader + (size_t{owner} * per_rank_ + index) * block_bytes());
}

uint64_t* CaptureBlocks::words(uint32_t owner, uint32_t index) const {
  return reinterpret_cast<uint64_t*>(state(owner, index)) + 1;
}

bool CaptureBlocks::claim(uint32_t owner, CaptureRef* out) {
  for (uint32_t i = 0; i < per_rank_; ++i) {
    std::atomic<uint64_t>* s = state(owner, i);
    uint64_t v = s->load(std::memory_order_acquire);
    if ((v & kRefsMask) != 0) continue;
    const uint32_t gen = gen_of(v) + 1;
    if (!s->compare_exchange_strong(v, uint64_t{gen} << 32 | 1, std::memory_order_acq_rel))
      continue;
    // Nobody refers to this generation before the owner posts it (a release store: the
    // zeroes are seen by whoever reads the post).
    memset(words(owner, i), 0, block_bytes() - sizeof(uint64_t));
    *out = CaptureRef{i, gen};
    return true;
  }
  return false;
}

bool CaptureBlocks::hold(uint32_t owner, CaptureRef ref) {
  if (ref.index >= per_rank_) return false;
  std::atomic<uint64_t>* s = state(owner, ref.index);
  uint64_t v = s->load(std::memory_order_acquire);
  while (gen_of(v) == ref.gen && (v & kRefsMask) != 0)
    if (s->compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) return true;
  return false;
}

uint32_t CaptureBlocks::drop(uint32_t owner, CaptureRef ref) {
  if (ref.index >= per_rank_) return 0;
  std::atomic<uint64_t>* s = state(owner, ref.index);
  uint64_t v = s->load(std::memory_order_acquire);
  while (gen_of(v) == ref.gen && (v & kRefsMask) != 0)
    if (s->compare_exchange_weak(v, v - 1, std::memory_order_acq_rel))
      return static_cast<uint32_t>((v & kRefsMask) - 1);
  return 0;
}

uint32_t CaptureBlocks::refs(uint32_t owner, CaptureRef ref) const {
  if (ref.index >= per_rank_) return 0;
  const uint64_t v = state(owner, ref.index)->load(std::memory_order_acquire);
  return gen_of(v) == ref.gen ? static_cast<uint32_t>(v & kRefsMask) : 0;
}

void CaptureBlocks::orphan(uint32_t owner, CaptureRef ref) {
  if (ref.index >= per_rank_) return;
  uint64_t* w = words(owner, ref.index);
  for (size_t i = 0; i < words_of_block(nranks_); ++i) release(w + i);
  std::atomic<uint64_t>* s = state(owner, ref.index);
  uint64_t v = s->load(std::memory_order_acquire);
  while (gen_of(v) == ref.gen && !(v & kOrphanBit))
    if (s->compare_exchange_weak(v, v | kOrphanBit, std::memory_order_acq_rel)) break;
  reinterpret_cast<std::atomic<uint64_t>*>(base_)->fetch_add(1, std::memory_order_acq_rel);
}

bool CaptureBlocks::orphaned(uint32_t owner, CaptureRef ref) const {
  if (ref.index >= per_rank_) return false;
  const uint64_t v = state(owner, ref.index)->load(std::memory_order_acquire);
  // A block claimed again since was dropped by everyone, this rank included: not its concern.
  return gen_of(v) == ref.gen && (v & kOrphanBit);
}

uint64_t CaptureBlocks::orphan_epoch() const {
  return reinterpret_cast<const std::atomic<uint64_t>*>(base_)->load(std::memory_order_acquire);
}

uint64_t* CaptureBlocks::started(uint32_t owner, CaptureRef ref) { return words(owner, ref.index); }
uint64_t* CaptureBlocks::word(uint32_t owner, CaptureRef ref, uint32_t set, uint32_t peer) const {
  return words(owner, ref.index) + 1 + size_t{set} * nranks_ + peer;
}
uint64_t* CaptureBlocks::ready_push(uint32_t owner, CaptureRef ref, uint32_t peer) {
  return word(owner, ref, kReadyPush, peer);
}
uint64_t* CaptureBlocks::ready_pull(uint32_t owner, CaptureRef ref, uint32_t peer) {
  return word(owner, ref, kReadyPull, peer);
}
uint64_t* CaptureBlocks::done_from(uint32_t owner, CaptureRef ref, uint32_t peer) {
  return word(owner, ref, kDoneFrom, peer);
}
uint64_t* CaptureBlocks::rs_token(uint32_t owner, CaptureRef ref, uint32_t peer, TokenOf which,
                                  int b) {
  return word(owner, ref, static_cast<uint32_t>(which) * kTokenBuffers + static_cast<uint32_t>(b),
              peer);
}

void CaptureBlocks::release(uint64_t* word) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(word) + 1, 1u, __ATOMIC_RELEASE);
}

void CaptureBlocks::release_all() {
  for (uint32_t r = 0; r < nranks_; ++r)
    for (uint32_t i = 0; i < per_rank_; ++i) {
      uint64_t* w = words(r, i);
      for (size_t k = 0; k < words_of_block(nranks_); ++k) release(w + k);
    }
}

bool CaptureBlocks::signalled(const uint64_t* word) {
  return __atomic_load_n(reinterpret_cast<const uint32_t*>(word), __ATOMIC_ACQUIRE) != 0;
}

}  // namespace zc
