// The zero-copy all-gather's plans (src/route/direct_plan.h) run against each other on host memory.
//
// A simulator gives every rank its four in-order streams and CUDA-like events (a wait applies to
// the latest record of that event enqueued before it); a seeded scheduler runs one stream
// operation at a time, in random order with streams at random and changing speeds, so many
// interleavings are tried, lagging peers included. Around each op the
// application's own work sits on the user's stream: before it, writing this op's input into the
// send buffer; after it, checking the received bytes and then scribbling over both buffers, as
// an application that reuses them would. A plan that copies before a peer's input is there, or
// after the peer reused its buffers, or that ends before its data arrived, shows as wrong bytes;
// one that waits for a signal nobody gives shows as a deadlock. Flags live in an OpExchange
// region, so they are laid out and reused (ring slots) exactly as on the GPU.
//
// Captured ops (Scenario::captured) are built once, over flag blocks claimed in that region, and
// then replayed: each replay enqueues every rank's plans again, with fresh inputs, as graph
// launches do; a reset that comes too late or not at all shows as a stale signal letting a
// later replay through early (wrong bytes), or a deadlock.
#include "direct_plan.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "local_group_plan.h"
#include "op_exchange.h"

namespace zc {
namespace {

// A byte per (rank, op, offset) that differs between neighbouring ranks, ops and offsets.
uint8_t pattern(int rank, uint64_t op, uint64_t i) {
  return static_cast<uint8_t>(rank * 59 + op * 13 + i * 7 + 1);
}

// Host pointers as the plans' integer addresses.
uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// One simulated stream operation: a plan op, or the application's work around an op.
struct SimOp {
  enum Kind { kPlan, kProduce, kConsume } kind = kPlan;
  DirectOp op{};
  uint64_t seq = 0;
  uint64_t event_target = 0;  // kWaitEvent: records of op.event that must have run
};

struct Scenario {
  int nranks = 2;
  uint64_t chunk = 64;
  bool in_place = false;
  int ops = 3;
  // For op k: arrival order, and how each cross pair moves its chunks.
  std::function<std::vector<int>(int k, std::mt19937&)> order;
  std::function<PairMode(int e, int l, int k, std::mt19937&)> mode;
  // Ranks whose buffers no peer can reach: never the first to arrive (that rank's verdict would
  // send the op to NCCL); between the first and the last, reached through their stage.
  std::vector<bool> unreachable;
  // Captured into a graph of `ops` ops, replayed `replays` times.
  bool captured = false;
  // One thread's group over every rank (local_group_plan.h): every pair each pushes, no
  // exchange (order, mode and unreachable do not apply).
  bool local_group = false;
  int replays = 1;
  // Eager ops whose earlier ranks leave their pushes to later ranks to the push issuer
  // (push_issuer.h): its plan (build_deferred_push) runs on a stream of its own, one per rank,
  // its peers in a random claim order. Plans passed to `mutate` as rank -1 - r.
  bool deferred = false;
  // ... and so do later ranks their pushes into earlier ones that settled "each pushes" (but
  // into a staged rank).
  bool deferred_later = false;
};

// The simulated stream of rank r's push issuer (after the plan's own streams).
constexpr int kIssuerStream = kDirectStreams;
constexpr int kSimStreams = kDirectStreams + 1;

class Sim {
 public:
  Sim(const Scenario& s, uint64_t seed) : s_(s), rng_(seed) {
    const uint32_t n = static_cast<uint32_t>(s.nranks);
    region_bytes_ = OpExchange::region_bytes(n);
    region_ =
        mmap(nullptr, region_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ex_.reset(new OpExchange(region_, n));
    recv_.assign(n, std::vector<uint8_t>(s.chunk * n, 0xEE));
    stage_.assign(n, std::vector<uint8_t>(s.chunk * n, 0xEE));
    s_.unreachable.resize(n, false);
    send_.assign(n, std::vector<uint8_t>(s.chunk, 0xEE));
    streams_.assign(n, std::vector<std::deque<SimOp>>(kSimStreams));
    records_.assign(n, std::vector<uint64_t>(kDirectEvents, 0));
    enqueued_records_.assign(n, std::vector<uint64_t>(kDirectEvents, 0));
  }
  ~Sim() { munmap(region_, region_bytes_); }

  uint64_t send_of(int r) {
    return s_.in_place ? addr(recv_[r].data()) + static_cast<uint64_t>(r) * s_.chunk
                       : addr(send_[r].data());
  }
  uint64_t recv_of(int r) { return addr(recv_[r].data()); }
  uint64_t stage_of(int r) { return addr(stage_[r].data()); }
  // The flag rank r says ready on for op k.
  uint64_t ready_of(int r, int k) {
    return addr(ex_->ready_flag(static_cast<uint32_t>(r), static_cast<uint64_t>(k) + 1));
  }
  // The rank whose receive buffer holds `a`, -1 for none.
  int owner_of(uint64_t a) {
    for (int r = 0; r < s_.nranks; ++r)
      if (a >= recv_of(r) && a < recv_of(r) + recv_[r].size()) return r;
    return -1;
  }

  // Who arrived when at op k, whose buffers go through a stage, and how each pair moves its
  // chunks (op_exchange.h).
  struct ArrivalShape {
    std::vector<int> position;
    std::vector<bool> staged;
    std::vector<std::vector<PairMode>> mode;
  };

  // The views of every rank for op k, as ce_allgather builds them (local_group_allgather for a
  // local group); captured ops' plans are kept for replay() rather than enqueued.
  void build(int k, const std::function<void(int rank, std::vector<DirectOp>*)>& mutate) {
    const uint64_t seq = static_cast<uint64_t>(k) + 1;
    std::vector<CaptureRef> block(static_cast<size_t>(s_.nranks));
    for (int r = 0; s_.captured && r < s_.nranks; ++r)
      EXPECT_TRUE(ex_->blocks().claim(static_cast<uint32_t>(r), &block[r]));
    const ArrivalShape shape = arrival_shape(k);
    LocalGroupView group;
    group.nranks = s_.nranks;
    group.chunk = s_.chunk;
    for (int r = 0; r < s_.nranks; ++r) group.ranks[r] = {send_of(r), recv_of(r)};
    for (int me = 0; me < s_.nranks; ++me) {
      DirectOpView v;
      if (s_.local_group)
        local_group_rank_view(group, me, &v);
      else
        exchange_view(me, shape, &v);
      v.seq = static_cast<uint32_t>(seq);
      for (int p = 0; p < s_.nranks; ++p) {
        const uint32_t up = static_cast<uint32_t>(p), um = static_cast<uint32_t>(me);
        v.ready[p] = addr(ex_->ready_flag(up, seq));
        v.done_to[p] = addr(ex_->done_flag(up, um, seq));
        v.done_from[p] = addr(ex_->done_flag(um, up, seq));
      }
      v.pushed = addr(ex_->pushed_flag(static_cast<uint32_t>(me), seq));
      if (s_.captured) captured_words(me, block, &v);
      std::vector<DirectOp> plan;
      build_direct_plan(v, &plan);
      if (mutate) mutate(me, &plan);
      if (s_.captured) {
        graph_.resize(static_cast<size_t>(s_.nranks));
        graph_[me].push_back(plan);
        continue;
      }
      enqueue(me, seq, plan);
      if (s_.deferred) issue_deferred(me, seq, v, shape, mutate);
    }
  }

  // What rank me's push issuer issues for op `seq`: its later peers in a random claim order.
  void issue_deferred(int me, uint64_t seq, const DirectOpView& v, const ArrivalShape& a,
                      const std::function<void(int rank, std::vector<DirectOp>*)>& mutate) {
    std::vector<int> later;
    for (int p = 0; p < s_.nranks; ++p)
      if (p != me && v.peers[p].deferred) later.push_back(p);
    if (later.empty()) return;
    std::shuffle(later.begin(), later.end(), rng_);
    std::vector<DirectOp> plan;
    bool copied = false;
    for (size_t i = 0; i < later.size(); ++i) {
      const int p = later[i];
      const bool each = a.mode[me][p] == PairMode::kEachPushes;
      build_deferred_push(v, each ? p : -1, !copied, i + 1 == later.size(), &plan);
      copied |= each;
    }
    if (mutate) mutate(-1 - me, &plan);
    for (const DirectOp& o : plan) {
      SimOp op;
      op.op = o;
      op.seq = seq;
      streams_[me][kIssuerStream].push_back(op);
    }
  }

  ArrivalShape arrival_shape(int k) {
    ArrivalShape a;
    std::vector<int> order = s_.order(k, rng_);
    while (s_.unreachable[order[0]]) std::rotate(order.begin(), order.begin() + 1, order.end());
    a.position.resize(static_cast<size_t>(s_.nranks));
    for (int i = 0; i < s_.nranks; ++i) a.position[static_cast<size_t>(order[i])] = i;
    a.staged.resize(static_cast<size_t>(s_.nranks));
    for (int r = 0; r < s_.nranks; ++r)
      a.staged[r] = s_.unreachable[r] && a.position[r] != 0 && a.position[r] != s_.nranks - 1;
    a.mode.assign(s_.nranks, std::vector<PairMode>(s_.nranks));
    for (int e = 0; e < s_.nranks; ++e)
      for (int l = 0; l < s_.nranks; ++l)
        if (e != l && a.position[e] < a.position[l]) {
          // A later rank whose buffers cannot be reached does both copies of the pair.
          a.mode[e][l] = a.mode[l][e] =
              s_.unreachable[l] ? PairMode::kLaterDoesBoth : s_.mode(e, l, k, rng_);
        }
    return a;
  }

  // Rank me's view through the op exchange, but for its number and flags.
  void exchange_view(int me, const ArrivalShape& a, DirectOpView* v) {
    v->rank = me;
    v->nranks = s_.nranks;
    v->chunk = s_.chunk;
    v->send = send_of(me);
    v->recv = recv_of(me);
    v->stage = a.staged[me] ? stage_of(me) : 0;
    for (int p = 0; p < s_.nranks; ++p) {
      if (p == me) continue;
      PeerPart& part = v->peers[p];
      const bool later = a.position[me] > a.position[p];
      const PairMode m = a.mode[me][p];
      part.push = later || m == PairMode::kEachPushes;
      part.pull = later && m == PairMode::kLaterDoesBoth;
      // An eager earlier rank leaves the pair to its issuer, whichever way it settled; a later
      // one its push, where each pushes.
      part.deferred = s_.deferred && (!later || (s_.deferred_later &&
                                                 m == PairMode::kEachPushes && !a.staged[p]));
      const bool push_to = part.push;
      if (part.deferred) part.push = false;
      part.peer_copies = !later || m == PairMode::kEachPushes;
      part.staged = !later && a.staged[me];
      // A staged peer is reached through its stage, laid out like its receive buffer.
      const uint64_t peer_recv = a.staged[p] ? stage_of(p) : recv_of(p);
      const uint64_t peer_send =
          a.staged[p] ? stage_of(p) + static_cast<uint64_t>(p) * s_.chunk : send_of(p);
      if (push_to) part.to = Span{peer_recv + static_cast<uint64_t>(me) * s_.chunk, s_.chunk};
      if (part.pull) part.from = Span{peer_send, s_.chunk};
    }
  }

  // Every rank launches its graph (every captured op, in order) once more, with fresh inputs.
  void replay(int rep) {
    for (int me = 0; me < s_.nranks; ++me)
      for (size_t k = 0; k < graph_[me].size(); ++k)
        enqueue(me, static_cast<uint64_t>(rep) * graph_[me].size() + k + 1, graph_[me][k]);
  }

  // A captured op's flags: the words of the blocks, as captured_flags() in ce_allgather.cc.
  void captured_words(int me, const std::vector<CaptureRef>& block, DirectOpView* v) {
    CaptureBlocks& b = ex_->blocks();
    const uint32_t um = static_cast<uint32_t>(me);
    v->captured = true;
    v->started = addr(b.started(um, block[me]));
    for (int p = 0; p < s_.nranks; ++p) {
      const uint32_t up = static_cast<uint32_t>(p);
      if (p == me) continue;
      v->ready_push_out[p] = addr(b.ready_push(um, block[me], up));
      v->ready_pull_out[p] = addr(b.ready_pull(um, block[me], up));
      v->done_from[p] = addr(b.done_from(um, block[me], up));
      v->ready_push_in[p] = addr(b.ready_push(up, block[p], um));
      v->ready_pull_in[p] = addr(b.ready_pull(up, block[p], um));
      v->done_to[p] = addr(b.done_from(up, block[p], um));
    }
  }

  void enqueue(int me, uint64_t seq, const std::vector<DirectOp>& plan) {
    SimOp produce;
    produce.kind = SimOp::kProduce;
    produce.seq = seq;
    streams_[me][0].push_back(produce);
    for (const DirectOp& o : plan) {
      SimOp op;
      op.op = o;
      op.seq = seq;
      const int e = o.event;
      if (o.kind == DirectOpKind::kRecord) ++enqueued_records_[me][e];
      if (o.kind == DirectOpKind::kWaitEvent) op.event_target = enqueued_records_[me][e];
      streams_[me][static_cast<int>(o.stream)].push_back(op);
    }
    SimOp consume;
    consume.kind = SimOp::kConsume;
    consume.seq = seq;
    streams_[me][0].push_back(consume);
  }

  std::vector<std::vector<std::vector<DirectOp>>> graph_;  // [rank][op]: captured plans

  // Runs everything; "" or what went wrong.
  std::string run() {
    for (;;) {
      std::vector<std::pair<int, int>> runnable;
      bool left = false;
      for (int r = 0; r < s_.nranks; ++r)
        for (int st = 0; st < kSimStreams; ++st) {
          if (streams_[r][st].empty()) continue;
          left = true;
          if (can_run(r, streams_[r][st].front())) runnable.push_back({r, st});
        }
      if (!left) return errors_;
      if (runnable.empty()) return errors_ + "deadlock";
      // Streams run at speeds that differ a lot and change now and then: a peer that lags far
      // behind is the interleaving where a missing wait shows.
      if (steps_++ % 64 == 0) {
        std::uniform_real_distribution<double> e(-5, 5);
        for (auto& w : weight_) w = std::exp(e(rng_));
      }
      double total = 0;
      for (auto [r, st] : runnable) total += weight_[r * kSimStreams + st];
      double pick = std::uniform_real_distribution<double>(0, total)(rng_);
      std::pair<int, int> chosen = runnable.back();
      for (auto rs : runnable)
        if ((pick -= weight_[rs.first * kSimStreams + rs.second]) <= 0) {
          chosen = rs;
          break;
        }
      const auto [r, st] = chosen;
      SimOp op = streams_[r][st].front();
      streams_[r][st].pop_front();
      execute(r, op);
    }
  }

 private:
  bool can_run(int r, const SimOp& o) const {
    if (o.kind != SimOp::kPlan) return true;
    if (o.op.kind == DirectOpKind::kWaitGeq) {
      const uint32_t v = *reinterpret_cast<const uint32_t*>(o.op.dst);
      return static_cast<int32_t>(v - o.op.value) >= 0;
    }
    if (o.op.kind == DirectOpKind::kWaitSignal) {  // a 64-bit word written in 32-bit halves
      uint64_t word;
      memcpy(&word, reinterpret_cast<const void*>(o.op.dst), sizeof word);
      return (word & kCaptureWaitMask) != 0;
    }
    if (o.op.kind == DirectOpKind::kWaitEvent) return records_[r][o.op.event] >= o.event_target;
    return true;
  }

  void execute(int r, const SimOp& o) {
    const size_t n = s_.chunk;
    switch (o.kind) {
      case SimOp::kProduce: {
        auto* p = reinterpret_cast<uint8_t*>(send_of(r));
        for (size_t i = 0; i < n; ++i) p[i] = pattern(r, o.seq, i);
        return;
      }
      case SimOp::kConsume: {
        for (int src = 0; src < s_.nranks; ++src)
          for (size_t i = 0; i < n; ++i)
            if (recv_[r][src * n + i] != pattern(src, o.seq, i)) {
              errors_ += "rank " + std::to_string(r) + " op " + std::to_string(o.seq) +
                         ": wrong bytes from rank " + std::to_string(src) + "; ";
              break;
            }
        std::fill(recv_[r].begin(), recv_[r].end(), 0xEE);  // the application reuses them
        std::fill(send_[r].begin(), send_[r].end(), 0xEE);
        return;
      }
      case SimOp::kPlan:
        break;
    }
    const DirectOp& d = o.op;
    switch (d.kind) {
      case DirectOpKind::kWrite:
        memcpy(reinterpret_cast<void*>(d.dst), &d.value, sizeof d.value);
        break;
      case DirectOpKind::kCopy:
        memmove(reinterpret_cast<void*>(d.dst), reinterpret_cast<const void*>(d.src), d.bytes);
        break;
      case DirectOpKind::kRecord:
        ++records_[r][d.event];
        break;
      case DirectOpKind::kWaitGeq:
      case DirectOpKind::kWaitSignal:
      case DirectOpKind::kWaitEvent:
        break;
    }
  }

  Scenario s_;
  std::mt19937 rng_;
  size_t region_bytes_;
  void* region_;
  std::unique_ptr<OpExchange> ex_;
  std::vector<std::vector<uint8_t>> recv_, send_, stage_;
  std::vector<std::vector<std::deque<SimOp>>> streams_;
  std::vector<std::vector<uint64_t>> records_, enqueued_records_;
  std::string errors_;
  uint64_t steps_ = 0;
  std::vector<double> weight_ = std::vector<double>(kMaxRanks * kSimStreams, 1.0);
};

std::vector<int> random_order(int n, std::mt19937& rng) {
  std::vector<int> o(static_cast<size_t>(n));
  std::iota(o.begin(), o.end(), 0);
  std::shuffle(o.begin(), o.end(), rng);
  return o;
}

Scenario scenario(int nranks, bool in_place, const char* modes,
                  std::vector<bool> unreachable = {}) {
  Scenario s;
  s.unreachable = std::move(unreachable);
  s.nranks = nranks;
  s.in_place = in_place;
  s.ops = 2 * static_cast<int>(kOpRing) + 3;  // every ring slot reused
  s.order = [nranks](int, std::mt19937& rng) { return random_order(nranks, rng); };
  const std::string m = modes;
  s.mode = [m](int, int, int, std::mt19937& rng) {
    if (m == "each") return PairMode::kEachPushes;
    if (m == "later") return PairMode::kLaterDoesBoth;
    return rng() % 2 ? PairMode::kEachPushes : PairMode::kLaterDoesBoth;
  };
  return s;
}

std::string run(const Scenario& s, uint64_t seed,
                const std::function<void(int, int, std::vector<DirectOp>*)>& mutate = nullptr) {
  Sim sim(s, seed);
  for (int k = 0; k < s.ops; ++k)
    sim.build(k, [&](int rank, std::vector<DirectOp>* plan) {
      if (mutate) mutate(k, rank, plan);
    });
  for (int rep = 0; s.captured && rep < s.replays; ++rep) sim.replay(rep);
  return sim.run();
}

struct Case {
  int nranks;
  bool in_place;
  const char* modes;
  std::vector<bool> unreachable = {};
};

// "3 ranks, out of place, mixed, unreachable 010": stable test names.
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.nranks << " ranks, " << (c.in_place ? "in place, " : "out of place, ") << c.modes;
  if (c.unreachable.empty()) return;
  *os << ", unreachable ";
  for (bool u : c.unreachable) *os << (u ? '1' : '0');
}

class DirectPlanSim : public ::testing::TestWithParam<Case> {};

TEST_P(DirectPlanSim, EveryInterleavingGathersCorrectly) {
  const Case c = GetParam();
  for (uint64_t seed = 1; seed <= 40; ++seed)
    ASSERT_EQ(run(scenario(c.nranks, c.in_place, c.modes, c.unreachable), seed), "")
        << "seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Shapes, DirectPlanSim,
                         ::testing::Values(Case{2, false, "each"}, Case{2, true, "each"},
                                           Case{2, false, "later"}, Case{2, true, "later"},
                                           Case{3, false, "mixed"}, Case{4, true, "mixed"},
                                           Case{5, false, "mixed"}, Case{8, true, "mixed"}));

// Ranks whose buffers nobody can reach, in every position but the first: staged in the middle.
INSTANTIATE_TEST_SUITE_P(
    Staged, DirectPlanSim,
    ::testing::Values(
        Case{3, false, "mixed", {false, true, false}},
        Case{3, true, "each", {false, true, false}},
        Case{3, true, "later", {true, false, true}},
        Case{4, false, "mixed", {false, true, true, false}},
        Case{5, true, "mixed", {true, false, true, true, false}},
        Case{8, false, "mixed", {false, true, false, true, true, false, true, false}}));

// Every shape with the earlier ranks' pushes left to their push issuers, and the later ranks'
// too.
TEST_P(DirectPlanSim, DeferredPushesGatherCorrectly) {
  const Case c = GetParam();
  for (bool later_too : {false, true})
    for (uint64_t seed = 1; seed <= 30; ++seed) {
      Scenario s = scenario(c.nranks, c.in_place, c.modes, c.unreachable);
      s.deferred = true;
      s.deferred_later = later_too;
      ASSERT_EQ(run(s, seed), "") << "seed " << seed << (later_too ? ", later ranks too" : "");
    }
}

// Captured: every shape, a graph of three ops replayed four times.
TEST_P(DirectPlanSim, CapturedReplaysGatherCorrectly) {
  const Case c = GetParam();
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    Scenario s = scenario(c.nranks, c.in_place, c.modes, c.unreachable);
    s.captured = true;
    s.ops = 3;
    s.replays = 4;
    ASSERT_EQ(run(s, seed), "") << "seed " << seed;
  }
}

// The user's stream holds the op's start event and its wait for the end, nothing else: the push
// stream starts from that event and says ready itself (direct_plan.cc says why).
TEST(DirectPlan, TheUsersStreamOnlyRecordsTheStartAndWaitsForTheEnd) {
  for (bool captured : {false, true})
    for (const char* modes : {"mixed", "later", "each"}) {
      Scenario s = scenario(3, false, modes);
      s.captured = captured;
      s.order = [](int, std::mt19937&) { return std::vector<int>{0, 1, 2}; };
      Sim sim(s, 7);
      sim.build(0, [&](int rank, std::vector<DirectOp>* plan) {
        std::vector<std::pair<DirectOpKind, int>> user;
        const DirectOp* first_push = nullptr;
        for (const DirectOp& o : *plan) {
          if (o.stream == DirectStream::kUser) user.push_back({o.kind, o.event});
          if (o.stream == DirectStream::kPush && !first_push) first_push = &o;
        }
        const std::vector<std::pair<DirectOpKind, int>> want = {{DirectOpKind::kRecord, kEvStart},
                                                                {DirectOpKind::kWaitEvent, kEvEnd}};
        EXPECT_EQ(user, want) << modes << ", rank " << rank;
        ASSERT_NE(first_push, nullptr);
        EXPECT_EQ(first_push->kind, DirectOpKind::kWaitEvent);
        EXPECT_EQ(first_push->event, kEvStart);
      });
    }
}

TEST(DirectPlan, InPlaceCopiesNothingLocally) {
  for (bool in_place : {true, false}) {
    Scenario s = scenario(2, in_place, "each");
    Sim sim(s, 3);
    sim.build(0, [&](int, std::vector<DirectOp>* plan) {
      int local = 0;
      for (const DirectOp& o : *plan)
        local += o.stream == DirectStream::kLocal && o.kind == DirectOpKind::kCopy;
      EXPECT_EQ(local, in_place ? 0 : 1);
    });
  }
}

// Dropping any op of rank `victim`'s plan for op 1 of `s` that `guards` (given the plan and
// the op's index) is caught: every one of them guards something in some interleaving. Returns
// how many were dropped.
size_t expect_every_guard_matters(
    const Scenario& s, int victim, const std::string& label,
    const std::function<bool(const std::vector<DirectOp>&, size_t)>& guards) {
  std::vector<DirectOp> plan;
  Sim probe(s, 1);
  probe.build(1, [&](int rank, std::vector<DirectOp>* p) {
    if (rank == victim) plan = *p;
  });
  size_t dropped = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!guards(plan, i)) continue;
    ++dropped;
    bool caught = false;
    for (uint64_t seed = 1; seed <= 60 && !caught; ++seed)
      caught = !run(s, seed, [&](int k, int rank, std::vector<DirectOp>* p) {
                  if (k == 1 && rank == victim) p->erase(p->begin() + static_cast<long>(i));
                }).empty();
    EXPECT_TRUE(caught) << label << ", rank " << victim << " without op " << i;
  }
  return dropped;
}

