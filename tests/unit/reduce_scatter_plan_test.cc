// The reduce-scatter's plans (src/route/reduce_scatter_plan.h) run against each other on host
// memory, 2-8 ranks.
//
// Every rank has its three in-order streams and CUDA-like events (a wait applies to the latest
// record of that event enqueued before it); a seeded scheduler runs one stream operation at a
// time, streams picked at random (some slow in a run), so that many interleavings are tried.
// Around each op the application's own work sits on the user's stream: before it, writing this
// op's input; after it, checking the output and then scribbling over the input and the
// output, as an application that reuses its buffers would. The sum is an order-sensitive
// combination (acc * 3 + x per byte), so a plan that sums before a slice landed, pushes its
// input before it is there or after it was reused, overwrites a peer's scratch slot still
// being summed, sums in another order, or ends before its output is complete shows as wrong
// bytes; one that waits for a flag nobody writes shows as a deadlock. With scalars (a
// pre-multiplied sum of each rank's own scalar), every source's bytes are multiplied by its
// rank's scalar first: a scalar that did not reach a peer's head before its sum, or was
// overwritten by the next op's before that sum ran, shows as wrong bytes too.
//
// Eager ops number their slices across ops and count on the op exchange's flags. Captured ops
// (a CUDA graph of `ops` ops, replayed) are planned once, as at capture, with their tokens in
// real capture blocks (capture_blocks.h) placed as the host places them, by a random order of
// arrival per op; then the graph is replayed, each replay of each op with fresh inputs and, for
// a device-resident scalar, a fresh scalar (a host-immediate one is the capture's, every time).
// An abort is modelled as the host's: every token released, after which every stream must end.
#include "reduce_scatter_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "anon_region.h"
#include "capture_blocks.h"

namespace zc {
namespace {

uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// A stream's flag write is 32 bits (an eager flag, or a token's low half: the release in its
// high half stays); a token's wait reads all 64. Through memcpy: a flag is a uint32_t, a token
// a uint64_t.
uint32_t load32(uint64_t a) {
  uint32_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(a), sizeof v);
  return v;
}
void store32(uint64_t a, uint32_t v) { std::memcpy(reinterpret_cast<void*>(a), &v, sizeof v); }
uint64_t load64(uint64_t a) {
  uint64_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(a), sizeof v);
  return v;
}

// Rank r's input for a run of an op (every replay of every op has its own).
uint8_t input(int rank, int run, uint64_t i) {
  return static_cast<uint8_t>(rank * 71 + run * 29 + i * 13 + 5);
}

// The sum as the plan orders it (own chunk first, then me+1, me+2, ...), byte by byte.
uint8_t combine(uint8_t acc, uint8_t x) { return static_cast<uint8_t>(acc * 3 + x); }

// Rank r's scalar number n (odd: a product by it loses nothing mod 256): n is the op for a
// host-immediate scalar (baked into the plan), the run for a device-resident one.
uint8_t scalar(int rank, int n) { return static_cast<uint8_t>(rank * 38 + n * 22 + 3) | 1; }
uint8_t scaled(uint8_t x, uint8_t s) { return static_cast<uint8_t>(x * s); }

// Where the ranks' scalars come from: none (a sum), each rank's host-immediate one (written
// into its head by its push stream), a device-resident one the application writes before each
// run and reuses after it, or even ranks one way and odd ranks the other.
enum class Scalars { kNone, kHost, kDevice, kMixed };

struct SimOp {
  enum Kind { kPlan, kProduce, kConsume } kind = kPlan;
  RsOp op{};
  int rank = 0;
  int k = 0;    // the op: whose plan, whose host-immediate scalars
  int run = 0;  // which run of it (replay * ops + k): whose inputs, device-resident scalars
  uint64_t event_target = 0;  // kWaitEvent: records of op.event that must have run
};

struct Scenario {
  int nranks = 2;
  uint64_t chunk = 96;
  uint64_t slice = 32;
  bool in_place = false;
  int ops = 3;
  // Eager: the number of the first op's first slice; the flags start where earlier ops left
  // them.
  uint64_t first_slice = 0;
  Scalars scalars = Scalars::kNone;
  // Captured: the ops are one graph, replayed `replays` times (eager ops run once).
  bool captured = false;
  int replays = 1;
};

