// PairWait (pair_wait.h): how long the earlier rank of a pair waits for the later one.
#include "pair_wait.h"

#include <gtest/gtest.h>

namespace zc {
namespace {

constexpr uint64_t kChunk = 64ull << 20;  // soft wait 300 + 167 us

TEST(PairWait, SoftWaitGrowsWithTheChunk) {
  EXPECT_EQ(PairWait::soft_us(0), 300);
  EXPECT_EQ(PairWait::soft_us(kChunk), 300 + 167);
  EXPECT_GT(PairWait::soft_us(1ull << 30), PairWait::soft_us(kChunk));
}

TEST(PairWait, DrainedStreamStopsAtTheSoftWait) {
  int queries = 0;
  PairWait w(1000, kChunk, 1, false, [&] {
    ++queries;
    return true;
  });
  const int64_t soft = PairWait::soft_us(kChunk);
  EXPECT_TRUE(w.more(1000));
  EXPECT_TRUE(w.more(1000 + soft - 1));
  EXPECT_EQ(queries, 0) << "the stream is asked only once the soft wait is over";
  EXPECT_FALSE(w.more(1000 + soft));
  EXPECT_FALSE(w.more(1000 + soft + 1));
  EXPECT_EQ(queries, 1) << "a drained stream is not asked again";
}

TEST(PairWait, BusyStreamKeepsWaitingUntilTheCap) {
  int queries = 0;
  PairWait w(0, kChunk, 1, false, [&] {
    ++queries;
    return false;
  });
  const int64_t soft = PairWait::soft_us(kChunk);
  const int64_t cap = PairWait::cap_us(kChunk, 1);
  EXPECT_EQ(cap, PairWait::kCapFactor * soft) << "two ranks: one chunk";
  for (int64_t t = soft; t < cap; t += 10) ASSERT_TRUE(w.more(t)) << t;
  EXPECT_FALSE(w.more(cap));
  // Asked at most once per kQueryEveryUs over (soft, cap).
  EXPECT_LE(queries, (cap - soft) / PairWait::kQueryEveryUs + 1);
  EXPECT_GE(queries, (cap - soft) / PairWait::kQueryEveryUs - 1);
}

TEST(PairWait, BusyStreamsCapCoversTheChunkToEveryPeer) {
  // 4 ranks: the op moves 3 chunks, and a later rank's host may be held that long.
  PairWait w(0, kChunk, 3, false, [] { return false; });
  const int64_t cap = PairWait::cap_us(kChunk, 3);
  EXPECT_EQ(cap, PairWait::kCapFactor * PairWait::soft_us(3 * kChunk));
  EXPECT_GT(cap, PairWait::cap_us(kChunk, 1));
  EXPECT_TRUE(w.more(PairWait::cap_us(kChunk, 1)));
  EXPECT_TRUE(w.more(cap - 1));
  EXPECT_FALSE(w.more(cap));
}

TEST(PairWait, DrainedStreamStopsAtTheSoftWaitOfOneChunkWhateverThePeers) {
  // What the fall back adds on the device is one chunk's transfer, however many peers.
  PairWait w(0, kChunk, 7, false, [] { return true; });
  EXPECT_TRUE(w.more(PairWait::soft_us(kChunk) - 1));
  EXPECT_FALSE(w.more(PairWait::soft_us(kChunk)));
}

TEST(PairWait, StreamThatDrainsMidWaitStopsAtTheNextQuery) {
  bool busy = true;
  PairWait w(0, kChunk, 1, false, [&] { return !busy; });
  const int64_t soft = PairWait::soft_us(kChunk);
  EXPECT_TRUE(w.more(soft));
  busy = false;
  EXPECT_TRUE(w.more(soft + PairWait::kQueryEveryUs - 1)) << "not asked again yet";
  EXPECT_FALSE(w.more(soft + PairWait::kQueryEveryUs));
}

TEST(PairWait, CapturedOpWaitsUntilTheCapWithoutAsking) {
  PairWait w(0, kChunk, 1, true, [] {
    ADD_FAILURE() << "a capturing stream must not be queried";
    return true;
  });
  const int64_t cap = PairWait::kCapFactor * PairWait::soft_us(kChunk);
  EXPECT_TRUE(w.more(PairWait::soft_us(kChunk)));
  EXPECT_TRUE(w.more(cap - 1));
  EXPECT_FALSE(w.more(cap));
}

}  // namespace
}  // namespace zc