// Whether plan[i] waits on a flag the same stream wrote earlier in the plan (a rank's read of
// its own ready, direct_plan.cc): it orders nothing, and dropping it cannot be caught.
bool waits_on_own_write(const std::vector<DirectOp>& plan, size_t i) {
  if (plan[i].kind != DirectOpKind::kWaitGeq) return false;
  for (size_t j = 0; j < i; ++j)
    if (plan[j].kind == DirectOpKind::kWrite && plan[j].stream == plan[i].stream &&
        plan[j].dst == plan[i].dst)
      return true;
  return false;
}

// An eager plan's flag waits and flag writes (its ready, on the push stream, and its done
// signals); returns how many were dropped.
size_t expect_every_wait_matters(const Scenario& s, int victim, const std::string& label) {
  return expect_every_guard_matters(
      s, victim, label, [](const std::vector<DirectOp>& plan, size_t i) {
        return (plan[i].kind == DirectOpKind::kWaitGeq || plan[i].kind == DirectOpKind::kWrite) &&
               !waits_on_own_write(plan, i);
      });
}

TEST(DirectPlan, DroppingAnyWaitOrDoneSignalIsCaught) {
  for (const char* modes : {"each", "later"})
    for (bool in_place : {false, true}) {
      Scenario s = scenario(2, in_place, modes);
      s.ops = 3;
      s.order = [](int, std::mt19937&) { return std::vector<int>{0, 1}; };
      for (int victim = 0; victim < 2; ++victim)
        expect_every_wait_matters(s, victim,
                                  std::string(modes) + (in_place ? " in place" : " out of place"));
    }
}

