// The copy-engine all-gather protocol (ce_plan.h), checked two ways:
//  - structure: every op of a plan touches only the user buffers and the arenas, waits and
//    resets only local flags, and writes peer memory only with kSignal copies;
//  - behaviour: plan_simulator.h runs the plans of N ranks against each other on host
//    memory under many random interleavings (deadlocks and races detected); the data every
//    rank gathered and the flags after each op are checked. Every rank's user stream also runs a
//    "producer" copy before each all-gather (the application filling sendbuff) and a "consumer"
//    copy after it (the application reading recvbuff), so the event ordering at both ends is
//    exercised too.
// A failing run prints its seed; ZEROCTA_PLAN_SEED=<seed> reruns only that seed.
#include "ce_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "plan_simulator.h"

namespace {

using zc::AllGatherArgs;
using zc::ArenaLayout;
using zc::kMaxRanks;
using zc::PlanOp;
using zc::PlanOpKind;
using zc::PlanStream;
using zc::RankView;
using zc_test::addr_of;
using zc_test::inside;
using zc_test::kEvents;
using zc_test::kFlagBytes;
using zc_test::kind_name;
using zc_test::kStreams;
using zc_test::load32;
using zc_test::MemoryMap;
using zc_test::Outcome;
using zc_test::outcome_name;
using zc_test::Region;
using zc_test::SimResult;
using zc_test::Simulator;

constexpr uint8_t kPoison = 0xEE;  // never produced as data, so an unwritten byte shows

// ---------------------------------------------------------------------------------------------
// A world: N ranks' arenas and, per all-gather, every rank's buffers; builds the plans the
// way the real communicator does (one slot cursor per rank, carried from op to op).

struct OpSpec {
  uint64_t bytes = 0;
  std::vector<bool> in_place;  // per rank
};

// Edits rank `rank`'s plan of op `op` before it is run (negative tests).
using Mutator = std::function<void(int rank, size_t op, std::vector<PlanOp>* plan)>;

class World {
 public:
  World(int nranks, const ArenaLayout& layout, std::vector<OpSpec> ops, uint64_t data_seed)
      : n_(nranks), layout_(layout), ops_(std::move(ops)), cursor_(nranks, 0) {
    std::mt19937_64 rng(data_seed);
    std::vector<Region> regions;
    auto add = [&](std::vector<uint8_t>* v, uint64_t used, std::string name) {
      // At least one byte, so that every buffer has its own address.
      v->assign(std::max<uint64_t>(used, 1), kPoison);
      regions.push_back({addr_of(v->data()), used, std::move(name)});
    };
    arenas_.resize(n_);
    for (int r = 0; r < n_; ++r) {
      add(&arenas_[r], layout_.arena_bytes(), "arena[" + std::to_string(r) + "]");
      init_flags(r);
    }
    bufs_.resize(ops_.size());
    for (size_t k = 0; k < ops_.size(); ++k) {
      const uint64_t b = ops_[k].bytes;
      OpBuffers& o = bufs_[k];
      o.source.resize(n_);
      o.send.resize(n_);
      o.recv.resize(n_);
      o.observed.resize(n_);
      o.prior.resize(n_);
      for (int r = 0; r < n_; ++r) {
        const std::string tag = "op" + std::to_string(k) + ".rank" + std::to_string(r) + ".";
        add(&o.source[r], b, tag + "source");
        for (auto& byte : o.source[r]) {
          byte = static_cast<uint8_t>(rng() % 255);
          if (byte >= kPoison) ++byte;  // never the poison value
        }
        add(&o.recv[r], b * n_, tag + "recv");
        add(&o.observed[r], b * n_, tag + "observed");
        add(&o.prior[r], b * n_, tag + "prior");
        if (!ops_[k].in_place[r]) add(&o.send[r], b, tag + "send");
      }
    }
    memory_.reset(new MemoryMap(std::move(regions)));
  }

  const MemoryMap& memory() const { return *memory_; }
  const ArenaLayout& layout() const { return layout_; }
  const std::vector<uint64_t>& cursors() const { return cursor_; }

  RankView view(int r) const {
    RankView v;
    v.rank = r;
    v.nranks = n_;
    for (int p = 0; p < n_; ++p) v.arena[p] = addr_of(arenas_[p].data());
    return v;
  }
  AllGatherArgs args(size_t k, int r) const {
    AllGatherArgs a;
    const OpBuffers& o = bufs_[k];
    a.bytes = ops_[k].bytes;
    a.recv = addr_of(o.recv[r].data());
    a.send = ops_[k].in_place[r] ? a.recv + r * a.bytes : addr_of(o.send[r].data());
    return a;
  }

