// The local group plan (src/local_group_plan.h) run on host memory: every rank's user, push and
// local streams in order, events with CUDA's binding (a wait applies to the last record of that
// event issued before it, whichever rank's stream records it), and a seeded scheduler that runs
// one stream operation at a time from a stream chosen at random, streams at random and changing
// speeds, so that many interleavings are tried. Around each op the application's work sits on
// every user stream: before it, writing the op's input into the send chunk; after it, checking
// the received bytes and scribbling over both buffers, as an application that reuses them
// would. A missing wait shows as wrong bytes.
#include "local_group_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "plan_sim_bytes.h"

namespace zc {
namespace {

struct SimStep {
  enum Kind { kPlan, kProduce, kConsume } kind = kPlan;
  LocalGroupStep step{};
  int op = 0;
  uint64_t target = 0;  // a wait: records of its event issued before it
};

class Sim {
 public:
  Sim(int nranks, uint64_t chunk, bool in_place, uint64_t seed)
      : n_(nranks), chunk_(chunk), in_place_(in_place), rng_(seed) {
    recv_.assign(n_, std::vector<uint8_t>(chunk * n_, 0xEE));
    send_.assign(n_, std::vector<uint8_t>(chunk, 0xEE));
    streams_.assign(n_, std::vector<std::deque<SimStep>>(kDirectStreams));
    issued_.assign(n_, std::vector<uint64_t>(kDirectEvents, 0));
    ran_.assign(n_, std::vector<uint64_t>(kDirectEvents, 0));
  }

  uint64_t send_of(int r) {
    return in_place_ ? addr(recv_[r].data()) + static_cast<uint64_t>(r) * chunk_
                     : addr(send_[r].data());
  }

  LocalGroupView view() {
    LocalGroupView v;
    v.nranks = n_;
    v.chunk = chunk_;
    for (int r = 0; r < n_; ++r) v.ranks[r] = {send_of(r), addr(recv_[r].data())};
    return v;
  }

  // Op `op`: the application's input on every rank, the plan's steps in their order, then the
  // checks; `drop` (if >= 0) leaves that step of the plan out.
  void enqueue(int op, const std::vector<LocalGroupStep>& plan, int drop) {
    application_step(SimStep::kProduce, op);
    for (size_t i = 0; i < plan.size(); ++i) {
      if (static_cast<int>(i) == drop) continue;
      SimStep s;
      s.step = plan[i];
      s.op = op;
      const DirectOp& o = plan[i].op;
      if (o.kind == DirectOpKind::kRecord) ++issued_[plan[i].event_rank][o.event];
      if (o.kind == DirectOpKind::kWaitEvent) s.target = issued_[plan[i].event_rank][o.event];
      streams_[plan[i].rank][static_cast<int>(o.stream)].push_back(s);
    }
    application_step(SimStep::kConsume, op);
  }

  // The application's work of op `op` on every rank's user stream.
  void application_step(SimStep::Kind kind, int op) {
    for (int r = 0; r < n_; ++r) {
      SimStep s;
      s.kind = kind;
      s.op = op;
      s.step.rank = static_cast<uint8_t>(r);
      streams_[r][0].push_back(s);
    }
  }

  // Runs every stream to its end; false on a deadlock.
  bool run() {
    for (;;) {
      std::vector<std::pair<int, int>> runnable;
      bool left = false;
      for (int r = 0; r < n_; ++r)
        for (int k = 0; k < kDirectStreams; ++k) {
          if (streams_[r][k].empty()) continue;
          left = true;
          if (ready(streams_[r][k].front())) runnable.push_back({r, k});
        }
      if (!left) return true;
      if (runnable.empty()) return false;
      // Streams at random speeds that change now and then: a slow one lets the others run far.
      if (steps_++ % 40 == 0)
        for (auto& w : weight_) w = 1 + rng_() % 32;
      auto weight = [&](size_t i) {
        return weight_[runnable[i].first * kDirectStreams + runnable[i].second];
      };
      uint64_t total = 0;
      for (size_t i = 0; i < runnable.size(); ++i) total += weight(i);
      uint64_t pick = rng_() % total;
      size_t at = 0;
      for (; pick >= weight(at); ++at) pick -= weight(at);
      const auto [r, k] = runnable[at];
      execute(streams_[r][k].front());
      streams_[r][k].pop_front();
    }
  }

  int wrong() const { return wrong_; }

 private:
  bool ready(const SimStep& s) const {
    if (s.kind != SimStep::kPlan || s.step.op.kind != DirectOpKind::kWaitEvent) return true;
    return ran_[s.step.event_rank][s.step.op.event] >= s.target;
  }

  void execute(const SimStep& s) {
    const int r = s.step.rank;
    switch (s.kind) {
      case SimStep::kProduce: {
        auto* out = reinterpret_cast<uint8_t*>(send_of(r));
        for (uint64_t i = 0; i < chunk_; ++i) out[i] = pattern(r, s.op, i);
        return;
      }
      case SimStep::kConsume: {
        for (int q = 0; q < n_; ++q)
          for (uint64_t i = 0; i < chunk_; ++i)
            if (recv_[r][q * chunk_ + i] != pattern(q, s.op, i)) {
              ++wrong_;
              break;
            }
        std::fill(recv_[r].begin(), recv_[r].end(), 0xEE);
        std::fill(send_[r].begin(), send_[r].end(), 0xEE);
        return;
      }
      case SimStep::kPlan:
        break;
    }
    const DirectOp& o = s.step.op;
    if (o.kind == DirectOpKind::kCopy)
      std::memcpy(reinterpret_cast<void*>(o.dst), reinterpret_cast<const void*>(o.src), o.bytes);
    else if (o.kind == DirectOpKind::kRecord)
      ++ran_[s.step.event_rank][o.event];
  }