// With the earlier rank's pushes left to its push issuer: every wait and write of the issuer's
// plan matters, and where the pair settled "each pushes", every one of the ranks' plans too.
// (Where the later rank does both, the earlier one's wait for its issuer and its done signal
// guard nothing: its plan was built before the pair settled.)
TEST(DirectPlan, DroppingAnyWaitOrWriteOfADeferredPushIsCaught) {
  for (const char* modes : {"each", "later"})
    for (bool in_place : {false, true}) {
      Scenario s = scenario(2, in_place, modes);
      s.ops = 3;
      s.deferred = true;
      s.order = [](int, std::mt19937&) { return std::vector<int>{0, 1}; };
      const std::string label = std::string(modes) + (in_place ? " in place" : " out of place");
      if (std::string(modes) == "each")
        for (int victim = 0; victim < 2; ++victim) expect_every_wait_matters(s, victim, label);
      EXPECT_GT(expect_every_wait_matters(s, -1, label + ", rank 0's issuer"), 0u);
      if (std::string(modes) != "each") continue;
      s.deferred_later = true;  // rank 1's push to rank 0 is its issuer's too
      for (int victim = 0; victim < 2; ++victim)
        expect_every_wait_matters(s, victim, label + ", later pushes deferred");
      EXPECT_GT(expect_every_wait_matters(s, -2, label + ", rank 1's issuer"), 0u);
    }
}