// What a run breaks: one operation left out of one rank's plan, a peer lost, the host's abort.
struct Faults {
  int victim = -1;     // the rank whose plan loses operation `drop`
  int victim_op = -1;  // of op victim_op's plan (-1: of every op's)
  size_t drop = 0;
  // After this fraction of the operations ran (< 0: never), rank `dead` runs nothing more (its
  // process died).
  double death_after = -1;
  int dead = -1;
  // The abort: every capture block's token released, after this fraction of the operations
  // ran or sooner where every stream is stuck (the host's wait for the op timed out); < 0:
  // never.
  double release_after = -1;
};

enum class Outcome { kDone, kWrongBytes, kDeadlock };
const char* name(Outcome o) {
  return o == Outcome::kDone ? "done" : o == Outcome::kWrongBytes ? "wrong bytes" : "deadlock";
}

class Sim {
 public:
  Sim(const Scenario& s, uint64_t seed) : s_(s), rng_(seed) {
    const size_t n = static_cast<size_t>(s.nranks);
    send_.assign(n, std::vector<uint8_t>(s.chunk * n, 0xEE));
    recv_.assign(n, std::vector<uint8_t>(s.chunk, 0xEE));
    // The eager region, then the captured one (rs_region_bytes).
    scratch_.assign(n, std::vector<uint8_t>(2 * rs_scratch_bytes(s.nranks, s.slice), 0xEE));
    landed_.assign(n * n, static_cast<uint32_t>(s.first_slice));
    freed_.assign(n, static_cast<uint32_t>(s.first_slice));
    device_scalar_.assign(n, 0xEE);
    streams_.assign(n * kRsStreams, {});
    records_.assign(n, std::vector<uint64_t>(kRsEvents, 0));
    enqueued_.assign(n, std::vector<uint64_t>(kRsEvents, 0));
    if (s.captured) claim_blocks();
    // Some streams are slow in a run (a busy copy engine, a descheduled rank): a uniform pick
    // seldom lets one stream fall far behind the others, which is where many a missing wait
    // shows (a sum before its own rank's input was written, with peers' pushes in between).
    std::bernoulli_distribution slow(kSlowChance);
    weight_.resize(n * kRsStreams);
    for (uint32_t& w : weight_) w = slow(rng_) ? 1 : kFastWeight;
  }

  uint64_t send_of(int r) { return addr(send_[r].data()); }
  bool scalar_on_device(int r) const {
    return s_.scalars == Scalars::kDevice || (s_.scalars == Scalars::kMixed && r % 2 == 1);
  }
  uint64_t recv_of(int r) {
    return s_.in_place ? send_of(r) + static_cast<uint64_t>(r) * s_.chunk : addr(recv_[r].data());
  }

  // What rank r's host knows of op k, as it builds the plan.
  RsOpView view(int r, int k) {
    RsOpView v;
    v.rank = r;
    v.nranks = s_.nranks;
    v.chunk = s_.chunk;
    v.slice = s_.slice;
    v.send = send_of(r);
    v.recv = recv_of(r);
    const uint64_t region = s_.captured ? rs_scratch_bytes(s_.nranks, s_.slice) : 0;
    v.scratch = addr(scratch_[r].data()) + region;
    for (int p = 0; p < s_.nranks; ++p) v.peer_scratch[p] = addr(scratch_[p].data()) + region;
    if (s_.captured)
      set_tokens(r, k, &v);
    else
      set_counters(r, k, &v);
    if (s_.scalars != Scalars::kNone) {
      v.scalar_bytes = 1;
      v.write_scalar = !scalar_on_device(r);
      v.scalar_bits = scalar(r, k);
      v.scalar_src = v.write_scalar ? rs_own_scalar_word(v.scratch) : addr(&device_scalar_[r]);
    }
    return v;
  }

  // Rank r's plan for op k.
  std::vector<RsOp> plan(int r, int k) {
    std::vector<RsOp> out;
    build_reduce_scatter_plan(view(r, k), &out);
    for (RsOp& o : out)  // the exec's part: which op's own host-immediate scalar the sum takes
      if (o.kind == RsOpKind::kSum) o.value = static_cast<uint32_t>(k);
    return out;
  }