  // Every rank's ops for all-gathers [first, last), each wrapped in the application's copies
  // on the user stream: read the old recvbuff, fill sendbuff, then (after the all-gather)
  // read recvbuff. Must be called in op order.
  std::vector<std::vector<PlanOp>> build(size_t first, size_t last, const Mutator& mutate) {
    std::vector<std::vector<PlanOp>> plans(n_);
    for (size_t k = first; k < last; ++k) {
      for (int r = 0; r < n_; ++r) {
        const AllGatherArgs a = args(k, r);
        const OpBuffers& o = bufs_[k];
        // The application still reads recvbuff's old contents, then fills sendbuff.
        plans[r].push_back(PlanOp{PlanStream::kUser,
                                  PlanOpKind::kCopy,
                                  0,
                                  {},
                                  addr_of(o.prior[r].data()),
                                  a.recv,
                                  a.bytes * n_});
        plans[r].push_back(PlanOp{PlanStream::kUser,
                                  PlanOpKind::kCopy,
                                  0,
                                  {},
                                  a.send,
                                  addr_of(o.source[r].data()),
                                  a.bytes});
        std::vector<PlanOp> plan;
        zc::build_allgather_plan(
            layout_, view(r), a,
            zc::SlotRange{layout_.eager_slots, layout_.nslots - layout_.eager_slots}, &cursor_[r],
            &plan);
        if (mutate) mutate(r, k, &plan);
        plans[r].insert(plans[r].end(), plan.begin(), plan.end());
        plans[r].push_back(PlanOp{PlanStream::kUser,
                                  PlanOpKind::kCopy,
                                  0,
                                  {},
                                  addr_of(o.observed[r].data()),
                                  a.recv,
                                  a.bytes * n_});
      }
    }
    return plans;
  }

  // Empty when every rank's recvbuff (and what the application read after the op) is the
  // concatenation of the sources, and no source or out-of-place sendbuff was written.
  std::string check_data(size_t first, size_t last) const {
    for (size_t k = first; k < last; ++k) {
      const OpBuffers& o = bufs_[k];
      const uint64_t b = ops_[k].bytes;
      if (b == 0) continue;  // nothing to compare; any write would have been a bad access
      std::vector<uint8_t> expect;
      for (int p = 0; p < n_; ++p)
        expect.insert(expect.end(), o.source[p].begin(), o.source[p].begin() + b);
      for (int r = 0; r < n_; ++r) {
        const std::string tag = "op " + std::to_string(k) + " rank " + std::to_string(r) + ": ";
        if (memcmp(o.recv[r].data(), expect.data(), expect.size()) != 0)
          return tag + "recvbuff differs from the concatenation" + first_diff(o.recv[r], expect, b);
        if (memcmp(o.observed[r].data(), expect.data(), expect.size()) != 0)
          return tag + "the application read recvbuff before the all-gather had finished" +
                 first_diff(o.observed[r], expect, b);
        if (!ops_[k].in_place[r] && memcmp(o.send[r].data(), o.source[r].data(), b) != 0)
          return tag + "sendbuff was modified";
        const std::vector<uint8_t> untouched(b * n_, kPoison);
        if (memcmp(o.prior[r].data(), untouched.data(), untouched.size()) != 0)
          return tag + "recvbuff was written before the application was done with it";
      }
    }
    return "";
  }

  // Empty when every rank's flag region is exactly as set up: ready 0, done 1, constant 1,
  // marker intact, nothing else written.
  std::string check_flags() const {
    for (int r = 0; r < n_; ++r) {
      std::vector<uint8_t> init = initial_flags(r);
      for (uint64_t off = 0; off < layout_.flags_bytes; off += kFlagBytes) {
        if (memcmp(arenas_[r].data() + off, init.data() + off, kFlagBytes) == 0) continue;
        return "rank " + std::to_string(r) + ": " + flag_name(off) + " is " +
               std::to_string(load32(addr_of(arenas_[r].data() + off))) + ", expected " +
               std::to_string(load32(addr_of(init.data() + off)));
      }
    }
    return "";
  }

 private:
  struct OpBuffers {
    std::vector<std::vector<uint8_t>> source, send, recv, observed, prior;
  };

  static void store32(uint8_t* p, uint32_t v) { memcpy(p, &v, sizeof(v)); }

  // What ce_setup does on the GPU (step 3): ready = 0, done = 1 for every slot and rank
  // slot, the constant 1 and the marker; slots hold whatever was there.
  std::vector<uint8_t> initial_flags(int r) const {
    std::vector<uint8_t> f(layout_.flags_bytes, 0);
    for (int s = 0; s < layout_.nslots; ++s)
      for (int p = 0; p < kMaxRanks; ++p) store32(f.data() + layout_.done_offset(s, p), 1);
    store32(f.data() + layout_.one_offset(), 1);
    store32(f.data() + layout_.marker_offset(), 0x5a000000u ^ static_cast<uint32_t>(r));
    return f;
  }
  void init_flags(int r) {
    std::vector<uint8_t> f = initial_flags(r);
    memcpy(arenas_[r].data(), f.data(), f.size());
  }

