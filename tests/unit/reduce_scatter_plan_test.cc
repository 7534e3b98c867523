// The reduce-scatter's plans (src/route/reduce_scatter_plan.h) run against each other on host
// memory, 2-8 ranks.
//
// Every rank has its three in-order streams and CUDA-like events (a wait applies to the latest
// record of that event enqueued before it); a seeded scheduler runs one stream operation at a
// time, streams picked at random, so that many interleavings are tried. Around each op the
// application's own work sits on the user's stream: before it, writing this op's input; after
// it, checking the output and then scribbling over the input and the output, as an application
// that reuses its buffers would. The sum is an order-sensitive combination (acc * 3 + x per
// byte), so a plan that sums before a slice landed, pushes its input before it is there or
// after it was reused, overwrites a peer's scratch slot still being summed, sums in another
// order, or ends before its output is complete shows as wrong bytes; one that waits for a flag
// nobody writes shows as a deadlock. With scalars (a pre-multiplied sum of each rank's own
// scalar, new for every op), every source's bytes are multiplied by its rank's scalar first:
// a scalar that did not reach a peer's head before its sum, or was overwritten by the next op's
// before that sum ran, shows as wrong bytes too.
#include "reduce_scatter_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace zc {
namespace {

uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

uint8_t input(int rank, int op, uint64_t i) {
  return static_cast<uint8_t>(rank * 71 + op * 29 + i * 13 + 5);
}

// The sum as the plan orders it (own chunk first, then me+1, me+2, ...), byte by byte.
uint8_t combine(uint8_t acc, uint8_t x) { return static_cast<uint8_t>(acc * 3 + x); }

// Rank r's scalar for op k (odd: a product by it loses nothing mod 256).
uint8_t scalar(int rank, int op) { return static_cast<uint8_t>(rank * 38 + op * 22 + 3) | 1; }
uint8_t scaled(uint8_t x, uint8_t s) { return static_cast<uint8_t>(x * s); }

// Where the ranks' scalars come from: none (a sum), each rank's host-immediate one (written
// into its head by its push stream), a device-resident one the application writes before each
// op and reuses after it, or even ranks one way and odd ranks the other.
enum class Scalars { kNone, kHost, kDevice, kMixed };

struct SimOp {
  enum Kind { kPlan, kProduce, kConsume } kind = kPlan;
  RsOp op{};
  int opnum = 0;
  uint64_t event_target = 0;  // kWaitEvent: records of op.event that must have run
};

struct Scenario {
  int nranks = 2;
  uint64_t chunk = 96;
  uint64_t slice = 32;
  bool in_place = false;
  int ops = 3;
  // The number of the first op's first slice; the flags start where earlier ops left them.
  uint64_t first_slice = 0;
  Scalars scalars = Scalars::kNone;
};

class Sim {
 public:
  Sim(const Scenario& s, uint64_t seed) : s_(s), rng_(seed) {
    const size_t n = static_cast<size_t>(s.nranks);
    send_.assign(n, std::vector<uint8_t>(s.chunk * n, 0xEE));
    recv_.assign(n, std::vector<uint8_t>(s.chunk, 0xEE));
    scratch_.assign(n, std::vector<uint8_t>(rs_scratch_bytes(s.nranks, s.slice), 0xEE));
    landed_.assign(n * n, static_cast<uint32_t>(s.first_slice));
    freed_.assign(n, static_cast<uint32_t>(s.first_slice));
    device_scalar_.assign(n, 0xEE);
    streams_.assign(n, std::vector<std::deque<SimOp>>(kRsStreams));
    records_.assign(n, std::vector<uint64_t>(kRsEvents, 0));
    enqueued_.assign(n, std::vector<uint64_t>(kRsEvents, 0));
  }

  uint64_t send_of(int r) { return addr(send_[r].data()); }
  bool scalar_on_device(int r) const {
    return s_.scalars == Scalars::kDevice || (s_.scalars == Scalars::kMixed && r % 2 == 1);
  }
  uint64_t recv_of(int r) {
    return s_.in_place ? send_of(r) + static_cast<uint64_t>(r) * s_.chunk : addr(recv_[r].data());
  }

  // Rank r's plan for op k, with `mutate` applied (the tests drop one operation).
  std::vector<RsOp> plan(int r, int k) {
    RsOpView v;
    v.rank = r;
    v.nranks = s_.nranks;
    // Slices numbered across ops, from where a communicator's earlier ops left them.
    v.first_slice = s_.first_slice + static_cast<uint64_t>(k) * rs_slices(s_.chunk, s_.slice);
    v.chunk = s_.chunk;
    v.slice = s_.slice;
    v.send = send_of(r);
    v.recv = recv_of(r);
    v.scratch = addr(scratch_[r].data());
    for (int p = 0; p < s_.nranks; ++p) {
      v.peer_scratch[p] = addr(scratch_[p].data());
      v.landed_in[p] = addr(&landed_[r * s_.nranks + p]);
      v.landed_out[p] = addr(&landed_[p * s_.nranks + r]);
      v.freed[p] = addr(&freed_[p]);
    }
    if (s_.scalars != Scalars::kNone) {
      v.scalar_bytes = 1;
      v.write_scalar = !scalar_on_device(r);
      v.scalar_bits = scalar(r, k);
      v.scalar_src = v.write_scalar ? rs_own_scalar_word(v.scratch) : addr(&device_scalar_[r]);
    }
    std::vector<RsOp> out;
    build_reduce_scatter_plan(v, &out);
    for (RsOp& o : out)  // the exec's part: which op's own scalar the sum takes
      if (o.kind == RsOpKind::kSum) o.value = static_cast<uint32_t>(k);
    return out;
  }