// The same with rank 1 in the middle reached through its stage: its copies into and out of
// the stage are ordered by the same waits.
TEST(DirectPlan, DroppingAnyWaitAroundAStageIsCaught) {
  for (const char* modes : {"each", "later"})
    for (bool in_place : {false, true}) {
      Scenario s = scenario(3, in_place, modes, {false, true, false});
      s.ops = 3;
      s.order = [](int, std::mt19937&) { return std::vector<int>{0, 1, 2}; };
      for (int victim = 0; victim < 3; ++victim)
        expect_every_wait_matters(
            s, victim, std::string(modes) + (in_place ? " in place" : " out of place") + " staged");
    }
}

// A captured op's plan: dropping any wait on a word, any reset after one, or any done signal
// shows as wrong bytes or a deadlock in some replay.
TEST(DirectPlan, DroppingAnyCapturedWaitResetOrSignalIsCaught) {
  for (const char* modes : {"each", "later"})
    for (bool in_place : {false, true}) {
      Scenario s = scenario(2, in_place, modes);
      s.captured = true;
      s.ops = 2;
      s.replays = 3;
      s.order = [](int, std::mt19937&) { return std::vector<int>{0, 1}; };
      const std::string label = std::string(modes) + (in_place ? " in place" : " out of place");
      // Its waits on words, the reset after each, and its done signals (the writes of 1 on the
      // push stream once it waited for the pulls).
      auto guards = [](const std::vector<DirectOp>& plan, size_t i) {
        bool pulled = false;
        for (size_t j = 0; j < i; ++j)
          pulled |= plan[j].kind == DirectOpKind::kWaitEvent &&
                    plan[j].stream == DirectStream::kPush && plan[j].event == kEvPulled;
        const DirectOp& o = plan[i];
        return o.kind == DirectOpKind::kWaitSignal ||
               (o.kind == DirectOpKind::kWrite && (o.value == 0 || pulled));
      };
      for (int victim = 0; victim < 2; ++victim)
        EXPECT_GT(expect_every_guard_matters(s, victim, label, guards), 0u) << label;
    }
}