  std::string flag_name(uint64_t off) const {
    for (int s = 0; s < layout_.nslots; ++s)
      for (int p = 0; p < kMaxRanks; ++p) {
        if (layout_.ready_offset(s, p) == off)
          return "ready[slot " + std::to_string(s) + "][rank " + std::to_string(p) + "]";
        if (layout_.done_offset(s, p) == off)
          return "done[slot " + std::to_string(s) + "][peer " + std::to_string(p) + "]";
      }
    if (off == layout_.one_offset()) return "the constant 1";
    if (off == layout_.marker_offset()) return "the marker";
    return "flag-region byte " + std::to_string(off);
  }

  static std::string first_diff(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                                uint64_t chunk) {
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i] != want[i])
        return " (first at byte " + std::to_string(i) + ", chunk of rank " +
               std::to_string(chunk ? i / chunk : 0) + ": got " + std::to_string(got[i]) +
               ", want " + std::to_string(want[i]) + ")";
    return "";
  }

  int n_;
  ArenaLayout layout_;
  std::vector<OpSpec> ops_;
  std::vector<uint64_t> cursor_;
  std::vector<std::vector<uint8_t>> arenas_;
  std::vector<OpBuffers> bufs_;
  std::unique_ptr<MemoryMap> memory_;
};

// ---------------------------------------------------------------------------------------------
// Random scenarios.

struct Scenario {
  int nranks = 0;
  ArenaLayout layout;
  std::vector<OpSpec> ops;

  std::string describe() const {
    std::ostringstream os;
    os << nranks << " ranks, " << layout.nslots << " slots of " << layout.slot_bytes << " B, ops:";
    for (const OpSpec& o : ops) {
      os << " " << o.bytes << "B/";
      for (bool ip : o.in_place) os << (ip ? 'i' : 'o');
    }
    return os.str();
  }
};

// Small slots, so that an op spans several pieces and slots wrap around within an op.
std::vector<ArenaLayout> small_layouts() {
  return {ArenaLayout::make(4 * 64, 64), ArenaLayout::make(2 * 64, 64),
          ArenaLayout::make(3 * 40, 40), ArenaLayout::make(64, 64)};
}

uint64_t random_size(const ArenaLayout& l, std::mt19937_64& rng) {
  const uint64_t s = l.slot_bytes, all = s * static_cast<uint64_t>(l.nslots);
  const uint64_t picks[] = {1,     2,     3,         7,   s - 1,   s,
                            s + 1, 2 * s, 3 * s + 5, all, all + 1, 2 * all + 3};
  if (rng() % 4 == 0) return 1 + rng() % (5 * s);
  return picks[rng() % (sizeof(picks) / sizeof(picks[0]))];
}

Scenario random_scenario(int nranks, size_t nops, std::mt19937_64& rng) {
  Scenario sc;
  sc.nranks = nranks;
  const std::vector<ArenaLayout> layouts = small_layouts();
  sc.layout = layouts[rng() % layouts.size()];
  for (size_t k = 0; k < nops; ++k) {
    OpSpec o;
    o.bytes = random_size(sc.layout, rng);
    for (int r = 0; r < nranks; ++r) o.in_place.push_back(rng() % 2 == 0);
    sc.ops.push_back(o);
  }
  return sc;
}

struct RunReport {
  Outcome outcome = Outcome::kOk;
  std::string failure;  // empty: data and flags correct
};

// Runs a scenario: all ops queued at once (pipelined: ranks drift apart by whole ops), or one
// op at a time with every rank quiescent in between (then flags are checked after each op).
RunReport run_scenario(const Scenario& sc, uint64_t seed, bool one_at_a_time,
                       const Mutator& mutate = nullptr, bool detect_races = true) {
  std::mt19937_64 rng(seed);
  World w(sc.nranks, sc.layout, sc.ops, rng());
  const size_t nops = sc.ops.size();
  const size_t step = one_at_a_time ? 1 : nops;
  for (size_t first = 0; first < nops; first += step) {
    const size_t last = std::min(nops, first + step);
    std::vector<std::vector<PlanOp>> plans = w.build(first, last, mutate);
    for (int r = 1; r < sc.nranks; ++r)
      if (w.cursors()[r] != w.cursors()[0]) return {Outcome::kOk, "slot cursors diverged"};
    SimResult res = Simulator(plans, w.memory()).run(rng(), detect_races);
    if (res.outcome != Outcome::kOk)
      return {res.outcome, std::string(outcome_name(res.outcome)) + ": " + res.detail};
    std::string bad = w.check_data(first, last);
    if (bad.empty()) bad = w.check_flags();
    if (!bad.empty()) return {Outcome::kOk, bad};
  }
  return {};
}

