// The per-op exchange (src/channel/op_exchange.h) on plain memory: who arrived before whom, the
// verdict the first rank takes for all, the mode tag and signature checks, the ring, the pairs'
// compare-and-swap, from several threads at once, and a failure's release of every flag wait.
#include "op_exchange.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "anon_region.h"
#include "reduce_scatter_plan.h"

namespace zc {
namespace {

using Region = AnonRegion<OpExchange>;

OpPost post(uint64_t seq, bool reachable = true, uint64_t count = 100,
            OpMode mode = OpMode::kEager) {
  OpPost p;
  p.seq = seq;
  p.mode = mode;
  p.count = count;
  p.datatype = 7;
  p.reach = reachable ? uint32_t{kReachPointer} : 0u;
  p.send.addr = 0x1000 * seq;
  return p;
}

auto never = [](uint32_t) { return false; };

// Rank `me`'s view of a reduce-scatter whose slices start at `first`, its flags at their host
// addresses in `x`. Only the plan's flag waits are read: the buffers are never touched.
RsOpView rs_view(OpExchange& x, uint32_t me, uint64_t first, uint64_t chunk, uint64_t slice) {
  RsOpView v;
  v.rank = static_cast<int>(me);
  v.nranks = static_cast<int>(x.nranks());
  v.first_slice = first;
  v.chunk = chunk;
  v.slice = slice;
  for (uint32_t p = 0; p < x.nranks(); ++p) {
    v.landed_in[p] = reinterpret_cast<uint64_t>(x.landed_flag(me, p));
    v.landed_out[p] = reinterpret_cast<uint64_t>(x.landed_flag(p, me));
    v.freed[p] = reinterpret_cast<uint64_t>(x.freed_flag(p));
  }
  return v;
}

// Whether a stream's wait on a flag would pass now: the flag, as a wrapping counter, >= value.
bool wait_passes(const RsOp& w) {
  const uint32_t flag = __atomic_load_n(reinterpret_cast<uint32_t*>(w.dst), __ATOMIC_ACQUIRE);
  return static_cast<int32_t>(flag - w.value) >= 0;
}

TEST(OpExchange, RegionIsWholePagesAndItsFlagsAreDistinct) {
  for (uint32_t n : {2u, 3u, 8u, 64u}) {
    Region r(n);
    EXPECT_EQ(OpExchange::region_bytes(n) % 4096, 0u);
    OpExchange x(r.base, n);
    std::set<uint32_t*> seen;
    for (uint64_t seq = 1; seq <= kOpRing; ++seq)
      for (uint32_t a = 0; a < n; ++a) {
        EXPECT_TRUE(seen.insert(x.ready_flag(a, seq)).second);
        EXPECT_TRUE(seen.insert(x.pushed_flag(a, seq)).second);
        for (uint32_t b = 0; b < n; ++b) EXPECT_TRUE(seen.insert(x.done_flag(a, b, seq)).second);
      }
    for (uint32_t a = 0; a < n; ++a) {
      EXPECT_TRUE(seen.insert(x.freed_flag(a)).second);
      for (uint32_t b = 0; b < n; ++b) EXPECT_TRUE(seen.insert(x.landed_flag(a, b)).second);
    }
    EXPECT_EQ(seen.size(), x.flag_count());
    // The flags and the captured ops' blocks lie in the GPUs' part, which starts on a page
    // (only it is registered with CUDA); the posts lie before it.
    const size_t device = OpExchange::device_offset(n);
    EXPECT_EQ(device % 4096, 0u);
    EXPECT_LT(device, r.bytes);
    EXPECT_GE(reinterpret_cast<char*>(x.flags_begin()), static_cast<char*>(r.base) + device);
    for (uint32_t* f : seen) {
      EXPECT_GE(f, x.flags_begin());
      EXPECT_LT(f, x.flags_begin() + x.flag_count());
      EXPECT_LE(reinterpret_cast<char*>(f + 1), static_cast<char*>(r.base) + r.bytes);
    }
  }
}

// A failure's release (release_all: route_setup.cc, parked_routes.cc) frees the reduce-scatters'
// streams too: their pushes wait on freed[p] and their sums on landed[me][p], as wrapping
// counters (reduce_scatter_plan.h). Every rank took the same ops' slices, rank 1 one op more
// (no rank runs further ahead); rank 0 releases, and every wait in every rank's plans passes.
// Slices from 0, and from just below 2^32, where the 32-bit flags wrap.
TEST(OpExchange, ReleaseAllPassesEveryReduceScatterWaitOfEveryRank) {
  constexpr uint32_t kRanks = 3;
  constexpr uint64_t kChunk = 4096, kSlice = 1024;  // four slices an op
  constexpr uint64_t kOps = 2;
  for (uint64_t earlier : {uint64_t{0}, (uint64_t{1} << 32) - 5}) {
    Region r(kRanks);
    std::vector<std::unique_ptr<OpExchange>> x;  // each rank's, over the one region
    for (uint32_t me = 0; me < kRanks; ++me) x.emplace_back(new OpExchange(r.base, kRanks));
    // The slices of earlier ops, all summed: their last writes left every flag at `earlier`.
    for (uint32_t o = 0; o < kRanks; ++o) {
      x[o]->take_rs_slices(earlier);
      *x[0]->freed_flag(o) = static_cast<uint32_t>(earlier);
      for (uint32_t p = 0; p < kRanks; ++p)
        *x[0]->landed_flag(o, p) = static_cast<uint32_t>(earlier);
    }
    std::vector<RsOp> plans;
    for (uint32_t me = 0; me < kRanks; ++me)
      for (uint64_t op = 0; op < kOps + (me == 1); ++op)
        build_reduce_scatter_plan(
            rs_view(*x[me], me, x[me]->take_rs_slices(rs_slices(kChunk, kSlice)), kChunk, kSlice),
            &plans);
    std::set<uint64_t> freed;
    for (uint32_t o = 0; o < kRanks; ++o)
      freed.insert(reinterpret_cast<uint64_t>(x[0]->freed_flag(o)));
    std::vector<RsOp> waits;
    size_t freed_waits = 0;
    for (const RsOp& o : plans)
      if (o.kind == RsOpKind::kWaitGeq) {
        waits.push_back(o);
        freed_waits += freed.count(o.dst);
      }
    ASSERT_GT(freed_waits, 0u);
    ASSERT_GT(waits.size(), freed_waits) << "the sums' waits on landed flags";
    EXPECT_FALSE(std::all_of(waits.begin(), waits.end(), wait_passes)) << "held before";
    x[0]->release_all(kOps);
    for (const RsOp& w : waits)
      EXPECT_TRUE(wait_passes(w)) << "slices from " << earlier << ": a wait for " << w.value
                                  << " on the " << (freed.count(w.dst) ? "freed" : "landed")
                                  << " flag at " << w.dst << ", now "
                                  << *reinterpret_cast<uint32_t*>(w.dst);
  }
}

TEST(OpExchange, TheFirstToArriveDecidesForEveryone) {
  Region r(3);
  OpExchange x(r.base, 3);
  std::vector<OpPost> earlier(3);
  Arrival a1, a0, a2;
  ASSERT_TRUE(x.arrive(1, post(1), &a1, earlier.data(), never));
  EXPECT_EQ(a1.before, 0u);
  EXPECT_EQ(a1.verdict, OpVerdict::kRoute);
  // Later ranks follow even when their own buffers cannot be reached.
  ASSERT_TRUE(x.arrive(0, post(1, false), &a0, earlier.data(), never));
  EXPECT_EQ(a0.before, 0b010u);
  EXPECT_EQ(a0.verdict, OpVerdict::kRoute);
  EXPECT_EQ(earlier[1].send.addr, 0x1000u) << "the earlier rank's post is handed over";
  ASSERT_TRUE(x.arrive(2, post(1), &a2, earlier.data(), never));
  EXPECT_EQ(a2.before, 0b011u);
  EXPECT_STREQ(a2.mismatch, "");
  // Op 2: the first cannot be reached, so NCCL runs it on every rank.
  ASSERT_TRUE(x.arrive(2, post(2, false), &a2, earlier.data(), never));
  ASSERT_TRUE(x.arrive(0, post(2), &a0, earlier.data(), never));
  ASSERT_TRUE(x.arrive(1, post(2), &a1, earlier.data(), never));
  EXPECT_EQ(a2.verdict, OpVerdict::kNccl);
  EXPECT_EQ(a0.verdict, OpVerdict::kNccl);
  EXPECT_EQ(a1.verdict, OpVerdict::kNccl);
}

// A rank that decided an op and stopped before it arrived (killed, or held by its scheduler)
// holds nobody: the others follow its verdict at once. The verdict used to be stored by the
// first rank right after its arrival, and a later rank spun for it with no way out.
TEST(OpExchange, ARankStoppedBetweenDecidingAndArrivingHoldsNobody) {
  Region r(2);
  OpExchange x(r.base, 2);
  std::vector<OpPost> earlier(2);
  EXPECT_EQ(x.decide(post(1, false)), OpVerdict::kNccl);  // rank 0 stops right here
  Arrival a1;
  ASSERT_TRUE(x.arrive(1, post(1), &a1, earlier.data(), never));
  EXPECT_EQ(a1.before, 0u) << "rank 0 never arrived";
  EXPECT_EQ(a1.verdict, OpVerdict::kNccl) << "rank 0's verdict holds for everyone";
  // The decider's own later arrival follows its verdict too.
  Arrival a0;
  ASSERT_TRUE(x.arrive(0, post(1, false), &a0, earlier.data(), never));
  EXPECT_EQ(a0.verdict, OpVerdict::kNccl);
  EXPECT_EQ(a0.before, 0b10u);
}

// A captured op is decided like an eager one (the route when the first rank's buffers can be
// reached); captured on one rank and eager on another at the same position is a mismatch.
TEST(OpExchange, ACapturedOpTakesTheRouteAndMeetingAnEagerOneIsAMismatch) {
  Region r(2);
  OpExchange x(r.base, 2);
  std::vector<OpPost> earlier(2);
  Arrival a0, a1;
  ASSERT_TRUE(x.arrive(0, post(1, true, 100, OpMode::kCaptured), &a0, earlier.data(), never));
  EXPECT_EQ(a0.verdict, OpVerdict::kRoute);
  ASSERT_TRUE(x.arrive(1, post(1), &a1, earlier.data(), never));
  EXPECT_STRNE(a1.mismatch, "");
  ASSERT_TRUE(x.arrive(0, post(2, true, 100, OpMode::kCaptured), &a0, earlier.data(), never));
  ASSERT_TRUE(x.arrive(1, post(2, true, 100, OpMode::kCaptured), &a1, earlier.data(), never));
  EXPECT_STREQ(a1.mismatch, "");
  EXPECT_EQ(a1.verdict, OpVerdict::kRoute);
  ASSERT_TRUE(x.arrive(0, post(3, false, 100, OpMode::kCaptured), &a0, earlier.data(), never));
  ASSERT_TRUE(x.arrive(1, post(3, true, 100, OpMode::kCaptured), &a1, earlier.data(), never));
  EXPECT_EQ(a1.verdict, OpVerdict::kNccl) << "the first rank's buffers cannot be reached";
}

// A post of a buffer across the most allocations a post holds reaches the peers whole, by
// arrival and by read_post; a shorter post later in the same slot reaches them with its own
// extents only, however many the slot's earlier post left behind.
TEST(OpExchange, APostIsHandedOverWithAllItsExtentsAndNoMore) {
  Region r(2);
  OpExchange x(r.base, 2);
  std::vector<OpPost> earlier(2);
  auto with_extents = [](uint64_t seq, uint32_t n) {
    std::unique_ptr<OpPost> p(new OpPost(post(seq)));
    p->recv.addr = 0x10000000 * seq;
    p->recv.nextents = n;
    for (uint32_t i = 0; i < n; ++i)
      p->recv.extents[i] = OpExtent{p->recv.addr + i * 0x1000, 0x1000, seq * 10000 + i, i + 1};
    p->send.nextents = 1;
    p->send.extents[0] = p->recv.extents[n - 1];
    return p;
  };
  auto expect_handed_over = [](const OpPost& got, const OpPost& sent) {
    EXPECT_EQ(got.seq, sent.seq);
    EXPECT_EQ(got.recv.addr, sent.recv.addr);
    ASSERT_EQ(got.recv.nextents, sent.recv.nextents);
    for (uint32_t i = 0; i < sent.recv.nextents; ++i) {
      EXPECT_EQ(got.recv.extents[i].base, sent.recv.extents[i].base) << i;
      EXPECT_EQ(got.recv.extents[i].block_id, sent.recv.extents[i].block_id) << i;
      EXPECT_EQ(got.recv.extents[i].token, sent.recv.extents[i].token) << i;
    }
    ASSERT_EQ(got.send.nextents, 1u);
    EXPECT_EQ(got.send.extents[0].block_id, sent.send.extents[0].block_id);
  };
  Arrival a;
  const auto full = with_extents(1, kMaxExtents);
  ASSERT_TRUE(x.arrive(0, *full, &a, earlier.data(), never));
  ASSERT_TRUE(x.arrive(1, post(1), &a, earlier.data(), never));
  expect_handed_over(earlier[0], *full);
  std::unique_ptr<OpPost> read(new OpPost);
  ASSERT_TRUE(x.read_post(0, 1, read.get()));
  expect_handed_over(*read, *full);
  x.finish(0, 1);
  x.finish(1, 1);
  for (uint64_t seq = 2; seq <= kOpRing; ++seq)
    for (uint32_t rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(x.arrive(rank, post(seq), &a, earlier.data(), never));
      x.finish(rank, seq);
    }
  const auto shorter = with_extents(1 + kOpRing, 3);
  ASSERT_TRUE(x.arrive(0, *shorter, &a, earlier.data(), never));
  ASSERT_TRUE(x.arrive(1, post(1 + kOpRing), &a, earlier.data(), never));
  expect_handed_over(earlier[0], *shorter);
  ASSERT_TRUE(x.read_post(0, 1 + kOpRing, read.get()));
  expect_handed_over(*read, *shorter);
}

// A count past the array (a post written by something else) is clamped, never read past.
TEST(OpExchange, CopyingAPostClampsItsExtentCount) {
  std::unique_ptr<OpPost> in(new OpPost), out(new OpPost);
  in->recv.nextents = kMaxExtents + 100;
  in->send.nextents = ~0u;
  copy_post(out.get(), *in);
  EXPECT_EQ(out->recv.nextents, kMaxExtents);
  EXPECT_EQ(out->send.nextents, kMaxExtents);
}

TEST(OpExchange, DifferentCountsAtOnePositionAreAMismatch) {
  Region r(2);
  OpExchange x(r.base, 2);
  std::vector<OpPost> earlier(2);
  Arrival a0, a1;
  ASSERT_TRUE(x.arrive(0, post(1, true, 100), &a0, earlier.data(), never));
  ASSERT_TRUE(x.arrive(1, post(1, true, 101), &a1, earlier.data(), never));
  EXPECT_STRNE(a1.mismatch, "");
}

// Ranks one collective call apart post all-gathers alike in number, mode, count and datatype:
// only their call chains (call_chain.h) differ, and that is a mismatch, named with the rank.
TEST(OpExchange, PostsWhoseCallChainsDifferAreAMismatch) {
  Region r(3);
  OpExchange x(r.base, 3);
  std::vector<OpPost> earlier(3);
  auto chained = [](uint64_t seq, uint64_t calls, uint64_t chain) {
    OpPost p = post(seq);
    p.calls = calls;
    p.chain = chain;
    return p;
  };
  Arrival a0, a1, a2;
  ASSERT_TRUE(x.arrive(0, chained(1, 4, 0xabc), &a0, earlier.data(), never));
  ASSERT_TRUE(x.arrive(1, chained(1, 4, 0xabc), &a1, earlier.data(), never));
  EXPECT_STREQ(a1.mismatch, "") << "the same chain pairs";
  ASSERT_TRUE(x.arrive(2, chained(1, 5, 0xdef), &a2, earlier.data(), never));
  EXPECT_STRNE(a2.mismatch, "");
  EXPECT_EQ(a2.mismatch_rank, 0u) << "the first earlier rank that differs";
  EXPECT_EQ(earlier[0].calls, 4u) << "its post is handed over, for the numbers";
  EXPECT_EQ(earlier[0].chain, 0xabcu);
  // The same count of calls but another chain (a call replaced by another) differs too.
  ASSERT_TRUE(x.arrive(1, chained(2, 9, 0x111), &a1, earlier.data(), never));
  ASSERT_TRUE(x.arrive(0, chained(2, 9, 0x222), &a0, earlier.data(), never));
  EXPECT_STRNE(a0.mismatch, "");
  EXPECT_EQ(a0.mismatch_rank, 1u);
}

TEST(OpExchange, AStageIsSeenOnlyForTheOpItWasPublishedFor) {
  // Rank 1's stage for op 3 is in slot 3; the same slot's next op (3 + kOpRing) has none until
  // rank 1 publishes again, and no other rank's or slot's stage is disturbed.
  Region r(3);
  OpExchange x(r.base, 3);
  OpStage s, got;
  s.addr = 0xabc000;
  s.bytes = 3 << 20;
  s.extent = OpExtent{0xabc000, 4 << 20, 42, 7};
  EXPECT_FALSE(x.read_stage(1, 3, &got));
  x.publish_stage(1, 3, s);
  ASSERT_TRUE(x.read_stage(1, 3, &got));
  EXPECT_EQ(got.addr, s.addr);
  EXPECT_EQ(got.bytes, s.bytes);
  EXPECT_EQ(got.extent.block_id, 42u);
  EXPECT_EQ(got.extent.token, 7u);
  EXPECT_FALSE(x.read_stage(1, 3 + kOpRing, &got));
  EXPECT_FALSE(x.read_stage(1, 4, &got));
  EXPECT_FALSE(x.read_stage(0, 3, &got));
  EXPECT_FALSE(x.read_stage(2, 3, &got));
  // Stages sit apart from the flags: publishing one leaves every flag zero.
  for (size_t i = 0; i < x.flag_count(); ++i) EXPECT_EQ(x.flags_begin()[i], 0u);
  s.addr = 0xdef000;
  x.publish_stage(1, 3 + kOpRing, s);
  ASSERT_TRUE(x.read_stage(1, 3 + kOpRing, &got));
  EXPECT_EQ(got.addr, 0xdef000u);
  EXPECT_FALSE(x.read_stage(1, 3, &got));
}

TEST(OpExchange, ARankTooFarAheadWaitsForTheRingAndCanGiveUp) {
  Region r(2);
  OpExchange x(r.base, 2);
  std::vector<OpPost> earlier(2);
  Arrival a;
  for (uint64_t seq = 1; seq <= kOpRing; ++seq) {
    ASSERT_TRUE(x.arrive(0, post(seq), &a, earlier.data(), never));
    x.finish(0, seq);
  }
  // Op kOpRing + 1 reuses op 1's slot, which rank 1 has not read yet.
  int asked = 0;
  EXPECT_FALSE(
      x.arrive(0, post(kOpRing + 1), &a, earlier.data(), [&](uint32_t) { return ++asked == 100; }));
  EXPECT_EQ(asked, 100);
  ASSERT_TRUE(x.arrive(1, post(1), &a, earlier.data(), never));
  x.finish(1, 1);
  EXPECT_TRUE(x.arrive(0, post(kOpRing + 1), &a, earlier.data(), never));
}

TEST(OpExchange, PairsSettleOnceWhoeverClaimsFirst) {
  Region r(2);
  OpExchange x(r.base, 2);
  EXPECT_FALSE(x.pair_settled(0, 1, 1));
  EXPECT_EQ(x.settle_pair(0, 1, 1, PairMode::kEachPushes), PairMode::kEachPushes);
  EXPECT_TRUE(x.pair_settled(0, 1, 1));
  EXPECT_EQ(x.settle_pair(0, 1, 1, PairMode::kLaterDoesBoth), PairMode::kEachPushes);
  // The slot's next op starts unsettled.
  EXPECT_FALSE(x.pair_settled(0, 1, 1 + kOpRing));
  EXPECT_EQ(x.settle_pair(0, 1, 1 + kOpRing, PairMode::kLaterDoesBoth), PairMode::kLaterDoesBoth);
}

// Ranks on threads issue many ops with random pauses: every op has one first arrival, nested
// "before" sets, one verdict, and every pair settles to one mode seen alike by both ends.
TEST(OpExchange, ThreadsAgreeOnEveryOpAcrossManyRingTurns) {
  constexpr uint32_t kRanks = 4;
  constexpr uint64_t kOps = 300;
  Region r(kRanks);
  OpExchange x(r.base, kRanks);
  std::vector<std::vector<Arrival>> got(kRanks, std::vector<Arrival>(kOps + 1));
  std::vector<std::vector<PairMode>> modes(kRanks * kRanks, std::vector<PairMode>(kOps + 1));
  std::vector<std::thread> threads;
  for (uint32_t me = 0; me < kRanks; ++me)
    threads.emplace_back([&, me] {
      std::mt19937 rng(me + 1);
      std::vector<OpPost> earlier(kRanks);
      for (uint64_t seq = 1; seq <= kOps; ++seq) {
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
        Arrival a;
        const bool reachable = (seq + me) % 3 != 0;
        ASSERT_TRUE(x.arrive(me, post(seq, reachable), &a, earlier.data(), never));
        got[me][seq] = a;
        for (uint32_t p = 0; p < kRanks; ++p) {
          if (p == me) continue;
          const bool later = a.before >> p & 1;
          const uint32_t e = later ? p : me, l = later ? me : p;
          const PairMode want = rng() % 2 ? PairMode::kEachPushes : PairMode::kLaterDoesBoth;
          modes[me * kRanks + p][seq] = x.settle_pair(e, l, seq, want);
        }
        x.finish(me, seq);
      }
    });
  for (auto& t : threads) t.join();
  for (uint64_t seq = 1; seq <= kOps; ++seq) {
    std::set<int> sizes;
    int firsts = 0;
    for (uint32_t me = 0; me < kRanks; ++me) {
      const Arrival& a = got[me][seq];
      EXPECT_EQ(a.seq, seq);
      EXPECT_EQ(a.before >> me & 1, 0u);
      EXPECT_EQ(a.verdict, got[0][seq].verdict) << "op " << seq;
      EXPECT_STREQ(a.mismatch, "");
      sizes.insert(__builtin_popcountll(a.before));
      firsts += a.before == 0;
      for (uint32_t p = 0; p < kRanks; ++p)
        if (p != me) {
          // Exactly one of the two arrived first, and both ends saw the same mode.
          EXPECT_NE(a.before >> p & 1, got[p][seq].before >> me & 1);
          EXPECT_EQ(modes[me * kRanks + p][seq], modes[p * kRanks + me][seq]);
        }
    }
    EXPECT_EQ(firsts, 1);
    EXPECT_EQ(sizes.size(), kRanks) << "the before sets of one op are nested";
  }
}

}  // namespace
}  // namespace zc