// An eager rank that writes its ready reads it back on the push stream first of its ready
// waits, before its first copy, then waits for the others' in the order it pushes to them,
// r-1, r-2, ... (mod n): direct_plan.cc says what that measured. A rank that writes none waits
// on no flag of its own.
TEST(DirectPlan, AnEagerRankReadsItsOwnReadyFirstThenThePeersItPushesToInOrder) {
  for (int n : {2, 3, 4})
    for (const char* modes : {"each", "later", "mixed"}) {
      Scenario s = scenario(n, true, modes);
      Sim sim(s, 5);
      int read_back = 0;
      sim.build(0, [&](int rank, std::vector<DirectOp>* plan) {
        const std::string where =
            std::string(modes) + ", " + std::to_string(n) + " ranks, rank " + std::to_string(rank);
        std::map<uint64_t, int> ready_rank;  // flag address -> the rank that says ready on it
        for (int p = 0; p < n; ++p) ready_rank[sim.ready_of(p, 0)] = p;
        int ready_write = -1, first_copy = -1;
        std::vector<int> steps;  // each ready wait's peer, as (rank - peer) mod n, in plan order
        for (int i = 0; i < static_cast<int>(plan->size()); ++i) {
          const DirectOp& o = (*plan)[static_cast<size_t>(i)];
          if (o.stream != DirectStream::kPush) continue;
          if (o.kind == DirectOpKind::kCopy && first_copy < 0) first_copy = i;
          if (o.kind == DirectOpKind::kWrite && o.dst == sim.ready_of(rank, 0)) {
            EXPECT_LT(first_copy, 0) << where;
            ready_write = i;
          }
          const auto it = ready_rank.find(o.dst);
          if (o.kind != DirectOpKind::kWaitGeq || it == ready_rank.end()) continue;
          EXPECT_LT(first_copy, 0) << where << ": a ready wait after a copy";
          if (it->second == rank) {
            EXPECT_GE(ready_write, 0) << where << ": its own ready read before it is written";
          }
          steps.push_back((rank - it->second + n) % n);
        }
        EXPECT_TRUE(std::is_sorted(steps.begin(), steps.end())) << where;
        EXPECT_EQ(std::adjacent_find(steps.begin(), steps.end()), steps.end()) << where;
        const bool own_first = !steps.empty() && steps.front() == 0;
        EXPECT_EQ(own_first, ready_write >= 0) << where;
        read_back += own_first;
      });
      EXPECT_GT(read_back, 0) << modes << ", " << n << " ranks";
    }
}