// ZEROCTA_PLAN_SEED=<n> replaces the seed list with that one seed.
std::vector<uint64_t> seeds(uint64_t salt, int count) {
  std::vector<uint64_t> out;
  if (const char* s = getenv("ZEROCTA_PLAN_SEED")) {
    out.push_back(strtoull(s, nullptr, 0));
    return out;
  }
  for (int i = 0; i < count; ++i) out.push_back(salt * 1000003ull + static_cast<uint64_t>(i));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Structure of a plan.

// Problems of one rank's plan; empty when the plan only touches what it may.
std::vector<std::string> structure_problems(const ArenaLayout& L, const RankView& v,
                                            const AllGatherArgs& a,
                                            const std::vector<PlanOp>& plan) {
  std::vector<std::string> bad;
  const int me = v.rank, n = v.nranks;
  const uint64_t mine = v.arena[me];
  std::set<uint64_t> wait_ok, signal_ok;  // flag addresses this rank may wait on / signal
  for (int s = 0; s < L.nslots; ++s)
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      wait_ok.insert(mine + L.ready_offset(s, p));
      wait_ok.insert(mine + L.done_offset(s, p));
      signal_ok.insert(v.arena[p] + L.ready_offset(s, me));
      signal_ok.insert(v.arena[p] + L.done_offset(s, me));
    }
  // A piece lies inside one slot of rank p's arena.
  auto in_a_slot = [&](int p, uint64_t x, uint64_t bytes) {
    const uint64_t base = v.arena[p] + L.slot_offset(0);
    if (!inside(x, bytes, base, L.slot_bytes * L.nslots) || bytes == 0) return false;
    return (x - base) / L.slot_bytes == (x + bytes - 1 - base) / L.slot_bytes;
  };
  uint64_t recorded[kEvents] = {};
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlanOp& op = plan[i];
    const std::string at = "op #" + std::to_string(i) + " (" + kind_name(op.kind) + "): ";
    if (static_cast<int>(op.stream) >= kStreams) bad.push_back(at + "invalid stream");
    switch (op.kind) {
      case PlanOpKind::kWaitEq1:
        if (!wait_ok.count(op.dst))
          bad.push_back(at + "waits on something other than a peer's flag in its own arena");
        break;
      case PlanOpKind::kWrite0:
        if (!wait_ok.count(op.dst)) bad.push_back(at + "writes outside its own arena's flags");
        break;
      case PlanOpKind::kSignal:
        if (op.src != mine + L.one_offset() || op.bytes != kFlagBytes)
          bad.push_back(at + "does not copy the 4-byte constant 1 of its own arena");
        if (!signal_ok.count(op.dst))
          bad.push_back(at + "signals something other than its own flag in a peer's arena");
        break;
      case PlanOpKind::kCopy: {
        bool src_ok = inside(op.src, op.bytes, a.send, a.bytes);
        for (int p = 0; p < n && !src_ok; ++p) src_ok = p != me && in_a_slot(p, op.src, op.bytes);
        const bool dst_ok =
            inside(op.dst, op.bytes, a.recv, a.bytes * n) || in_a_slot(me, op.dst, op.bytes);
        if (!src_ok) bad.push_back(at + "reads outside sendbuff and a slot of a peer");
        if (!dst_ok) bad.push_back(at + "writes outside recvbuff and a slot of its own");
        break;
      }
      case PlanOpKind::kRecord:
      case PlanOpKind::kWaitEvent:
        if (op.event >= kEvents) {
          bad.push_back(at + "event out of range");
          break;
        }
        if (op.kind == PlanOpKind::kRecord) ++recorded[op.event];
        if (op.kind == PlanOpKind::kWaitEvent && recorded[op.event] == 0)
          bad.push_back(at + "waits on an event not recorded before it (a no-op wait)");
        break;
      default:
        bad.push_back(at + "unknown op kind " + std::to_string(static_cast<int>(op.kind)));
    }
  }
  // The joins: both internal streams start after the user's stream, and the user's stream
  // continues only after the last op of each internal stream.
  for (int s = 1; s < kStreams; ++s) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < plan.size(); ++i)
      if (static_cast<int>(plan[i].stream) == s) idx.push_back(i);
    if (idx.empty()) continue;
    const PlanOp& first = plan[idx.front()];
    const PlanOp& last = plan[idx.back()];
    bool fork = false;
    if (first.kind == PlanOpKind::kWaitEvent)
      for (size_t i = 0; i < idx.front(); ++i)
        fork = fork || (plan[i].stream == PlanStream::kUser &&
                        plan[i].kind == PlanOpKind::kRecord && plan[i].event == first.event);
    if (!fork) bad.push_back("stream " + std::to_string(s) + " does not start after the user's");
    bool join = false;
    if (last.kind == PlanOpKind::kRecord)
      for (size_t i = idx.back() + 1; i < plan.size(); ++i)
        join = join || (plan[i].stream == PlanStream::kUser &&
                        plan[i].kind == PlanOpKind::kWaitEvent && plan[i].event == last.event);
    if (!join) bad.push_back("the user's stream does not wait for stream " + std::to_string(s));
  }
  return bad;
}