  // Plans every op of every rank once, enqueues their runs (each rank's in its own order),
  // then runs them all.
  Outcome run(const Faults& f = {}) {
    std::vector<std::vector<RsOp>> plans;  // [r * ops + k]
    for (int r = 0; r < s_.nranks; ++r)
      for (int k = 0; k < s_.ops; ++k) {
        plans.push_back(plan(r, k));
        std::vector<RsOp>& p = plans.back();
        if (r == f.victim && (f.victim_op < 0 || f.victim_op == k) && f.drop < p.size())
          p.erase(p.begin() + static_cast<long>(f.drop));
      }
    for (int replay = 0; replay < s_.replays; ++replay)
      for (int k = 0; k < s_.ops; ++k)
        for (int r = 0; r < s_.nranks; ++r) {
          const int run = replay * s_.ops + k;
          enqueue(r, SimOp{SimOp::kProduce, RsOp{}, r, k, run, 0}, RsStream::kUser);
          for (const RsOp& o : plans[static_cast<size_t>(r * s_.ops + k)])
            enqueue(r, SimOp{SimOp::kPlan, o, r, k, run, 0}, o.stream);
          enqueue(r, SimOp{SimOp::kConsume, RsOp{}, r, k, run, 0}, RsStream::kUser);
        }
    return schedule(f);
  }