// Each rank's first copy goes to (comes from) a different peer: in the same peer order on every
// rank, every rank would write into one GPU at once while the others' links idle (measured on
// 4 H200s behind NVSwitch: the route's copies moved about 780 GB/s in all, whatever the GPU
// count, where a copy per GPU to distinct peers moves about 390 GB/s each).
TEST(DirectPlan, RanksStartTheirCopiesWithDifferentPeers) {
  for (int n : {3, 4, 8})
    for (const char* modes : {"each", "later"}) {
      Scenario s = scenario(n, true, modes);
      s.order = [n](int, std::mt19937&) {
        std::vector<int> o(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) o[static_cast<size_t>(r)] = r;
        return o;
      };
      // Per stream: the peer whose buffer each rank's first copy writes (push) or reads (pull).
      std::map<DirectStream, std::vector<int>> first_peer;
      Sim sim(s, 3);
      sim.build(0, [&](int rank, std::vector<DirectOp>* plan) {
        std::set<DirectStream> seen;
        for (const DirectOp& o : *plan) {
          if (o.kind != DirectOpKind::kCopy || o.stream == DirectStream::kLocal ||
              !seen.insert(o.stream).second)
            continue;
          // Every rank's buffers lie apart (Sim): the peer is the one whose range holds the
          // address written (push) or read (pull).
          const uint64_t addr = o.stream == DirectStream::kPush ? o.dst : o.src;
          const int peer = sim.owner_of(addr);
          EXPECT_NE(peer, rank);
          first_peer[o.stream].push_back(peer);
        }
      });
      for (const auto& [stream, peers] : first_peer) {
        const std::set<int> distinct(peers.begin(), peers.end());
        EXPECT_EQ(distinct.size(), peers.size())
            << n << " ranks, " << modes << ", stream " << static_cast<int>(stream);
      }
    }
}