bool same_op(const PlanOp& x, const PlanOp& y) {
  return x.stream == y.stream && x.kind == y.kind && x.event == y.event && x.dst == y.dst &&
         x.src == y.src && x.bytes == y.bytes;
}

// ---------------------------------------------------------------------------------------------
// Tests.

TEST(CePlanLayout, FlagsAreDistinctAlignedAndBeforeTheSlots) {
  for (const ArenaLayout& L :
       {ArenaLayout::make(4 * 64, 64), ArenaLayout::make(64, 64), ArenaLayout::make(3 * 40, 40),
        ArenaLayout::make(256ull << 20, 32ull << 20), ArenaLayout::make(1ull << 20, 64ull << 10)}) {
    SCOPED_TRACE(std::to_string(L.nslots) + " slots of " + std::to_string(L.slot_bytes));
    EXPECT_GE(L.nslots, 2);
    EXPECT_EQ(L.flags_bytes % 4096, 0u);
    std::set<uint64_t> offsets;
    auto flag = [&](uint64_t off) {
      EXPECT_EQ(off % kFlagBytes, 0u);
      EXPECT_LE(off + kFlagBytes, L.flags_bytes);
      EXPECT_TRUE(offsets.insert(off).second) << "flag offset used twice: " << off;
    };
    for (int s = 0; s < L.nslots; ++s)
      for (int p = 0; p < kMaxRanks; ++p) {
        flag(L.ready_offset(s, p));
        flag(L.done_offset(s, p));
      }
    flag(L.one_offset());
    flag(L.marker_offset());
    for (int s = 0; s < L.nslots; ++s) {
      EXPECT_EQ(L.slot_offset(s), L.flags_bytes + static_cast<uint64_t>(s) * L.slot_bytes);
      EXPECT_LE(L.slot_offset(s) + L.slot_bytes, L.arena_bytes());
    }
    EXPECT_EQ(L.arena_bytes(), L.flags_bytes + L.slot_bytes * static_cast<uint64_t>(L.nslots));
  }
  EXPECT_EQ(ArenaLayout::make(256ull << 20, 32ull << 20).nslots, 8);
  EXPECT_EQ(ArenaLayout::make(256ull << 20, 32ull << 20).eager_slots, 6);
  // Never fewer than 4 slots (2 eager, 2 for graphs), and never more memory than the pool.
  EXPECT_EQ(ArenaLayout::make(64ull << 20, 32ull << 20).nslots, 4);
  EXPECT_EQ(ArenaLayout::make(64ull << 20, 32ull << 20).eager_slots, 2);
  EXPECT_EQ(ArenaLayout::make(64ull << 20, 32ull << 20).slot_bytes, 16ull << 20);
  EXPECT_EQ(ArenaLayout::make(64, 64).nslots, 4);
}

TEST(CePlanStructure, TouchesOnlyUserBuffersAndArenasAndWritesPeersOnlyBySignal) {
  std::mt19937_64 rng(7);
  for (int n : {2, 3, 4, 8, kMaxRanks}) {
    for (const ArenaLayout& L : small_layouts()) {
      for (int trial = 0; trial < (n == kMaxRanks ? 1 : 8); ++trial) {
        std::vector<OpSpec> ops(1);
        ops[0].bytes = random_size(L, rng);
        for (int r = 0; r < n; ++r) ops[0].in_place.push_back(rng() % 2 == 0);
        World w(n, L, ops, rng());
        for (int r = 0; r < n; ++r) {
          SCOPED_TRACE("nranks " + std::to_string(n) + " rank " + std::to_string(r) + " bytes " +
                       std::to_string(ops[0].bytes) + (ops[0].in_place[r] ? " in place" : ""));
          std::vector<PlanOp> plan;
          uint64_t cursor = static_cast<uint64_t>(trial) * 3;  // any running cursor
          zc::build_allgather_plan(L, w.view(r), w.args(0, r), zc::SlotRange{0, L.nslots}, &cursor,
                                   &plan);
          for (const std::string& p : structure_problems(L, w.view(r), w.args(0, r), plan))
            ADD_FAILURE() << p;
          const uint64_t pieces = (ops[0].bytes + L.slot_bytes - 1) / L.slot_bytes;
          EXPECT_EQ(cursor, static_cast<uint64_t>(trial) * 3 + pieces);
          // Deterministic: the same inputs give the same plan (every rank must agree).
          std::vector<PlanOp> again;
          uint64_t cursor2 = static_cast<uint64_t>(trial) * 3;
          zc::build_allgather_plan(L, w.view(r), w.args(0, r), zc::SlotRange{0, L.nslots}, &cursor2,
                                   &again);
          ASSERT_EQ(plan.size(), again.size());
          for (size_t i = 0; i < plan.size(); ++i)
            EXPECT_TRUE(same_op(plan[i], again[i])) << "op #" << i;
        }
      }
    }
  }
}