 private:
  // Each rank claims a block for each op; the op's arrival order (random) decides, for each
  // pair of ranks, in whose block its tokens are.
  void claim_blocks() {
    const uint32_t n = static_cast<uint32_t>(s_.nranks);
    region_ = std::make_unique<AnonRegion<CaptureBlocks>>(n);
    blocks_ = std::make_unique<CaptureBlocks>(region_->base, n);
    refs_.resize(static_cast<size_t>(s_.ops) * n);
    arrival_.resize(refs_.size());
    std::vector<int> order(n);
    for (int k = 0; k < s_.ops; ++k) {
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng_);
      for (uint32_t i = 0; i < n; ++i) arrival_[k * n + order[i]] = static_cast<int>(i);
      for (uint32_t r = 0; r < n; ++r)
        if (!blocks_->claim(r, &refs_[k * n + r])) throw std::runtime_error("no capture block");
    }
  }

  // As the host's set_tokens (ce_reduce_scatter.cc): a pair's tokens are in the block of the
  // one of the two that arrived first.
  void set_tokens(int r, int k, RsOpView* v) {
    using T = CaptureBlocks::TokenOf;
    const size_t at = static_cast<size_t>(k * s_.nranks);
    const uint32_t me = static_cast<uint32_t>(r);
    const CaptureRef mine = refs_[at + me];
    v->captured = true;
    v->started = addr(blocks_->started(me, mine));
    for (uint32_t p = 0; p < static_cast<uint32_t>(s_.nranks); ++p) {
      if (p == me) continue;
      const bool earlier = arrival_[at + p] < arrival_[at + me];
      const CaptureRef theirs = refs_[at + p];
      for (int b = 0; b < kRsBuffers; ++b) {
        v->token_in[p][b] = addr(earlier ? blocks_->rs_token(p, theirs, me, T::kPeersBuffer, b)
                                         : blocks_->rs_token(me, mine, p, T::kOwnersBuffer, b));
        v->token_out[p][b] = addr(earlier ? blocks_->rs_token(p, theirs, me, T::kOwnersBuffer, b)
                                          : blocks_->rs_token(me, mine, p, T::kPeersBuffer, b));
      }
    }
  }

  // Slices numbered across ops, from where a communicator's earlier ops left them.
  void set_counters(int r, int k, RsOpView* v) {
    v->first_slice = s_.first_slice + static_cast<uint64_t>(k) * rs_slices(s_.chunk, s_.slice);
    for (int p = 0; p < s_.nranks; ++p) {
      v->landed_in[p] = addr(&landed_[r * s_.nranks + p]);
      v->landed_out[p] = addr(&landed_[p * s_.nranks + r]);
      v->freed[p] = addr(&freed_[p]);
    }
  }

  void enqueue(int r, SimOp o, RsStream s) {
    if (o.kind == SimOp::kPlan && o.op.kind == RsOpKind::kRecord) ++enqueued_[r][o.op.event];
    if (o.kind == SimOp::kPlan && o.op.kind == RsOpKind::kWaitEvent)
      o.event_target = enqueued_[r][o.op.event];
    streams_[r * kRsStreams + static_cast<int>(s)].ops.push_back(o);
    ++queued_;
  }

  Outcome schedule(const Faults& f) {
    auto step_of = [this](double fraction) {
      return fraction < 0 ? ~uint64_t{0} : static_cast<uint64_t>(fraction * queued_);
    };
    const uint64_t death_at = step_of(f.death_after), release_at = step_of(f.release_after);
    bool released = false;
    for (uint64_t step = 0;; ++step) {
      if (step == death_at)
        for (int st = 0; st < kRsStreams; ++st) streams_[f.dead * kRsStreams + st].ops.clear();
      bool pending = collect_runnable();
      const bool stuck = pending && runnable_.empty();
      if (f.release_after >= 0 && !released && (step >= release_at || stuck)) {
        blocks_->release_all();  // as the host's abort does (capture_blocks.h)
        released = true;
        pending = collect_runnable();
      }
      if (!pending) return wrong_ == 0 ? Outcome::kDone : Outcome::kWrongBytes;
      if (runnable_.empty()) return Outcome::kDeadlock;
      const SimOp& o = streams_[pick()].pop();
      execute(o.rank, o);
    }
  }

  // The streams whose next operation can run, into runnable_; false when every stream is empty.
  bool collect_runnable() {
    runnable_.clear();
    weight_sum_ = 0;
    bool pending = false;
    for (size_t i = 0; i < streams_.size(); ++i) {
      const SimOp* next = streams_[i].next();
      if (!next) continue;
      pending = true;
      if (!can_run(*next)) continue;
      runnable_.push_back(i);
      weight_sum_ += weight_[i];
    }
    return pending;
  }

  // A runnable stream, by weight.
  size_t pick() {
    uint32_t at = std::uniform_int_distribution<uint32_t>(0, weight_sum_ - 1)(rng_);
    for (size_t i : runnable_) {
      if (at < weight_[i]) return i;
      at -= weight_[i];
    }
    return runnable_.back();
  }

  bool can_run(const SimOp& o) const {
    if (o.kind != SimOp::kPlan) return true;
    switch (o.op.kind) {
      case RsOpKind::kWaitGeq:
        return static_cast<int32_t>(load32(o.op.dst) - o.op.value) >= 0;
      case RsOpKind::kWaitEvent:
        return records_[o.rank][o.op.event] >= o.event_target;
      case RsOpKind::kWaitToken:
        return (load64(o.op.dst) & (CaptureBlocks::kReleaseBit | o.op.value)) != 0;
      default:
        return true;
    }
  }

  void execute(int r, const SimOp& o) {
    if (o.kind == SimOp::kProduce) return produce(r, o);
    if (o.kind == SimOp::kConsume) return consume(r, o);
    const RsOp& p = o.op;
    switch (p.kind) {
      case RsOpKind::kWrite:
        store32(p.dst, p.value);
        break;
      case RsOpKind::kCopy:
        std::copy_n(reinterpret_cast<const uint8_t*>(p.src), p.bytes,
                    reinterpret_cast<uint8_t*>(p.dst));
        break;
      case RsOpKind::kSum:
        sum(r, p);
        break;
      case RsOpKind::kRecord:
        ++records_[r][p.event];
        break;
      case RsOpKind::kWaitGeq:
      case RsOpKind::kWaitEvent:
      case RsOpKind::kWaitToken:
        break;
    }
  }

  void produce(int r, const SimOp& o) {
    for (uint64_t i = 0; i < send_[r].size(); ++i) send_[r][i] = input(r, o.run, i);
    device_scalar_[r] = scalar(r, o.run);
  }

  // Rank q's own scalar in op k's run: the plan's, or what the application wrote for the run.
  uint8_t own_scalar(int q, int k, int run) const {
    return scalar_on_device(q) ? scalar(q, run) : scalar(q, k);
  }

  void consume(int r, const SimOp& o) {
    const uint64_t n = static_cast<uint64_t>(s_.nranks), c = s_.chunk;
    uint8_t* recv = reinterpret_cast<uint8_t*>(recv_of(r));
    for (uint64_t i = 0; i < c; ++i) {
      auto in = [&](uint64_t j) {
        const int q = static_cast<int>((r + j) % n);
        const uint8_t x = input(q, o.run, r * c + i);
        return s_.scalars == Scalars::kNone ? x : scaled(x, own_scalar(q, o.k, o.run));
      };
      uint8_t want = in(0);
      for (uint64_t j = 1; j < n; ++j) want = combine(want, in(j));
      wrong_ += recv[i] != want;
    }
    // The application reuses its buffers (and its scalar) at once.
    std::fill(send_[r].begin(), send_[r].end(), 0xA5);
    std::fill(recv, recv + c, 0x5A);
    device_scalar_[r] = 0x77;
  }

  void sum(int r, const RsOp& p) {
    // Source k's scalar: mine as the exec passes it (its value, or where it lives), the peers'
    // from my head, where the plan says.
    uint8_t sc[kRsMaxRanks] = {};
    if (p.scalars != 0) {
      sc[0] = scalar_on_device(r) ? device_scalar_[r] : scalar(r, static_cast<int>(p.value));
      for (int k = 1; k < p.nsrc; ++k)
        sc[k] = *reinterpret_cast<const uint8_t*>(p.scalars + (k - 1) * kRsScalarWordBytes);
    }
    auto in = [&](int k, uint64_t i) {
      const uint8_t x = k == 0 ? reinterpret_cast<const uint8_t*>(p.src)[i]
                               : reinterpret_cast<const uint8_t*>(p.aux + (k - 1) * p.stride)[i];
      return p.scalars != 0 ? scaled(x, sc[k]) : x;
    };
    for (uint64_t i = 0; i < p.bytes; ++i) {
      uint8_t acc = in(0, i);
      for (int k = 1; k < p.nsrc; ++k) acc = combine(acc, in(k, i));
      reinterpret_cast<uint8_t*>(p.dst)[i] = acc;
    }
  }

  Scenario s_;
  std::mt19937 rng_;
  std::vector<std::vector<uint8_t>> send_, recv_, scratch_;
  std::vector<uint32_t> landed_, freed_;
  std::vector<uint8_t> device_scalar_;  // each rank's device-resident scalar
  // Captured: the capture blocks, each rank's block for op k at refs_[k * n + r], and the
  // rank's place in op k's order of arrival at arrival_[k * n + r].
  std::unique_ptr<AnonRegion<CaptureBlocks>> region_;
  std::unique_ptr<CaptureBlocks> blocks_;
  std::vector<CaptureRef> refs_;
  std::vector<int> arrival_;
  // A stream: its operations, and how many of them ran (a queue that the scheduler, which
  // looks at every stream's next operation at every step, reads cheaply).
  struct Stream {
    std::vector<SimOp> ops;
    size_t ran = 0;
    const SimOp* next() const { return ran < ops.size() ? ops.data() + ran : nullptr; }
    const SimOp& pop() { return ops[ran++]; }
  };
  std::vector<Stream> streams_;  // rank r's stream st at [r * kRsStreams + st]
  std::vector<std::vector<uint64_t>> records_, enqueued_;
  // The scheduler's: each stream's weight, the runnable ones and their weights' sum (kept to
  // spare allocations).
  static constexpr double kSlowChance = 0.25;
  static constexpr uint32_t kFastWeight = 32;  // a slow stream's is 1
  std::vector<uint32_t> weight_;
  std::vector<size_t> runnable_;
  uint32_t weight_sum_ = 0;
  uint64_t queued_ = 0;
  uint64_t wrong_ = 0;
};