  int n_;
  uint64_t chunk_;
  bool in_place_;
  std::mt19937_64 rng_;
  std::vector<std::vector<uint8_t>> recv_, send_;
  std::vector<std::vector<std::deque<SimStep>>> streams_;  // [rank][DirectStream]
  std::vector<std::vector<uint64_t>> issued_, ran_;        // records of [rank][event]
  std::vector<uint64_t> weight_ = std::vector<uint64_t>(kMaxRanks * kDirectStreams, 1);
  uint64_t steps_ = 0;
  int wrong_ = 0;
};

constexpr int kOps = 4;

// Wrong bytes and deadlocks over `seeds` interleavings of kOps ops back to back.
struct Outcome {
  int wrong = 0, deadlocks = 0;
};
Outcome simulate(int nranks, bool in_place, int seeds, int drop = -1) {
  Outcome o;
  for (int seed = 0; seed < seeds; ++seed) {
    Sim sim(nranks, 24, in_place, static_cast<uint64_t>(seed) * 7919 + nranks);
    std::vector<LocalGroupStep> plan;
    build_local_group_plan(sim.view(), &plan);
    for (int op = 0; op < kOps; ++op) sim.enqueue(op, plan, drop);
    if (!sim.run()) ++o.deadlocks;
    o.wrong += sim.wrong();
  }
  return o;
}

TEST(LocalGroupPlan, EveryInterleavingDeliversEveryChunk) {
  for (int n : {2, 3, 5})
    for (bool in_place : {false, true}) {
      SCOPED_TRACE("ranks " + std::to_string(n) + (in_place ? " in place" : " out of place"));
      const Outcome o = simulate(n, in_place, 300);
      EXPECT_EQ(o.wrong, 0);
      EXPECT_EQ(o.deadlocks, 0);
    }
}

TEST(LocalGroupPlan, EachPushAndNoOtherCopyCrossesGpus) {
  for (bool in_place : {false, true}) {
    Sim sim(3, 8, in_place, 1);
    std::vector<LocalGroupStep> plan;
    build_local_group_plan(sim.view(), &plan);
    int pushes = 0, local = 0;
    for (const LocalGroupStep& s : plan) {
      if (s.op.kind != DirectOpKind::kCopy) continue;
      EXPECT_EQ(s.op.src, sim.send_of(s.rank)) << "a rank copies only its own chunk";
      (s.op.stream == DirectStream::kPush ? pushes : local) += 1;
      EXPECT_NE(s.op.stream, DirectStream::kUser) << "no copy on the application's stream";
    }
    EXPECT_EQ(pushes, 3 * 2);
    EXPECT_EQ(local, in_place ? 0 : 3);
  }
}

// A rank reached through a second mapping (local_aliases.h): the peers push into that, its own
// copy still goes to its receive buffer as its GPU addresses it.
TEST(LocalGroupPlan, PeersWriteThroughTheSecondMappingWhereThereIsOne) {
  LocalGroupView v;
  v.nranks = 2;
  v.chunk = 16;
  v.ranks[0] = {0x1000, 0x2000, 0};
  v.ranks[1] = {0x3000, 0x4000, 0x9000};
  std::vector<LocalGroupStep> plan;
  build_local_group_plan(v, &plan);
  std::vector<uint64_t> dst_of_rank0, dst_of_rank1;
  for (const LocalGroupStep& s : plan)
    if (s.op.kind == DirectOpKind::kCopy)
      (s.rank == 0 ? dst_of_rank0 : dst_of_rank1).push_back(s.op.dst);
  EXPECT_EQ(dst_of_rank0, (std::vector<uint64_t>{0x9000, 0x2000}));  // push, own chunk
  EXPECT_EQ(dst_of_rank1, (std::vector<uint64_t>{0x2000 + 16, 0x4000 + 16}));
}

// Every wait of the plan is needed: without any one of them some interleaving delivers wrong
// bytes (so the simulation above can fail).
TEST(LocalGroupPlan, EveryWaitIsNeeded) {
  for (bool in_place : {false, true}) {
    Sim sim(3, 24, in_place, 1);
    std::vector<LocalGroupStep> plan;
    build_local_group_plan(sim.view(), &plan);
    int waits = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      if (plan[i].op.kind != DirectOpKind::kWaitEvent) continue;
      ++waits;
      SCOPED_TRACE("without step " + std::to_string(i) + (in_place ? ", in place" : ""));
      const Outcome o = simulate(3, in_place, 200, static_cast<int>(i));
      EXPECT_GT(o.wrong, 0);
    }
    EXPECT_EQ(waits, 3 * 3 * 2 + (in_place ? 0 : 3 * 2));
  }
}

}  // namespace
}  // namespace zc