  // Enqueues every op of every rank (each rank's ops in its own order), then runs; false with
  // *why on wrong bytes or a deadlock. Plan op `drop` of rank `victim` is left out of every op.
  bool run(int victim, size_t drop, std::string* why) {
    for (int k = 0; k < s_.ops; ++k)
      for (int r = 0; r < s_.nranks; ++r) {
        enqueue(r, SimOp{SimOp::kProduce, RsOp{}, k, 0}, RsStream::kUser);
        std::vector<RsOp> p = plan(r, k);
        if (r == victim && drop < p.size()) p.erase(p.begin() + static_cast<long>(drop));
        for (const RsOp& o : p) enqueue(r, SimOp{SimOp::kPlan, o, k, 0}, o.stream);
        enqueue(r, SimOp{SimOp::kConsume, RsOp{}, k, 0}, RsStream::kUser);
      }
    for (;;) {
      std::vector<std::pair<int, int>> runnable, pending;
      for (int r = 0; r < s_.nranks; ++r)
        for (int st = 0; st < kRsStreams; ++st) {
          if (streams_[r][st].empty()) continue;
          pending.emplace_back(r, st);
          if (can_run(r, streams_[r][st].front())) runnable.emplace_back(r, st);
        }
      if (pending.empty()) return wrong_ == 0 || (*why = "wrong bytes", false);
      if (runnable.empty()) {
        *why = "deadlock";
        return false;
      }
      const auto [r, st] =
          runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng_)];
      SimOp o = streams_[r][st].front();
      streams_[r][st].pop_front();
      execute(r, o);
    }
  }

 private:
  void enqueue(int r, SimOp o, RsStream s) {
    if (o.kind == SimOp::kPlan && o.op.kind == RsOpKind::kRecord) ++enqueued_[r][o.op.event];
    if (o.kind == SimOp::kPlan && o.op.kind == RsOpKind::kWaitEvent)
      o.event_target = enqueued_[r][o.op.event];
    streams_[r][static_cast<int>(s)].push_back(o);
  }

  static uint32_t& flag(uint64_t a) { return *reinterpret_cast<uint32_t*>(a); }

  bool can_run(int r, const SimOp& o) const {
    if (o.kind != SimOp::kPlan) return true;
    if (o.op.kind == RsOpKind::kWaitGeq)
      return static_cast<int32_t>(flag(o.op.dst) - o.op.value) >= 0;
    if (o.op.kind == RsOpKind::kWaitEvent) return records_[r][o.op.event] >= o.event_target;
    return true;
  }

  void execute(int r, const SimOp& o) {
    const uint64_t n = static_cast<uint64_t>(s_.nranks), c = s_.chunk;
    uint8_t* send = send_[r].data();
    uint8_t* recv = reinterpret_cast<uint8_t*>(recv_of(r));
    switch (o.kind) {
      case SimOp::kProduce:
        for (uint64_t i = 0; i < n * c; ++i) send[i] = input(r, o.opnum, i);
        device_scalar_[r] = scalar(r, o.opnum);
        return;
      case SimOp::kConsume:
        for (uint64_t i = 0; i < c; ++i) {
          auto in = [&](uint64_t j) {
            const int q = static_cast<int>((r + j) % n);
            const uint8_t x = input(q, o.opnum, r * c + i);
            return s_.scalars == Scalars::kNone ? x : scaled(x, scalar(q, o.opnum));
          };
          uint8_t want = in(0);
          for (uint64_t j = 1; j < n; ++j) want = combine(want, in(j));
          wrong_ += recv[i] != want;
        }
        // The application reuses its buffers (and its scalar) at once.
        std::fill(send_[r].begin(), send_[r].end(), 0xA5);
        std::fill(recv, recv + c, 0x5A);
        device_scalar_[r] = 0x77;
        return;
      case SimOp::kPlan:
        break;
    }
    const RsOp& p = o.op;
    switch (p.kind) {
      case RsOpKind::kWrite:
        flag(p.dst) = p.value;
        break;
      case RsOpKind::kCopy:
        std::copy_n(reinterpret_cast<const uint8_t*>(p.src), p.bytes,
                    reinterpret_cast<uint8_t*>(p.dst));
        break;
      case RsOpKind::kSum: {
        // Source k's scalar: mine as the exec passes it (its value, or where it lives), the
        // peers' from my head, where the plan says.
        uint8_t sc[kRsMaxRanks] = {};
        if (p.scalars != 0) {
          const int op = static_cast<int>(p.value);
          sc[0] = scalar_on_device(r) ? device_scalar_[r] : scalar(r, op);
          for (int k = 1; k < p.nsrc; ++k)
            sc[k] = *reinterpret_cast<const uint8_t*>(p.scalars + (k - 1) * kRsScalarWordBytes);
        }
        auto in = [&](int k, uint64_t i) {
          const uint8_t x = k == 0
                                ? reinterpret_cast<const uint8_t*>(p.src)[i]
                                : reinterpret_cast<const uint8_t*>(p.aux + (k - 1) * p.stride)[i];
          return p.scalars != 0 ? scaled(x, sc[k]) : x;
        };
        for (uint64_t i = 0; i < p.bytes; ++i) {
          uint8_t acc = in(0, i);
          for (int k = 1; k < p.nsrc; ++k) acc = combine(acc, in(k, i));
          reinterpret_cast<uint8_t*>(p.dst)[i] = acc;
        }
        break;
      }
      case RsOpKind::kRecord:
        ++records_[r][p.event];
        break;
      case RsOpKind::kWaitGeq:
      case RsOpKind::kWaitEvent:
        break;
    }
  }

  Scenario s_;
  std::mt19937 rng_;
  std::vector<std::vector<uint8_t>> send_, recv_, scratch_;
  std::vector<uint32_t> landed_, freed_;
  std::vector<uint8_t> device_scalar_;  // each rank's device-resident scalar
  std::vector<std::vector<std::deque<SimOp>>> streams_;
  std::vector<std::vector<uint64_t>> records_, enqueued_;
  uint64_t wrong_ = 0;
};