std::string label(const Scenario& s) {
  return std::to_string(s.nranks) + " ranks, chunk " + std::to_string(s.chunk) + ", slice " +
         std::to_string(s.slice) + (s.in_place ? ", in place" : ", out of place") + ", scalars " +
         std::to_string(static_cast<int>(s.scalars)) + (s.captured ? ", captured" : ", eager");
}

// Interleavings tried for each scenario: eager, of three ops; captured, of two ops replayed
// three times, fewer, and the fewer the more ranks (a run is twice the work, and grows with the
// ranks: CI runs these under ThreadSanitizer too, where 8 ranks' runs take the most).
constexpr uint64_t kEagerSeeds = 20;
constexpr uint64_t kCapturedSeedsTimesRanks = 32;  // 16 seeds on 2 ranks, 4 on 8
uint64_t captured_seeds(int nranks) {
  return kCapturedSeedsTimesRanks / static_cast<uint64_t>(nranks);
}
// Interleavings tried for each dropped operation before it counts as unnoticed (the slowest
// catch takes about a dozen).
constexpr uint64_t kDropSeeds = 300;

// Every reduction, in and out of place, chunks of one to four slices (one buffer, both, and
// both reused).
void expect_every_interleaving_sums(Scenario s) {
  for (Scalars scalars : {Scalars::kNone, Scalars::kHost, Scalars::kDevice, Scalars::kMixed})
    for (bool in_place : {false, true})
      for (uint64_t chunk : {uint64_t{32}, uint64_t{96}, uint64_t{100}})
        for (uint64_t slice : {uint64_t{32}, uint64_t{64}, uint64_t{128}}) {
          s.chunk = chunk;
          s.slice = slice;
          s.in_place = in_place;
          s.scalars = scalars;
          const uint64_t seeds = s.captured ? captured_seeds(s.nranks) : kEagerSeeds;
          for (uint64_t seed = 0; seed < seeds; ++seed) {
            // Half the eager runs where the flags' 32-bit counters wrap during the ops.
            if (!s.captured) s.first_slice = seed % 2 ? uint64_t{0xFFFFFFFF} - 3 : 0;
            const Outcome o = Sim(s, seed).run();
            ASSERT_EQ(o, Outcome::kDone) << label(s) << ", seed " << seed << ": " << name(o);
          }
        }
}