TEST(CePlanStructure, AppendsToTheCallersPlan) {
  World w(2, ArenaLayout::make(4 * 64, 64), {OpSpec{100, {false, true}}}, 1);
  std::vector<PlanOp> plan(1, PlanOp{PlanStream::kUser, PlanOpKind::kRecord, 2, {}, 0, 0, 0});
  uint64_t cursor = 0;
  zc::build_allgather_plan(w.layout(), w.view(0), w.args(0, 0), zc::SlotRange{0, w.layout().nslots},
                           &cursor, &plan);
  ASSERT_GT(plan.size(), 1u);
  EXPECT_EQ(plan[0].kind, PlanOpKind::kRecord);
  EXPECT_EQ(plan[0].event, 2);
}

TEST(CePlanStructure, CheckerRejectsForbiddenOps) {
  // The structure check must be able to fail: plant one forbidden op of each kind.
  const ArenaLayout L = ArenaLayout::make(4 * 64, 64);
  World w(3, L, {OpSpec{100, {false, false, false}}}, 1);
  const RankView v = w.view(0);
  const AllGatherArgs a = w.args(0, 0);
  std::vector<PlanOp> base;
  uint64_t cursor = 0;
  zc::build_allgather_plan(L, v, a, zc::SlotRange{0, L.nslots}, &cursor, &base);
  ASSERT_TRUE(structure_problems(L, v, a, base).empty());
  const PlanOp forbidden[] = {
      // remote reset of a flag (a remote stream-memory write)
      {PlanStream::kPull, PlanOpKind::kWrite0, 0, {}, v.arena[1] + L.ready_offset(0, 0), 0, 0},
      // wait on a peer's memory
      {PlanStream::kPull, PlanOpKind::kWaitEq1, 0, {}, v.arena[1] + L.done_offset(0, 0), 0, 0},
      // a data copy into a peer's arena
      {PlanStream::kCopyIn, PlanOpKind::kCopy, 0, {}, v.arena[1] + L.slot_offset(0), a.send, 8},
      // a copy that reads past sendbuff
      {PlanStream::kCopyIn,
       PlanOpKind::kCopy,
       0,
       {},
       v.arena[0] + L.slot_offset(0),
       a.send + 96,
       8},
      // a piece that straddles two slots
      {PlanStream::kCopyIn,
       PlanOpKind::kCopy,
       0,
       {},
       v.arena[0] + L.slot_offset(0) + 60,
       a.send,
       8},
      // a copy over its own flags
      {PlanStream::kCopyIn, PlanOpKind::kCopy, 0, {}, v.arena[0], a.send, 8},
      // a signal of another rank's flag
      {PlanStream::kCopyIn,
       PlanOpKind::kSignal,
       0,
       {},
       v.arena[1] + L.ready_offset(0, 2),
       v.arena[0] + L.one_offset(),
       4},
      // an event that does not exist
      {PlanStream::kUser, PlanOpKind::kRecord, 3, {}, 0, 0, 0},
      // something that is none of the six kinds (a kernel, say)
      {PlanStream::kUser, static_cast<PlanOpKind>(6), 0, {}, 0, 0, 0},
  };
  for (const PlanOp& f : forbidden) {
    std::vector<PlanOp> plan = base;
    plan.insert(plan.begin() + 4, f);
    EXPECT_FALSE(structure_problems(L, v, a, plan).empty()) << kind_name(f.kind);
  }
}

class CePlanSim : public ::testing::TestWithParam<int> {};

TEST_P(CePlanSim, QueuedOpsGatherCorrectlyUnderRandomInterleavings) {
  const int n = GetParam();
  // About 2600 interleavings in all: fewer for more ranks, whose runs are longer.
  const int runs = n == 2 ? 1000 : n == 3 ? 800 : n == 4 ? 600 : 200;
  for (uint64_t seed : seeds(static_cast<uint64_t>(n), runs)) {
    std::mt19937_64 rng(seed);
    const Scenario sc = random_scenario(n, 2 + rng() % 6, rng);
    const RunReport rep = run_scenario(sc, rng(), /*one_at_a_time=*/false);
    if (!rep.failure.empty()) {
      ADD_FAILURE() << "ZEROCTA_PLAN_SEED=" << seed << " (" << sc.describe() << ")\n"
                    << rep.failure;
      return;
    }
  }
}