TEST(DirectPlan, AStagedRankCopiesItsChunkInBeforeReadyAndThePeersChunksOutAfterDone) {
  // Order 0, 1, 2; rank 1 staged, in place, every later rank does both: rank 1 pushes to and
  // pulls from rank 0, and rank 2 reaches rank 1 through the stage only.
  Scenario s = scenario(3, true, "later", {false, true, false});
  s.order = [](int, std::mt19937&) { return std::vector<int>{0, 1, 2}; };
  Sim sim(s, 5);
  sim.build(0, [&](int rank, std::vector<DirectOp>* plan) {
    if (rank != 1) return;
    std::vector<int> push_copies;  // indexes of the copies on the push stream
    int ready = -1, last_done_wait = -1;
    for (int i = 0; i < static_cast<int>(plan->size()); ++i) {
      const DirectOp& o = (*plan)[static_cast<size_t>(i)];
      if (o.stream != DirectStream::kPush) continue;
      if (o.kind == DirectOpKind::kCopy) push_copies.push_back(i);
      if (o.kind == DirectOpKind::kWrite && ready < 0) ready = i;
      if (o.kind == DirectOpKind::kWaitGeq) last_done_wait = i;
    }
    ASSERT_EQ(push_copies.size(), 3u);  // into the stage, to rank 0, out of the stage
    EXPECT_LT(push_copies[0], ready);
    EXPECT_GT(push_copies[2], last_done_wait);
    EXPECT_EQ((*plan)[static_cast<size_t>(push_copies[0])].bytes, s.chunk);
    EXPECT_EQ((*plan)[static_cast<size_t>(push_copies[2])].bytes, s.chunk);
  });
}

