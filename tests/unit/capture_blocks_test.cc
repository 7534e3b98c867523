// The flag blocks of captured ops (src/channel/capture_blocks.h): claimed by their owner, held by the
// peers that read the owner's post, claimed again only when every holder dropped them, and
// released for good (the high half) by an orphaning or an abort.
#include "capture_blocks.h"
#include "anon_region.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <set>

namespace zc {
namespace {

using Region = AnonRegion<CaptureBlocks>;

// A stream's wait on a word (kWaitSignal): satisfied by the signal or the release.
// (memcpy: the halves are written as 32-bit words, read here as one 64-bit word.)
bool wait_passes(const uint64_t* w) {
  uint64_t v;
  memcpy(&v, w, sizeof v);
  return (v & kCaptureWaitMask) != 0;
}
// A stream's 32-bit write: the low half only.
void stream_write(uint64_t* w, uint32_t v) { memcpy(w, &v, sizeof v); }

TEST(CaptureBlocks, ABlockIsClaimedAgainOnlyWhenEveryHolderDroppedIt) {
  Region r(2);
  CaptureBlocks b(r.base, 2);
  CaptureRef a;
  ASSERT_TRUE(b.claim(0, &a));
  EXPECT_TRUE(b.hold(0, a));  // rank 1 read rank 0's post
  EXPECT_EQ(b.refs(0, a), 2u);
  EXPECT_EQ(b.drop(0, a), 1u);  // rank 0's graph went
  CaptureRef next;
  ASSERT_TRUE(b.claim(0, &next));
  EXPECT_NE(next.index, a.index) << "still held by rank 1";
  EXPECT_EQ(b.drop(0, a), 0u);
  EXPECT_FALSE(b.hold(0, a)) << "gone: a late reader must not revive it";
  CaptureRef again;
  ASSERT_TRUE(b.claim(0, &again));
  EXPECT_EQ(again.index, a.index);
  EXPECT_NE(again.gen, a.gen);
  EXPECT_FALSE(b.hold(0, a)) << "the old generation is not the new one";
  EXPECT_EQ(b.drop(0, a), 0u) << "dropping an old generation changes nothing";
  EXPECT_EQ(b.refs(0, again), 1u);
}

TEST(CaptureBlocks, EveryBlockHeldMeansNoClaim) {
  Region r(2);
  CaptureBlocks b(r.base, 2);
  std::set<uint32_t> seen;
  CaptureRef ref;
  for (uint32_t i = 0; i < CaptureBlocks::blocks_per_rank(2); ++i) {
    ASSERT_TRUE(b.claim(1, &ref));
    seen.insert(ref.index);
  }
  EXPECT_EQ(seen.size(), CaptureBlocks::blocks_per_rank(2));
  EXPECT_FALSE(b.claim(1, &ref));
  EXPECT_TRUE(b.claim(0, &ref)) << "another rank's blocks are its own";
}

TEST(CaptureBlocks, SignalsAreResetButReleasesStay) {
  Region r(2);
  CaptureBlocks b(r.base, 2);
  CaptureRef a;
  ASSERT_TRUE(b.claim(0, &a));
  uint64_t* done = b.done_from(0, a, 1);
  EXPECT_FALSE(wait_passes(done));
  stream_write(done, 1);
  EXPECT_TRUE(wait_passes(done));
  EXPECT_TRUE(CaptureBlocks::signalled(done));
  stream_write(done, 0);  // the waiter's reset
  EXPECT_FALSE(wait_passes(done));
  CaptureBlocks::release(done);
  EXPECT_TRUE(wait_passes(done));
  stream_write(done, 0);  // a reset of a later replay keeps it released
  EXPECT_TRUE(wait_passes(done));
  EXPECT_FALSE(CaptureBlocks::signalled(done));
}

TEST(CaptureBlocks, WordsOfBlocksAndRanksDoNotOverlap) {
  const uint32_t n = 3;
  Region r(n);
  CaptureBlocks b(r.base, n);
  std::set<const uint64_t*> words;
  size_t expected = 0;
  for (uint32_t owner = 0; owner < n; ++owner)
    for (int k = 0; k < 2; ++k) {
      CaptureRef ref;
      ASSERT_TRUE(b.claim(owner, &ref));
      words.insert(b.started(owner, ref));
      ++expected;
      for (uint32_t p = 0; p < n; ++p) {
        words.insert(b.ready_push(owner, ref, p));
        words.insert(b.ready_pull(owner, ref, p));
        words.insert(b.done_from(owner, ref, p));
        expected += 3;
      }
    }
  EXPECT_EQ(words.size(), expected);
  for (const uint64_t* w : words) {
    EXPECT_GE(reinterpret_cast<const char*>(w), static_cast<const char*>(r.base));
    EXPECT_LE(reinterpret_cast<const char*>(w + 1), static_cast<const char*>(r.base) + r.bytes);
  }
}

TEST(CaptureBlocks, OrphaningReleasesEveryWordAndMovesTheEpoch) {
  Region r(2);
  CaptureBlocks b(r.base, 2);
  CaptureRef a;
  ASSERT_TRUE(b.claim(0, &a));
  ASSERT_TRUE(b.hold(0, a));
  const uint64_t before = b.orphan_epoch();
  b.orphan(0, a);
  EXPECT_TRUE(b.orphaned(0, a));
  EXPECT_GT(b.orphan_epoch(), before);
  EXPECT_TRUE(wait_passes(b.ready_push(0, a, 1)));
  EXPECT_TRUE(wait_passes(b.ready_pull(0, a, 1)));
  EXPECT_TRUE(wait_passes(b.done_from(0, a, 1)));
  b.drop(0, a);
  b.drop(0, a);
  CaptureRef again;
  ASSERT_TRUE(b.claim(0, &again));
  EXPECT_FALSE(b.orphaned(0, again)) << "a new generation starts clean";
  EXPECT_FALSE(wait_passes(b.done_from(0, again, 1)));
}

TEST(CaptureBlocks, ReleaseAllFreesEveryWait) {
  Region r(4);
  CaptureBlocks b(r.base, 4);
  CaptureRef a, c;
  ASSERT_TRUE(b.claim(2, &a));
  ASSERT_TRUE(b.claim(3, &c));
  b.release_all();
  EXPECT_TRUE(wait_passes(b.done_from(2, a, 0)));
  EXPECT_TRUE(wait_passes(b.ready_pull(3, c, 1)));
}

}  // namespace
}  // namespace zc