std::string rank_name(const ::testing::TestParamInfo<int>& i) {
  return std::to_string(i.param) + "ranks";
}

class ReduceScatterSim : public ::testing::TestWithParam<int> {};

TEST_P(ReduceScatterSim, EveryInterleavingSumsCorrectly) {
  Scenario s;
  s.nranks = GetParam();
  expect_every_interleaving_sums(s);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ReduceScatterSim, ::testing::Values(2, 3, 4, 8), rank_name);

// Captured: a graph of two ops (each op's buffers reused by the next in the same replay),
// replayed three times (the tokens' states carried from one replay into the next).
constexpr int kGraphOps = 2;
constexpr int kReplays = 3;
// Points of a run where the abort tests stop a peer or release the tokens.
constexpr uint64_t kAbortPoints = 30;

Scenario captured(int nranks) {
  Scenario s;
  s.nranks = nranks;
  s.ops = kGraphOps;
  s.captured = true;
  s.replays = kReplays;
  return s;
}

class CapturedReduceScatterSim : public ::testing::TestWithParam<int> {};

TEST_P(CapturedReduceScatterSim, EveryInterleavingSumsCorrectly) {
  expect_every_interleaving_sums(captured(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Ranks, CapturedReduceScatterSim, ::testing::Values(2, 3, 4, 8), rank_name);

// Leaving out any one wait, flag write or event operation of rank 0's plan for op `victim_op`
// (-1: for every op) that `excused` does not excuse shows as wrong bytes or a deadlock in some
// interleaving, 2 and 3 ranks, four slices (both buffers reused).
template <typename Excused>
void expect_every_drop_caught(Scenario s, int victim_op, Excused excused) {
  for (Scalars scalars : {Scalars::kNone, Scalars::kMixed})
    for (int nranks : {2, 3})
      for (bool in_place : {false, true}) {
        s.nranks = nranks;
        s.chunk = 100;
        s.slice = 32;
        s.in_place = in_place;
        s.scalars = scalars;
        Sim probe(s, 0);
        const RsOpView view = probe.view(0, 0);
        const std::vector<RsOp> plan = probe.plan(0, 0);
        for (size_t drop = 0; drop < plan.size(); ++drop) {
          const RsOpKind k = plan[drop].kind;
          if (k == RsOpKind::kCopy || k == RsOpKind::kSum || excused(view, plan, drop)) continue;
          Faults f;
          f.victim = 0;
          f.victim_op = victim_op;
          f.drop = drop;
          bool caught = false;
          for (uint64_t seed = 0; seed < kDropSeeds && !caught; ++seed)
            caught = Sim(s, seed).run(f) != Outcome::kDone;
          EXPECT_TRUE(caught) << label(s) << ": dropping op " << drop << " (kind "
                              << static_cast<int>(k) << ", stream "
                              << static_cast<int>(plan[drop].stream) << ") went unnoticed";
        }
      }
}

// Eager: none of them is there for nothing. Except a flag write that a later write of the same
// flag on the same stream supersedes (the flags are counters): it is there so that a slice's
// sum starts as soon as it landed, and a buffer is pushed into as soon as it is free — without
// it the op is slower, not wrong.
TEST(ReduceScatterPlan, DroppingAnyWaitWriteOrRecordIsCaught) {
  expect_every_drop_caught(
      Scenario{}, -1, [](const RsOpView&, const std::vector<RsOp>& plan, size_t drop) {
        const RsOp& d = plan[drop];
        return d.kind == RsOpKind::kWrite &&
               std::any_of(
                   plan.begin() + static_cast<long>(drop) + 1, plan.end(), [&](const RsOp& o) {
                     return o.kind == RsOpKind::kWrite && o.dst == d.dst && o.stream == d.stream;
                   });
      });
}

// Captured, dropped from op 0's plan, so from each of its replays: no token write is
// superseded (each is awaited by the peer before the next), so none is excused. Except the
// started write: no stream waits for it; the host reads it (captured_ops.cc) to tell an orphaned
// op that replayed from one that never did, which nothing in these runs can show.
TEST(CapturedReduceScatterPlan, DroppingAnyWaitWriteOrRecordIsCaught) {
  expect_every_drop_caught(
      captured(2), 0, [](const RsOpView& v, const std::vector<RsOp>& plan, size_t drop) {
        return plan[drop].kind == RsOpKind::kWrite && plan[drop].dst == v.started;
      });
}

// The abort mid-run: wherever each rank's op stood, once every token is released each stream
// of each rank runs to its end (its bytes need not be right), through later replays too (a
// token's 32-bit writes leave its release in place).
TEST(CapturedReduceScatterPlan, ReleasedTokensLetEveryStreamEnd) {
  for (int nranks : {2, 3, 4})
    for (uint64_t seed = 0; seed < kAbortPoints; ++seed) {
      Scenario s = captured(nranks);
      s.chunk = 100;  // four slices
      Faults f;
      f.release_after = static_cast<double>(seed) / kAbortPoints;
      const Outcome o = Sim(s, seed).run(f);
      EXPECT_NE(o, Outcome::kDeadlock) << label(s) << ", seed " << seed;
    }
}

// A peer that stops (its process died) hangs the others on their tokens; the release of the
// abort that follows lets them end, wherever the peer stopped.
TEST(CapturedReduceScatterPlan, ADeadPeerHangsTheOthersUntilTheRelease) {
  for (int nranks : {2, 3, 4}) {
    Scenario s = captured(nranks);
    s.chunk = 100;
    Faults f;
    f.dead = nranks - 1;
    f.death_after = 0;
    EXPECT_EQ(Sim(s, 0).run(f), Outcome::kDeadlock) << label(s);
    f.release_after = 1;  // once the others are stuck
    for (uint64_t seed = 0; seed < kAbortPoints; ++seed) {
      f.death_after = static_cast<double>(seed) / kAbortPoints;
      EXPECT_NE(Sim(s, seed).run(f), Outcome::kDeadlock) << label(s) << ", seed " << seed;
    }
  }
}

// A broken op (a peer's graph is gone) pushes, sums and awaits nothing: it keeps its place in
// the order of its rank's ops (the same events as a whole op) and marks itself started, once.
TEST(CapturedReduceScatterPlan, ABrokenOpOnlyOrdersItselfAndMarksItsStart) {
  for (int nranks : {2, 3, 8}) {
    Scenario s = captured(nranks);
    s.chunk = 100;
    s.scalars = Scalars::kHost;
    Sim sim(s, 0);
    RsOpView v = sim.view(0, 0);
    std::vector<RsOp> whole, broken;
    build_reduce_scatter_plan(v, &whole);
    v.broken = true;
    build_reduce_scatter_plan(v, &broken);
    auto events = [](const std::vector<RsOp>& plan) {
      std::vector<std::pair<RsOpKind, int>> out;
      for (const RsOp& o : plan)
        if (o.kind == RsOpKind::kRecord || o.kind == RsOpKind::kWaitEvent)
          out.emplace_back(o.kind, o.event * kRsStreams + static_cast<int>(o.stream));
      return out;
    };
    EXPECT_EQ(events(broken), events(whole)) << nranks;
    const auto started = [&](const RsOp& o) {
      return o.kind == RsOpKind::kWrite && o.dst == v.started && o.stream == RsStream::kPush;
    };
    EXPECT_EQ(std::count_if(broken.begin(), broken.end(), started), 1) << nranks;
    EXPECT_EQ(broken.size(), events(broken).size() + 1) << nranks;  // nothing else
    EXPECT_GT(whole.size(), events(whole).size() + 1) << nranks;
  }
}

TEST(RsRegion, HalfTheSettingOrTwoLargestSlicesOfEveryPeer) {
  const uint64_t kMiB = uint64_t{1} << 20;
  // Two ranks need only the head and two 16 MiB slices of their one peer.
  EXPECT_EQ(rs_region_bytes(2, 128 * kMiB), kRsHeadBytes + 2 * 16 * kMiB);
  EXPECT_EQ(rs_region_bytes(2, 128 * kMiB), rs_scratch_bytes(2, 16 * kMiB));
  EXPECT_EQ(rs_region_bytes(3, 128 * kMiB), 64 * kMiB);
  EXPECT_EQ(rs_region_bytes(8, 128 * kMiB), 64 * kMiB);
  EXPECT_EQ(rs_region_bytes(2, kMiB), kMiB / 2);
  EXPECT_EQ(rs_region_bytes(8, kMiB), kMiB / 2);
  EXPECT_EQ(rs_region_bytes(1, 128 * kMiB), 0u);  // nobody to push to
  // The largest slice fits the region: a 64 MiB chunk on 2 ranks goes in four of 16 MiB.
  EXPECT_EQ(rs_slice_bytes(64 * kMiB, 2, 2, rs_region_bytes(2, 128 * kMiB)), 16 * kMiB);
}
TEST(ReduceScatterPlan, SlicesAreWholeAlignedElementsFitTheScratchAndCoverTheChunk) {
  const uint64_t kMiB = uint64_t{1} << 20;
  for (int nranks : {2, 3, 8})
    for (uint64_t scratch : {4 * kMiB, 64 * kMiB, 1024 * kMiB})
      for (uint64_t elem : {uint64_t{2}, uint64_t{4}})
        for (uint64_t chunk :
             {uint64_t{2}, uint64_t{1000}, 64 * kMiB, uint64_t{1} << 30, (uint64_t{5} << 30) + 6}) {
          const uint64_t slice = rs_slice_bytes(chunk, elem, nranks, scratch);
          ASSERT_GT(slice, 0u);
          EXPECT_EQ(slice % 256, 0u) << chunk;
          EXPECT_EQ(slice % elem, 0u) << chunk;
          EXPECT_LE(rs_scratch_bytes(nranks, slice), scratch) << chunk;
          EXPECT_LE(slice, 16 * kMiB) << chunk;
          EXPECT_GE(slice * rs_slices(chunk, slice), chunk) << chunk;
          EXPECT_LT(slice * (rs_slices(chunk, slice) - 1), chunk) << chunk;  // no empty slice
        }
  EXPECT_EQ(rs_slice_bytes(16 * kMiB, 4, 2, 64 * kMiB), 16 * kMiB);  // one slice
  EXPECT_EQ(rs_slice_bytes(64 * kMiB, 2, 2, 64 * kMiB), 16 * kMiB);  // four
  // 8 ranks: 14 slots of at most (64 MiB - the head) / 14, 256-aligned (4793088 B), so 15
  // even slices.
  EXPECT_EQ(rs_slice_bytes(64 * kMiB, 4, 8, 64 * kMiB), uint64_t{4474112});
  // A tiny scratch: 1280 B = the 256 B head and two slots of 512; 1279 B: of 256.
  EXPECT_EQ(rs_slice_bytes(64 * kMiB, 4, 2, 1280), 512u);
  EXPECT_EQ(rs_slice_bytes(64 * kMiB, 4, 2, 1279), 256u);
  EXPECT_EQ(rs_slice_bytes(64 * kMiB, 4, 2, 767), 0u);  // not one aligned slot after the head
  EXPECT_EQ(rs_scratch_bytes(4, 1024), kRsHeadBytes + uint64_t{2} * 3 * 1024);
}

}  // namespace
}  // namespace zc