// One thread's group over every rank (local_group_plan.h): the same plans with every pair
// pushing, every interleaving, every ring slot reused.
TEST(LocalGroupPlan, EveryInterleavingGathersCorrectly) {
  for (int n : {2, 3, 4, 8})
    for (bool in_place : {false, true}) {
      Scenario s = scenario(n, in_place, "each");
      s.local_group = true;
      for (uint64_t seed = 1; seed <= 30; ++seed)
        ASSERT_EQ(run(s, seed), "") << n << " ranks, in place " << in_place << ", seed " << seed;
    }
}

TEST(LocalGroupPlan, DroppingAnyWaitOrDoneSignalIsCaught) {
  for (bool in_place : {false, true}) {
    Scenario s = scenario(3, in_place, "each");
    s.local_group = true;
    s.ops = 3;
    // Each rank's ready write, its waits for both peers' ready, its two done writes and its
    // waits for both peers' done.
    for (int victim = 0; victim < 3; ++victim)
      EXPECT_EQ(
          expect_every_wait_matters(s, victim, in_place ? "local group, in place" : "local group"),
          7u);
  }
}

TEST(LocalGroupPlan, EveryRankPushesToEveryPeerAndCopiesOnlyItsOwnChunk) {
  for (bool in_place : {false, true}) {
    Scenario s = scenario(3, in_place, "each");
    s.local_group = true;
    Sim sim(s, 1);
    sim.build(0, [&](int rank, std::vector<DirectOp>* plan) {
      std::set<int> pushed_to;
      int local = 0;
      for (const DirectOp& o : *plan) {
        if (o.kind != DirectOpKind::kCopy) continue;
        EXPECT_EQ(o.src, sim.send_of(rank)) << "a rank copies only its own chunk";
        EXPECT_NE(o.stream, DirectStream::kUser) << "no copy on the application's stream";
        if (o.stream == DirectStream::kPush) pushed_to.insert(sim.owner_of(o.dst));
        local += o.stream == DirectStream::kLocal;
      }
      EXPECT_EQ(pushed_to.size(), 2u) << "rank " << rank;
      EXPECT_EQ(pushed_to.count(rank), 0u);
      EXPECT_EQ(local, in_place ? 0 : 1);
    });
  }
}

// A rank reached through a second mapping (local_aliases.h): the peers push into that; its
// own copy still goes to its receive buffer as its GPU addresses it.
TEST(LocalGroupPlan, PeersWriteThroughTheSecondMappingWhereThereIsOne) {
  LocalGroupView g;
  g.nranks = 2;
  g.chunk = 16;
  g.ranks[0] = {0x1000, 0x2000, 0};
  g.ranks[1] = {0x3000, 0x4000, 0x9000};
  auto copies_of = [&](int me) {
    DirectOpView v;
    local_group_rank_view(g, me, &v);
    std::vector<DirectOp> plan;
    build_direct_plan(v, &plan);
    std::vector<uint64_t> dst;
    for (const DirectOp& o : plan)
      if (o.kind == DirectOpKind::kCopy) dst.push_back(o.dst);
    return dst;
  };
  EXPECT_EQ(copies_of(0), (std::vector<uint64_t>{0x9000, 0x2000}));  // push, own chunk
  EXPECT_EQ(copies_of(1), (std::vector<uint64_t>{0x2000 + 16, 0x4000 + 16}));
}

}  // namespace
}  // namespace zc