std::string label(const Scenario& s) {
  return std::to_string(s.nranks) + " ranks, chunk " + std::to_string(s.chunk) + ", slice " +
         std::to_string(s.slice) + (s.in_place ? ", in place" : ", out of place") + ", scalars " +
         std::to_string(static_cast<int>(s.scalars));
}

class ReduceScatterSim : public ::testing::TestWithParam<int> {};

TEST_P(ReduceScatterSim, EveryInterleavingSumsCorrectly) {
  for (Scalars scalars : {Scalars::kNone, Scalars::kHost, Scalars::kDevice, Scalars::kMixed})
    for (bool in_place : {false, true})
      for (uint64_t chunk : {uint64_t{32}, uint64_t{96}, uint64_t{100}})
        for (uint64_t slice : {uint64_t{32}, uint64_t{64}, uint64_t{128}}) {
          Scenario s;
          s.nranks = GetParam();
          s.chunk = chunk;
          s.slice = slice;
          s.in_place = in_place;
          s.scalars = scalars;
          for (uint64_t seed = 0; seed < 20; ++seed) {
            // Half the runs where the flags' 32-bit counters wrap during the ops.
            s.first_slice = seed % 2 ? uint64_t{0xFFFFFFFF} - 3 : 0;
            Sim sim(s, seed);
            std::string why;
            ASSERT_TRUE(sim.run(-1, 0, &why)) << label(s) << ", seed " << seed << ": " << why;
          }
        }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ReduceScatterSim, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

// Dropping any one wait, flag write or event record of one rank's plan shows as wrong bytes or
// a deadlock in some interleaving: none of them is there for nothing. Except a flag write that
// a later write of the same flag on the same stream supersedes (the flags are counters): it is
// there so that a slice's sum starts as soon as it landed, and a buffer is pushed into as soon
// as it is free — without it the op is slower, not wrong.
TEST(ReduceScatterPlan, DroppingAnyWaitWriteOrRecordIsCaught) {
  for (Scalars scalars : {Scalars::kNone, Scalars::kMixed})
    for (int nranks : {2, 3})
      for (bool in_place : {false, true}) {
        Scenario s;
        s.nranks = nranks;
        s.chunk = 100;
        s.slice = 32;  // four slices: both buffers reused
        s.in_place = in_place;
        s.scalars = scalars;
        Sim probe(s, 0);
        const std::vector<RsOp> plan = probe.plan(0, 0);
        for (size_t drop = 0; drop < plan.size(); ++drop) {
          const RsOpKind k = plan[drop].kind;
          if (k == RsOpKind::kCopy || k == RsOpKind::kSum) continue;
          const bool superseded =
              k == RsOpKind::kWrite && std::any_of(plan.begin() + static_cast<long>(drop) + 1,
                                                   plan.end(), [&](const RsOp& o) {
                                                     return o.kind == RsOpKind::kWrite &&
                                                            o.dst == plan[drop].dst &&
                                                            o.stream == plan[drop].stream;
                                                   });
          if (superseded) continue;
          bool caught = false;
          for (uint64_t seed = 0; seed < 300 && !caught; ++seed) {
            Sim sim(s, seed);
            std::string why;
            caught = !sim.run(0, drop, &why);
          }
          EXPECT_TRUE(caught) << label(s) << ": dropping op " << drop << " (kind "
                              << static_cast<int>(k) << ", stream "
                              << static_cast<int>(plan[drop].stream) << ") went unnoticed";
        }
      }
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