TEST_P(CePlanSim, FlagsReturnToTheirInitialStateAfterEveryOp) {
  const int n = GetParam();
  for (uint64_t seed : seeds(100 + static_cast<uint64_t>(n), n >= 8 ? 60 : 200)) {
    std::mt19937_64 rng(seed);
    const Scenario sc = random_scenario(n, 2 + rng() % 5, rng);
    const RunReport rep = run_scenario(sc, rng(), /*one_at_a_time=*/true);
    if (!rep.failure.empty()) {
      ADD_FAILURE() << "ZEROCTA_PLAN_SEED=" << seed << " (" << sc.describe() << ")\n"
                    << rep.failure;
      return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CePlanSim, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

TEST(CePlanSimEdges, EmptyAndSixtyFourRanks) {
  // A zero-byte op (the route never sends one, but the plan must stay harmless).
  for (uint64_t seed : seeds(900, 20)) {
    Scenario sc;
    sc.nranks = 3;
    sc.layout = ArenaLayout::make(4 * 64, 64);
    sc.ops = {OpSpec{0, {true, false, true}}, OpSpec{65, {false, true, false}}};
    const RunReport rep = run_scenario(sc, seed, false);
    EXPECT_TRUE(rep.failure.empty()) << "ZEROCTA_PLAN_SEED=" << seed << ": " << rep.failure;
  }
  // The largest communicator, every rank's flag column in use.
  for (uint64_t seed : seeds(901, 3)) {
    Scenario sc;
    sc.nranks = kMaxRanks;
    sc.layout = ArenaLayout::make(2 * 64, 64);
    std::mt19937_64 rng(seed);
    for (uint64_t bytes : {3u, 130u}) {
      OpSpec o{bytes, {}};
      for (int r = 0; r < kMaxRanks; ++r) o.in_place.push_back(rng() % 2 == 0);
      sc.ops.push_back(o);
    }
    const RunReport rep = run_scenario(sc, seed, false);
    EXPECT_TRUE(rep.failure.empty()) << "ZEROCTA_PLAN_SEED=" << seed << ": " << rep.failure;
  }
}

// ---------------------------------------------------------------------------------------------
// The simulator catches broken protocols.

// Scenarios that reuse slots within an op, and ops that follow each other.
Scenario reuse_scenario(int n, std::mt19937_64& rng) {
  Scenario sc;
  sc.nranks = n;
  sc.layout = ArenaLayout::make(2 * 64, 64);
  for (int k = 0; k < 3; ++k) {
    OpSpec o{64 * 5 + rng() % 64, {}};
    for (int r = 0; r < n; ++r) o.in_place.push_back(rng() % 2 == 0);
    sc.ops.push_back(o);
  }
  return sc;
}

struct Caught {
  int runs = 0, caught = 0;
  std::map<Outcome, int> by_outcome;  // kOk counts wrong data/flags
  std::string example;
};

// Runs broken plans until `enough` says so (or `runs` seeds are done).
Caught run_broken(
    uint64_t salt, int runs, const std::function<Mutator(const ArenaLayout&)>& breaker,
    bool detect_races,
    const std::function<bool(const Caught&)>& enough = [](const Caught&) { return false; }) {
  Caught c;
  for (uint64_t seed : seeds(salt, runs)) {
    std::mt19937_64 rng(seed);
    const Scenario sc = reuse_scenario(2 + static_cast<int>(rng() % 3), rng);
    const RunReport rep = run_scenario(sc, rng(), false, breaker(sc.layout), detect_races);
    ++c.runs;
    if (rep.failure.empty()) continue;
    ++c.caught;
    ++c.by_outcome[rep.outcome];
    if (c.example.empty()) c.example = "seed " + std::to_string(seed) + ": " + rep.failure;
    if (enough(c)) break;
  }
  return c;
}

// A mutator that removes every op for which drop(rank, view, op) is true.
Mutator dropping(const ArenaLayout& L,
                 std::function<bool(const ArenaLayout&, const RankView&, const PlanOp&)> drop) {
  return [L, drop](int rank, size_t, std::vector<PlanOp>* plan) {
    // Recover this rank's view from the plan itself: the signal source is its own constant.
    RankView v;
    v.rank = rank;
    for (const PlanOp& op : *plan)
      if (op.kind == PlanOpKind::kSignal) v.arena[rank] = op.src - L.one_offset();
    plan->erase(std::remove_if(plan->begin(), plan->end(),
                               [&](const PlanOp& op) { return drop(L, v, op); }),
                plan->end());
  };
}

bool local_flag(const ArenaLayout& L, const RankView& v, const PlanOp& op, bool done) {
  const uint64_t mine = v.arena[v.rank];
  if (op.dst < mine) return false;
  const uint64_t off = op.dst - mine;
  for (int s = 0; s < L.nslots; ++s)
    for (int p = 0; p < kMaxRanks; ++p)
      if (off == (done ? L.done_offset(s, p) : L.ready_offset(s, p))) return true;
  return false;
}

TEST(CePlanSimCatches, MissingSlotReuseWaitsAsRacesOrCorruption) {
  auto breaker = [](const ArenaLayout& layout) {
    return dropping(layout, [](const ArenaLayout& L, const RankView& v, const PlanOp& op) {
      return op.kind == PlanOpKind::kWaitEq1 && local_flag(L, v, op, /*done=*/true);
    });
  };
  // With the race detector: a copy-in overwrites a slot a peer is still pulling.
  Caught races = run_broken(2000, 300, breaker, true,
                            [](const Caught& c) { return c.by_outcome.count(Outcome::kRace) > 0; });
  EXPECT_GT(races.by_outcome[Outcome::kRace], 0) << races.caught << "/" << races.runs;
  // Without it, the damage itself shows: wrong data, or a lost ready signal that deadlocks.
  Caught plain =
      run_broken(2001, 300, breaker, false, [](const Caught& c) { return c.caught > 0; });
  EXPECT_GT(plain.caught, 0) << "dropping the done waits went unnoticed in " << plain.runs
                             << " runs";
  std::cout << "[ info     ] without the done waits: a race in run " << races.runs
            << "; without the race detector caught in run " << plain.runs << ": "
            << plain.example.substr(0, plain.example.find('\n')) << "\n";
}

TEST(CePlanSimCatches, MissingReadyResetLeavesFlagsOrDataWrong) {
  auto breaker = [](const ArenaLayout& layout) {
    return dropping(layout, [](const ArenaLayout& L, const RankView& v, const PlanOp& op) {
      return op.kind == PlanOpKind::kWrite0 && local_flag(L, v, op, /*done=*/false);
    });
  };
  Caught c = run_broken(2100, 50, breaker, true);
  EXPECT_EQ(c.caught, c.runs) << "a ready flag left at 1 went unnoticed";
}

TEST(CePlanSimCatches, MissingSignalDeadlocksEveryInterleaving) {
  for (bool done : {false, true}) {
    SCOPED_TRACE(done ? "first done signal dropped" : "first ready signal dropped");
    auto breaker = [done](const ArenaLayout&) {
      return Mutator([done](int rank, size_t op, std::vector<PlanOp>* plan) {
        if (rank != 0 || op != 0) return;
        const PlanStream s = done ? PlanStream::kPull : PlanStream::kCopyIn;
        for (size_t i = 0; i < plan->size(); ++i)
          if ((*plan)[i].kind == PlanOpKind::kSignal && (*plan)[i].stream == s) {
            plan->erase(plan->begin() + static_cast<long>(i));
            return;
          }
      });
    };
    Caught c = run_broken(done ? 2201 : 2200, 50, breaker, true);
    EXPECT_EQ(c.by_outcome[Outcome::kDeadlock], c.runs) << c.example;
  }
}

TEST(CePlanSimCatches, MissingEventWaitsLetTheApplicationRace) {
  struct Case {
    const char* what;
    PlanStream stream;
    uint8_t event;
  };
  const Case cases[] = {
      {"copy-in starts before the application filled sendbuff", PlanStream::kCopyIn, 0},
      {"pull starts before the application is done with recvbuff", PlanStream::kPull, 0},
      {"the application reads recvbuff before the pulls end", PlanStream::kUser, 2},
      {"the application goes on before the copy-in ends", PlanStream::kUser, 1},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    auto breaker = [k](const ArenaLayout&) {
      return Mutator([k](int, size_t, std::vector<PlanOp>* plan) {
        plan->erase(std::remove_if(plan->begin(), plan->end(),
                                   [&](const PlanOp& op) {
                                     return op.kind == PlanOpKind::kWaitEvent &&
                                            op.stream == k.stream && op.event == k.event;
                                   }),
                    plan->end());
      });
    };
    // Caught by the race detector, and without it by the data the application sees.
    Caught raced = run_broken(2300 + k.event, 300, breaker, true,
                              [](const Caught& c) { return c.caught > 0; });
    EXPECT_GT(raced.caught, 0) << "went unnoticed in " << raced.runs << " runs";
    Caught wrong = run_broken(2400 + k.event, 300, breaker, false,
                              [](const Caught& c) { return c.by_outcome.count(Outcome::kOk) > 0; });
    EXPECT_GT(wrong.by_outcome[Outcome::kOk], 0)
        << "no wrong data in " << wrong.runs << " runs without the race detector";
  }
}

}  // namespace
