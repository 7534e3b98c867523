// The copy-engine all-gather protocol (ce_plan.h), in both directions, checked two ways:
//  - structure: every op of a plan touches only what its direction allows. Both directions
//    wait on and reset only local flags of the op's slot range, and write a peer's flag only
//    by a kSignal of their own constant into their own column. Data moves only along the
//    direction's paths: pull copies sendbuff into its own slot and a peer's slot into that
//    peer's chunk of recvbuff (never a data copy into a peer's arena); push copies sendbuff
//    into its own sub-slot of a peer's slot and a sender's sub-slot of its own slot into that
//    sender's chunk (never a read of a peer's arena);
//  - behaviour: plan_simulator.h runs the plans of N ranks against each other on host
//    memory under many random interleavings (deadlocks and races detected); the data every
//    rank gathered and the flags after each op are checked. Every rank's user stream also runs a
//    "producer" copy before each all-gather (the application filling sendbuff) and a "consumer"
//    copy after it (the application reading recvbuff), so the event ordering at both ends is
//    exercised too.
// Eager ops and graph-captured ops take slots from separate ranges, every op from the first
// slot of its range (ce_allgather.cc: no cursor carries over, so a capture discarded or retried
// on one rank shifts nothing); the simulations mix both kinds, either on one set of streams (a
// graph launched on the stream that issues the eager ops) or on two sets that run concurrently
// (ce_exec's eager streams and capture streams, a graph launched on another stream).
// Every test runs for both directions (test names end in pull / push).
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
#include <tuple>
#include <vector>

#include "plan_simulator.h"

namespace zc {
// Lets gtest print a direction parameter as a word; internal linkage, found by ADL.
static void PrintTo(CeDirection d, std::ostream* os) {
  *os << (d == CeDirection::kPush ? "push" : "pull");
}
}  // namespace zc

namespace {

using zc::AllGatherArgs;
using zc::ArenaLayout;
using zc::CeDirection;
using zc::kMaxRanks;
using zc::PlanOp;
using zc::PlanOpKind;
using zc::PlanStream;
using zc::RankView;
using zc::SlotRange;
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
constexpr CeDirection kDirections[] = {CeDirection::kPull, CeDirection::kPush};

const char* direction_name(CeDirection d) { return d == CeDirection::kPush ? "push" : "pull"; }

// The two halves of the slots, split as the communicator splits them (ce_allgather.cc).
SlotRange eager_range(const ArenaLayout& L) { return {0, L.eager_slots}; }
SlotRange graph_range(const ArenaLayout& L) { return {L.eager_slots, L.nslots - L.eager_slots}; }
bool in_range(const SlotRange& r, int slot) { return slot >= r.first && slot < r.first + r.count; }

// The bytes of one rank's chunk that go through one slot at once: the whole slot (pull) or
// the sender's sub-slot (push).
uint64_t piece_bytes(const ArenaLayout& L, int nranks, CeDirection d) {
  return d == CeDirection::kPush ? zc::push_piece_bytes(L, nranks) : L.slot_bytes;
}
uint64_t pieces_of(uint64_t bytes, uint64_t piece) { return (bytes + piece - 1) / piece; }

// ---------------------------------------------------------------------------------------------
// A world: N ranks' arenas and, per all-gather, every rank's buffers; builds the plans the
// way the real communicator does (each op from the first slot of its kind's range).

struct OpSpec {
  uint64_t bytes = 0;
  std::vector<bool> in_place;  // per rank
  bool captured = false;       // captured into a graph: graph slots
};

// Edits rank `rank`'s plan of op `op` before it is run (negative tests).
using Mutator = std::function<void(int rank, size_t op, std::vector<PlanOp>* plan)>;

PlanOp user_copy(uint64_t dst, uint64_t src, uint64_t bytes) {
  return PlanOp{PlanStream::kUser, PlanOpKind::kCopy, 0, {}, dst, src, bytes};
}

class World {
 public:
  // separate_lanes: captured ops run on their own streams and events (concurrently with the
  // eager ones) rather than on the eager ops' streams.
  World(int nranks, const ArenaLayout& layout, std::vector<OpSpec> ops, uint64_t data_seed,
        CeDirection direction = CeDirection::kPull, bool separate_lanes = false)
      : n_(nranks),
        layout_(layout),
        ops_(std::move(ops)),
        direction_(direction),
        lanes_(separate_lanes) {
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
      o.reuse.resize(n_);
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
        if (!ops_[k].in_place[r]) {
          add(&o.send[r], b, tag + "send");
          add(&o.reuse[r], b, tag + "reuse");
          for (size_t i = 0; i < b; ++i)
            o.reuse[r][i] = static_cast<uint8_t>(o.source[r][i] ^ 0x5a);
        }
      }
    }
    memory_.reset(new MemoryMap(std::move(regions)));
  }

  const MemoryMap& memory() const { return *memory_; }
  const ArenaLayout& layout() const { return layout_; }

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

  // The simulator's "ranks": [0, n) every rank's eager streams and, with separate lanes,
  // [n, 2n) every rank's capture streams.
  size_t lanes() const { return lanes_ ? 2 * static_cast<size_t>(n_) : static_cast<size_t>(n_); }
  std::vector<std::string> lane_names() const {
    std::vector<std::string> names;
    for (size_t i = 0; i < lanes(); ++i)
      names.push_back("rank " + std::to_string(i % n_) + (i >= size_t(n_) ? " (capture)" : ""));
    return names;
  }

  // Every lane's ops for all-gathers [first, last), each wrapped in the application's copies
  // on the user stream: read the old recvbuff, fill sendbuff, then (after the all-gather)
  // read recvbuff and reuse an out-of-place sendbuff. Must be called in op order.
  std::vector<std::vector<PlanOp>> build(size_t first, size_t last, const Mutator& mutate) {
    std::vector<std::vector<PlanOp>> plans(lanes());
    for (size_t k = first; k < last; ++k) {
      const bool captured = ops_[k].captured;
      for (int r = 0; r < n_; ++r) {
        std::vector<PlanOp>& out = plans[lanes_ && captured ? n_ + r : r];
        const AllGatherArgs a = args(k, r);
        const OpBuffers& o = bufs_[k];
        // The application still reads recvbuff's old contents, then fills sendbuff.
        out.push_back(user_copy(addr_of(o.prior[r].data()), a.recv, a.bytes * n_));
        out.push_back(user_copy(a.send, addr_of(o.source[r].data()), a.bytes));
        std::vector<PlanOp> plan;
        uint64_t cursor = 0;
        zc::build_allgather_plan(layout_, view(r), a,
                                 captured ? graph_range(layout_) : eager_range(layout_), &cursor,
                                 &plan, direction_);
        if (mutate) mutate(r, k, &plan);
        out.insert(out.end(), plan.begin(), plan.end());
        out.push_back(user_copy(addr_of(o.observed[r].data()), a.recv, a.bytes * n_));
        if (!ops_[k].in_place[r])
          out.push_back(user_copy(a.send, addr_of(o.reuse[r].data()), a.bytes));
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
        if (!ops_[k].in_place[r] && memcmp(o.send[r].data(), o.reuse[r].data(), b) != 0)
          return tag + "sendbuff was modified by the all-gather";
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
    // reuse: what the application writes into an out-of-place sendbuff after the op.
    std::vector<std::vector<uint8_t>> source, send, recv, observed, prior, reuse;
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
        for (int q = 0; q < zc::kMaxPieces; ++q)
          if (layout_.ready_offset(s, p, q) == off)
            return "ready[slot " + std::to_string(s) + "][piece " + std::to_string(q) + "][rank " +
                   std::to_string(p) + "]";
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
  CeDirection direction_;
  bool lanes_;
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
  CeDirection direction = CeDirection::kPull;
  bool separate_lanes = false;

  std::string describe() const {
    std::ostringstream os;
    os << direction_name(direction) << ", " << nranks << " ranks, " << layout.nslots << " slots of "
       << layout.slot_bytes << " B (" << layout.eager_slots << " eager), "
       << (separate_lanes ? "captured ops on their own streams" : "one set of streams")
       << ", ops (e = eager, g = captured):";
    for (const OpSpec& o : ops) {
      os << " " << (o.captured ? 'g' : 'e') << o.bytes << "B/";
      for (bool ip : o.in_place) os << (ip ? 'i' : 'o');
    }
    return os.str();
  }
};

// Small slots, so that an op spans several pieces and slots wrap around within an op; range
// sizes 2 and 2, 3 and 2, 6 and 2 (eager and graph). Every slot holds at least 8 bytes per rank
// for 2 to 8 ranks, so push has a sub-slot per sender.
std::vector<ArenaLayout> small_layouts() {
  return {ArenaLayout::make(4 * 64, 64), ArenaLayout::make(2 * 64, 64),
          ArenaLayout::make(3 * 40, 40), ArenaLayout::make(64, 64),
          ArenaLayout::make(5 * 48, 48), ArenaLayout::make(8 * 32, 32)};
}

uint64_t random_size(const ArenaLayout& l, std::mt19937_64& rng) {
  const uint64_t s = l.slot_bytes, all = s * static_cast<uint64_t>(l.nslots);
  const uint64_t picks[] = {1,     2,     3,         7,   s - 1,   s,
                            s + 1, 2 * s, 3 * s + 5, all, all + 1, 2 * all + 3};
  if (rng() % 4 == 0) return 1 + rng() % (5 * s);
  return picks[rng() % (sizeof(picks) / sizeof(picks[0]))];
}

OpSpec random_op(int nranks, uint64_t bytes, std::mt19937_64& rng) {
  OpSpec o;
  o.bytes = bytes;
  for (int r = 0; r < nranks; ++r) o.in_place.push_back(rng() % 2 == 0);
  o.captured = rng() % 2 == 0;
  return o;
}

Scenario random_scenario(int nranks, size_t nops, CeDirection direction, std::mt19937_64& rng) {
  Scenario sc;
  sc.nranks = nranks;
  sc.direction = direction;
  const std::vector<ArenaLayout> layouts = small_layouts();
  sc.layout = layouts[rng() % layouts.size()];
  sc.separate_lanes = rng() % 2 == 0;
  for (size_t k = 0; k < nops; ++k)
    sc.ops.push_back(random_op(nranks, random_size(sc.layout, rng), rng));
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
  World w(sc.nranks, sc.layout, sc.ops, rng(), sc.direction, sc.separate_lanes);
  const size_t nops = sc.ops.size();
  const size_t step = one_at_a_time ? 1 : nops;
  for (size_t first = 0; first < nops; first += step) {
    const size_t last = std::min(nops, first + step);
    std::vector<std::vector<PlanOp>> plans = w.build(first, last, mutate);
    SimResult res = Simulator(plans, w.memory(), w.lane_names()).run(rng(), detect_races);
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

// Where a data copy's source or destination lies.
struct Place {
  enum Kind { kSend, kRecv, kSlot, kFlags, kElsewhere } kind = kElsewhere;
  int rank = -1;        // kRecv: whose chunk; kSlot, kFlags: whose arena
  int slot = -1;        // kSlot
  uint64_t offset = 0;  // kSlot: offset inside the slot; kSend, kRecv: inside the buffer/chunk

  std::string describe() const {
    switch (kind) {
      case kSend:
        return "sendbuff";
      case kRecv:
        return "recvbuff chunk " + std::to_string(rank);
      case kSlot:
        return "arena[" + std::to_string(rank) + "] slot " + std::to_string(slot) + " + " +
               std::to_string(offset);
      case kFlags:
        return "arena[" + std::to_string(rank) + "] flags";
      case kElsewhere:
        break;
    }
    return "elsewhere";
  }
};

// A byte range is one Place only if it lies wholly inside it (one chunk, one slot); a source
// inside sendbuff is sendbuff even when that is also my chunk of recvbuff (in place).
Place locate(const ArenaLayout& L, const RankView& v, const AllGatherArgs& a, uint64_t x,
             uint64_t bytes, bool source) {
  Place pl;
  const bool in_send = inside(x, bytes, a.send, a.bytes);
  if (source && in_send) {
    pl.kind = Place::kSend;
    pl.offset = x - a.send;
    return pl;
  }
  if (a.bytes > 0 && inside(x, bytes, a.recv, a.bytes * v.nranks)) {
    const uint64_t chunk = (x - a.recv) / a.bytes;
    if (bytes > 0 && (x + bytes - 1 - a.recv) / a.bytes == chunk) {
      pl.kind = Place::kRecv;
      pl.rank = static_cast<int>(chunk);
      pl.offset = x - a.recv - chunk * a.bytes;
    }
    return pl;
  }
  if (in_send) {
    pl.kind = Place::kSend;
    pl.offset = x - a.send;
    return pl;
  }
  for (int p = 0; p < v.nranks; ++p) {
    if (!inside(x, bytes, v.arena[p], L.arena_bytes())) continue;
    pl.rank = p;
    const uint64_t off = x - v.arena[p];
    if (inside(off, bytes, 0, L.flags_bytes)) {
      pl.kind = Place::kFlags;
    } else if (off >= L.flags_bytes && bytes > 0) {
      const uint64_t rel = off - L.flags_bytes;
      if (rel / L.slot_bytes == (rel + bytes - 1) / L.slot_bytes) {
        pl.kind = Place::kSlot;
        pl.slot = static_cast<int>(rel / L.slot_bytes);
        pl.offset = rel % L.slot_bytes;
      }
    }
    return pl;
  }
  return pl;
}

// Why a data copy from `from` to `to` is not one of the direction's data paths; empty if it is.
std::string copy_problem(const ArenaLayout& L, const RankView& v, const SlotRange& slots,
                         CeDirection d, const Place& from, const Place& to, uint64_t bytes) {
  const int me = v.rank, n = v.nranks;
  const bool push = d == CeDirection::kPush;
  // The rules that tell the directions apart come first, so that the message names them.
  if (!push && (to.kind == Place::kSlot || to.kind == Place::kFlags) && to.rank != me)
    return "pull writes a peer's arena by a data copy";
  if (push && (from.kind == Place::kSlot || from.kind == Place::kFlags) && from.rank != me)
    return "push reads a peer's arena";
  if (from.kind == Place::kFlags || to.kind == Place::kFlags)
    return "a data copy touches a flag region";
  if (from.kind == Place::kElsewhere) return "reads outside sendbuff and one slot";
  if (to.kind == Place::kElsewhere) return "writes outside one chunk of recvbuff and one slot";
  if (to.kind == Place::kSend) return "writes sendbuff";
  if (from.kind == Place::kRecv) return "reads recvbuff";
  if ((from.kind == Place::kSlot && !in_range(slots, from.slot)) ||
      (to.kind == Place::kSlot && !in_range(slots, to.slot)))
    return "uses a slot outside the op's slot range";
  if (from.kind == Place::kSlot && to.kind == Place::kSlot) return "copies a slot to a slot";
  if (from.kind == Place::kSend && to.kind == Place::kRecv)
    return to.rank == me ? "" : "copies sendbuff into another rank's chunk";
  if (!push) {
    // A round of the chunk sits at the start of its slot, so a piece's offset in the slot is
    // its offset in the chunk modulo the slot size.
    if (from.kind == Place::kSend) {  // copy-in: my piece into my own slot
      if (to.rank != me) return "copy-in writes a peer's slot";
      return to.offset == from.offset % L.slot_bytes
                 ? ""
                 : "copy-in puts a piece at another offset of the slot than its round's";
    }
    // pull: a peer's slot into that peer's chunk
    if (from.rank == me) return "pull reads its own slot";
    if (from.offset != to.offset % L.slot_bytes)
      return "pull reads another offset of the slot than the piece's";
    return to.rank == from.rank ? "" : "puts a peer's piece into another rank's chunk";
  }
  const uint64_t piece = zc::push_piece_bytes(L, n);
  if (piece == 0) return "push piece of 0 bytes";
  if (from.kind == Place::kSend) {  // send: my piece into my sub-slot of a peer's slot
    if (to.rank == me) return "push writes its own slot";
    if (to.offset != static_cast<uint64_t>(zc::push_subslot(me, to.rank, n)) * piece ||
        bytes > piece)
      return "push writes outside its own sub-slot of the peer's slot";
    return "";
  }
  // drain: sender r's sub-slot of my slot into r's chunk
  const uint64_t idx = from.offset / piece;
  if (from.offset != idx * piece || idx + 1 >= static_cast<uint64_t>(n) || bytes > piece)
    return "push reads something other than one sender's sub-slot";
  const int r = (me + 1 + static_cast<int>(idx)) % n;  // inverse of push_subslot(r, me, n)
  return to.rank == r ? "" : "puts a sender's piece into another rank's chunk";
}

// Problems of one rank's plan; empty when the plan only touches what it may.
std::vector<std::string> structure_problems(const ArenaLayout& L, const RankView& v,
                                            const AllGatherArgs& a, const SlotRange& slots,
                                            CeDirection d, const std::vector<PlanOp>& plan) {
  std::vector<std::string> bad;
  const int me = v.rank, n = v.nranks;
  const uint64_t mine = v.arena[me];
  // Flag addresses this rank may wait on and reset / signal: only those of its slot range.
  std::set<uint64_t> wait_ok, signal_ok;
  for (int s = slots.first; s < slots.first + slots.count; ++s)
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      for (int q = 0; q < zc::kMaxPieces; ++q) {
        wait_ok.insert(mine + L.ready_offset(s, p, q));
        signal_ok.insert(v.arena[p] + L.ready_offset(s, me, q));
      }
      wait_ok.insert(mine + L.done_offset(s, p));
      signal_ok.insert(v.arena[p] + L.done_offset(s, me));
    }
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
        const Place from = locate(L, v, a, op.src, op.bytes, /*source=*/true);
        const Place to = locate(L, v, a, op.dst, op.bytes, /*source=*/false);
        const std::string why = copy_problem(L, v, slots, d, from, to, op.bytes);
        if (!why.empty())
          bad.push_back(at + why + " (" + from.describe() + " -> " + to.describe() + ", " +
                        std::to_string(op.bytes) + " B)");
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
  // Batches (ce_plan.h): adjacent copies (or signals) of one stream may run concurrently, so
  // none may write what another of the run reads or writes.
  for (size_t i = 0; i < plan.size();) {
    const bool copyish = plan[i].kind == PlanOpKind::kCopy || plan[i].kind == PlanOpKind::kSignal;
    size_t j = i + 1;
    while (copyish && j < plan.size() && plan[j].kind == plan[i].kind &&
           plan[j].stream == plan[i].stream)
      ++j;
    for (size_t x = i; x < j; ++x)
      for (size_t y = x + 1; y < j; ++y) {
        const PlanOp &p = plan[x], &q = plan[y];
        if (zc_test::overlaps(p.dst, p.bytes, q.dst, q.bytes) ||
            zc_test::overlaps(p.dst, p.bytes, q.src, q.bytes) ||
            zc_test::overlaps(q.dst, q.bytes, p.src, p.bytes))
          bad.push_back("ops " + std::to_string(x) + " and " + std::to_string(y) +
                        " of one batch touch the same bytes");
      }
    i = j;
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

// The slots of my arena a plan touches (its flags and its slots' bytes).
std::set<int> slots_touched(const ArenaLayout& L, const RankView& v,
                            const std::vector<PlanOp>& plan) {
  std::set<int> out;
  const uint64_t mine = v.arena[v.rank];
  auto note = [&](uint64_t x) {
    if (x < mine || x - mine >= L.arena_bytes()) return;
    const uint64_t off = x - mine;
    for (int s = 0; s < L.nslots; ++s)
      for (int p = 0; p < v.nranks; ++p) {
        for (int q = 0; q < zc::kMaxPieces; ++q)
          if (off == L.ready_offset(s, p, q)) out.insert(s);
        if (off == L.done_offset(s, p)) out.insert(s);
      }
    if (off >= L.flags_bytes) out.insert(static_cast<int>((off - L.flags_bytes) / L.slot_bytes));
  };
  for (const PlanOp& op : plan) {
    if (op.kind == PlanOpKind::kRecord || op.kind == PlanOpKind::kWaitEvent) continue;
    note(op.dst);
    if (op.kind == PlanOpKind::kCopy) note(op.src);
  }
  return out;
}

bool same_op(const PlanOp& x, const PlanOp& y) {
  return x.stream == y.stream && x.kind == y.kind && x.event == y.event && x.dst == y.dst &&
         x.src == y.src && x.bytes == y.bytes;
}

bool same_plan(const std::vector<PlanOp>& x, const std::vector<PlanOp>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (!same_op(x[i], y[i])) return false;
  return true;
}

std::string direction_param_name(const ::testing::TestParamInfo<CeDirection>& i) {
  return direction_name(i.param);
}

// ---------------------------------------------------------------------------------------------
// Tests: the layout.

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
        for (int q = 0; q < zc::kMaxPieces; ++q) flag(L.ready_offset(s, p, q));
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

TEST(CePlanLayout, BothSlotRangesHoldAtLeastTwoSlots) {
  // Two slots per range let one piece's copy-in (push: send) overlap the previous piece's
  // pulls (push: drains); the ranges split the slots without overlap.
  for (const ArenaLayout& L : small_layouts()) {
    SCOPED_TRACE(std::to_string(L.nslots) + " slots of " + std::to_string(L.slot_bytes));
    EXPECT_GE(eager_range(L).count, 2);
    EXPECT_GE(graph_range(L).count, 2);
    EXPECT_EQ(eager_range(L).count + graph_range(L).count, L.nslots);
  }
  for (uint64_t pool : {128ull << 10, 1ull << 20, 256ull << 20, 1ull << 30}) {
    const ArenaLayout L = ArenaLayout::make(pool, 64ull << 10);
    EXPECT_GE(L.eager_slots, 2) << pool;
    EXPECT_GE(L.nslots - L.eager_slots, 2) << pool;
  }
}

TEST(CePlanLayout, PushPiecesTileASlotWithOneSubSlotPerSender) {
  // Every layout the configuration allows (chunk >= 64 KiB, a multiple of 4 KiB, pool >= 2
  // chunks), every communicator size: n sub-slots fit in a slot, each non-empty, 4 KiB aligned
  // once that large, and at most one 4 KiB granule smaller than an even split.
  const uint64_t K = 1024;
  const std::pair<uint64_t, uint64_t> configs[] = {
      {128 * K, 64 * K},         {200 * K, 64 * K},        {1024 * K, 64 * K},
      {256 * K * K, 32 * K * K}, {96 * K * K, 32 * K * K}, {(1ull << 30) + 4 * K, 68 * K}};
  for (const auto& c : configs) {
    const ArenaLayout L = ArenaLayout::make(c.first, c.second);
    for (int n = 2; n <= kMaxRanks; ++n) {
      SCOPED_TRACE("slot " + std::to_string(L.slot_bytes) + ", " + std::to_string(n) + " ranks");
      const uint64_t piece = zc::push_piece_bytes(L, n);
      EXPECT_GT(piece, 0u);
      EXPECT_LE(piece * static_cast<uint64_t>(n - 1), L.slot_bytes);
      if (piece >= 4096) {
        EXPECT_EQ(piece % 4096, 0u);
      }
      EXPECT_LT(L.slot_bytes / static_cast<uint64_t>(n - 1) - piece, 4096u);
    }
  }
  // The small layouts of the simulations: exact split, no alignment below 4 KiB.
  EXPECT_EQ(zc::push_piece_bytes(ArenaLayout::make(4 * 64, 64), 3), 32u);
  EXPECT_EQ(zc::push_piece_bytes(ArenaLayout::make(4 * 64, 64), 8), 9u);
  // Sub-slots: every sender but the receiver gets a distinct one.
  for (int n = 2; n <= kMaxRanks; ++n)
    for (int r = 0; r < n; ++r) {
      std::set<int> seen;
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        const int idx = zc::push_subslot(p, r, n);
        EXPECT_GE(idx, 0);
        EXPECT_LT(idx, n - 1);
        EXPECT_TRUE(seen.insert(idx).second) << "sub-slot " << idx << " given twice";
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests: the structure of a plan, per direction.

class CePlanStructure : public ::testing::TestWithParam<CeDirection> {};

TEST_P(CePlanStructure, TouchesOnlyWhatTheDirectionAllows) {
  const CeDirection dir = GetParam();
  std::mt19937_64 rng(7);
  for (int n : {2, 3, 4, 8, kMaxRanks}) {
    std::vector<ArenaLayout> layouts = small_layouts();
    // 64 ranks: slots of 32 B (pull only: push would get no sub-slot per sender) and of
    // 256 B (push: 4 B per sender).
    if (n == kMaxRanks) layouts = {ArenaLayout::make(2 * 64, 64), ArenaLayout::make(4 * 256, 256)};
    for (const ArenaLayout& L : layouts) {
      // Push needs slot_bytes >= nranks (push_piece_bytes would be 0).
      if (dir == CeDirection::kPush && zc::push_piece_bytes(L, n) == 0) continue;
      const uint64_t piece = piece_bytes(L, n, dir);
      for (int trial = 0; trial < (n == kMaxRanks ? 2 : 6); ++trial) {
        std::vector<OpSpec> ops(1);
        // 64 ranks: a few pieces (with wrap-around), as the plan of 64 ranks is long.
        ops[0] = random_op(n, n == kMaxRanks ? 1 + rng() % (5 * piece) : random_size(L, rng), rng);
        const SlotRange range = trial % 2 ? graph_range(L) : eager_range(L);
        World w(n, L, ops, rng());
        for (int r = 0; r < n; ++r) {
          SCOPED_TRACE(std::string(direction_name(dir)) + " nranks " + std::to_string(n) +
                       " rank " + std::to_string(r) + " bytes " + std::to_string(ops[0].bytes) +
                       " slot " + std::to_string(L.slot_bytes) + " range " +
                       std::to_string(range.first) + "+" + std::to_string(range.count) +
                       (ops[0].in_place[r] ? " in place" : ""));
          std::vector<PlanOp> plan;
          const uint64_t start = static_cast<uint64_t>(trial) * 3;  // any running cursor
          uint64_t cursor = start;
          zc::build_allgather_plan(L, w.view(r), w.args(0, r), range, &cursor, &plan, dir);
          for (const std::string& p :
               structure_problems(L, w.view(r), w.args(0, r), range, dir, plan))
            ADD_FAILURE() << p;
          std::vector<uint64_t> push_pieces;
          const uint64_t expect_pieces = dir == CeDirection::kPush
                                             ? zc::split_push(ops[0].bytes, piece, &push_pieces)
                                             : pieces_of(ops[0].bytes, piece);
          EXPECT_EQ(cursor, start + expect_pieces);
          // Deterministic: the same inputs give the same plan (every rank must agree).
          std::vector<PlanOp> again;
          uint64_t cursor2 = start;
          zc::build_allgather_plan(L, w.view(r), w.args(0, r), range, &cursor2, &again, dir);
          EXPECT_TRUE(same_plan(plan, again));
        }
      }
    }
  }
}

TEST_P(CePlanStructure, DefaultsToPull) {
  // ce_allgather passes the direction explicitly; callers that do not get pull.
  World w(3, ArenaLayout::make(4 * 64, 64), {OpSpec{100, {false, true, false}}}, 1);
  std::vector<PlanOp> given, defaulted;
  uint64_t c1 = 0, c2 = 0;
  const SlotRange range = eager_range(w.layout());
  zc::build_allgather_plan(w.layout(), w.view(1), w.args(0, 1), range, &c1, &given, GetParam());
  zc::build_allgather_plan(w.layout(), w.view(1), w.args(0, 1), range, &c2, &defaulted);
  EXPECT_EQ(same_plan(given, defaulted), GetParam() == CeDirection::kPull);
}

TEST_P(CePlanStructure, AppendsToTheCallersPlan) {
  World w(2, ArenaLayout::make(4 * 64, 64), {OpSpec{100, {false, true}}}, 1);
  std::vector<PlanOp> plan(1, PlanOp{PlanStream::kUser, PlanOpKind::kRecord, 2, {}, 0, 0, 0});
  uint64_t cursor = 0;
  zc::build_allgather_plan(w.layout(), w.view(0), w.args(0, 0), SlotRange{0, w.layout().nslots},
                           &cursor, &plan, GetParam());
  ASSERT_GT(plan.size(), 1u);
  EXPECT_EQ(plan[0].kind, PlanOpKind::kRecord);
  EXPECT_EQ(plan[0].event, 2);
}

TEST_P(CePlanStructure, APiecesPeerCopiesFormOneBatch) {
  // A piece's copies to (push) or from (pull) every peer must be adjacent ops of one stream,
  // so that ce_exec issues them as one batch, which the driver spreads over copy engines.
  const bool push = GetParam() == CeDirection::kPush;
  for (int n : {2, 3, 4, 8, 9, 16}) {
    SCOPED_TRACE("nranks " + std::to_string(n));
    const ArenaLayout L = ArenaLayout::make(8 * 4096 * 16, 4096 * 16);
    World w(n, L, {OpSpec{3 * 4096 * 16 + 5, std::vector<bool>(n, false)}}, 3);
    const RankView& v = w.view(1);
    std::vector<PlanOp> plan;
    uint64_t cursor = 0;
    zc::build_allgather_plan(L, v, w.args(0, 1), eager_range(L), &cursor, &plan, GetParam());
    auto peer_of = [&](const PlanOp& op) {
      const uint64_t far = push ? op.dst : op.src;
      for (int p = 0; p < n; ++p)
        if (p != v.rank && far >= v.arena[p] && far < v.arena[p] + L.arena_bytes()) return p;
      return -1;
    };
    int runs = 0;
    for (size_t i = 0; i < plan.size();) {
      if (plan[i].kind != PlanOpKind::kCopy || peer_of(plan[i]) < 0) {
        ++i;
        continue;
      }
      std::set<int> peers;
      size_t j = i;
      for (; j < plan.size() && plan[j].kind == PlanOpKind::kCopy &&
             plan[j].stream == plan[i].stream && peer_of(plan[j]) >= 0;
           ++j)
        EXPECT_TRUE(peers.insert(peer_of(plan[j])).second) << "a peer twice in one batch";
      EXPECT_EQ(static_cast<int>(peers.size()), n - 1) << "a batch without every peer, op " << i;
      ++runs;
      i = j;
    }
    // Push: one piece per slot; pull: an op's first round is cut into several pieces.
    if (push)
      EXPECT_EQ(static_cast<uint64_t>(runs), cursor) << "one batch per piece";
    else
      EXPECT_GE(static_cast<uint64_t>(runs), cursor) << "one batch per piece";
  }
}

TEST_P(CePlanStructure, CheckerRejectsForbiddenOps) {
  // The structure check must be able to fail, for the right reason: plant one forbidden op
  // at a time, including the other direction's data copies.
  const CeDirection dir = GetParam();
  const bool push = dir == CeDirection::kPush;
  const ArenaLayout L = ArenaLayout::make(4 * 64, 64);
  World w(3, L, {OpSpec{100, {false, false, false}}}, 1);
  const RankView v = w.view(0);  // rank 0 of 3
  const AllGatherArgs a = w.args(0, 0);
  const SlotRange range = graph_range(L);
  const int s = range.first, outside = eager_range(L).first;
  const uint64_t piece = zc::push_piece_bytes(L, 3);
  std::vector<PlanOp> base;
  uint64_t cursor = 0;
  zc::build_allgather_plan(L, v, a, range, &cursor, &base, dir);
  ASSERT_TRUE(structure_problems(L, v, a, range, dir, base).empty());
  auto op = [](PlanStream st, PlanOpKind k, uint64_t dst, uint64_t src = 0, uint64_t bytes = 0,
               uint8_t event = 0) { return PlanOp{st, k, event, {}, dst, src, bytes}; };
  const PlanStream in = PlanStream::kCopyIn, out = PlanStream::kPull;
  // Where this direction legally puts a piece of sendbuff (pull: my slot; push: my sub-slot
  // of peer 1's slot), so that each case below breaks exactly one rule.
  const uint64_t piece_dst = push ? v.arena[1] + L.slot_offset(s) : v.arena[0] + L.slot_offset(s);
  struct Case {
    PlanOp op;
    const char* because;
  };
  std::vector<Case> cases = {
      {op(out, PlanOpKind::kWrite0, v.arena[1] + L.ready_offset(s, 0)),
       "writes outside its own arena's flags"},
      {op(out, PlanOpKind::kWaitEq1, v.arena[1] + L.done_offset(s, 0)), "waits on something"},
      {op(out, PlanOpKind::kWaitEq1, v.arena[0] + L.ready_offset(outside, 1)),
       "waits on something"},
      {op(in, PlanOpKind::kCopy, piece_dst, a.send + 96, 8), "reads outside"},
      {op(in, PlanOpKind::kCopy, piece_dst + L.slot_bytes - 4, a.send, 8), "writes outside"},
      {op(in, PlanOpKind::kCopy, piece_dst - L.slot_offset(s) + L.slot_offset(outside), a.send, 8),
       "outside the op's slot range"},
      {op(in, PlanOpKind::kCopy, push ? v.arena[1] : v.arena[0], a.send, 8), "flag region"},
      {op(in, PlanOpKind::kCopy, a.recv + a.bytes, a.send, 8), "another rank's chunk"},
      {op(in, PlanOpKind::kCopy, a.send, a.recv, 8), "writes sendbuff"},
      {op(in, PlanOpKind::kCopy, piece_dst, a.recv, 8), "reads recvbuff"},
      {op(in, PlanOpKind::kSignal, v.arena[1] + L.ready_offset(s, 2), v.arena[0] + L.one_offset(),
          4),
       "signals something other"},
      {op(in, PlanOpKind::kSignal, v.arena[1] + L.ready_offset(outside, 0),
          v.arena[0] + L.one_offset(), 4),
       "signals something other"},
      {op(in, PlanOpKind::kSignal, v.arena[1] + L.ready_offset(s, 0), v.arena[1] + L.one_offset(),
          4),
       "constant 1 of its own arena"},
      {op(PlanStream::kUser, PlanOpKind::kRecord, 0, 0, 0, zc::kPlanEvents), "event out of range"},
      {op(PlanStream::kUser, static_cast<PlanOpKind>(6), 0), "unknown op kind"},
  };
  if (!push) {
    cases.push_back({op(in, PlanOpKind::kCopy, v.arena[1] + L.slot_offset(s), a.send, 8),
                     "pull writes a peer's arena"});
    cases.push_back({op(out, PlanOpKind::kCopy, a.recv + a.bytes, v.arena[0] + L.slot_offset(s), 8),
                     "pull reads its own slot"});
    cases.push_back(
        {op(out, PlanOpKind::kCopy, a.recv + 2 * a.bytes, v.arena[1] + L.slot_offset(s), 8),
         "another rank's chunk"});
    cases.push_back(
        {op(out, PlanOpKind::kCopy, a.recv + a.bytes, v.arena[1] + L.slot_offset(s) + 8, 8),
         "another offset of the slot"});
  } else {
    cases.push_back({op(out, PlanOpKind::kCopy, a.recv + a.bytes, v.arena[1] + L.slot_offset(s), 8),
                     "push reads a peer's arena"});
    cases.push_back({op(in, PlanOpKind::kCopy, v.arena[0] + L.slot_offset(s), a.send, 8),
                     "push writes its own slot"});
    // Rank 0 of 3 writes sub-slot 1 of rank 1's slots; rank 2 writes sub-slot 0.
    cases.push_back({op(in, PlanOpKind::kCopy, v.arena[1] + L.slot_offset(s), a.send, piece),
                     "its own sub-slot"});  // rank 2's sub-slot
    cases.push_back({op(in, PlanOpKind::kCopy, v.arena[1] + L.slot_offset(s), a.send, piece + 1),
                     "its own sub-slot"});  // starts in rank 2's, spills into its own
    cases.push_back(
        {op(in, PlanOpKind::kCopy, v.arena[1] + L.slot_offset(s) + piece + 1, a.send, 4),
         "its own sub-slot"});
    cases.push_back(
        {op(out, PlanOpKind::kCopy, a.recv + a.bytes, v.arena[0] + L.slot_offset(s) + piece + 1, 4),
         "one sender's sub-slot"});  // not at a sub-slot's start
    cases.push_back(
        {op(out, PlanOpKind::kCopy, a.recv + 2 * a.bytes, v.arena[0] + L.slot_offset(s), 4),
         "another rank's chunk"});  // sub-slot 0 of rank 0's slot holds rank 1's piece
  }
  for (const Case& c : cases) {
    std::vector<PlanOp> plan = base;
    plan.insert(plan.begin() + 4, c.op);
    const std::vector<std::string> problems = structure_problems(L, v, a, range, dir, plan);
    bool named = false;
    for (const std::string& p : problems) named = named || p.find(c.because) != std::string::npos;
    EXPECT_TRUE(named) << "a " << kind_name(c.op.kind) << " that " << c.because
                       << " was not rejected for it (" << problems.size() << " problems"
                       << (problems.empty() ? "" : ", first: " + problems[0]) << ")";
  }  // A copy repeated right after itself lands in the same batch as itself: same bytes.
  std::vector<PlanOp> twice = base;
  for (size_t i = 0; i < twice.size(); ++i)
    if (twice[i].kind == PlanOpKind::kCopy) {
      twice.insert(twice.begin() + static_cast<long>(i) + 1, twice[i]);
      break;
    }
  bool named = false;
  for (const std::string& p : structure_problems(L, v, a, range, dir, twice))
    named = named || p.find("of one batch touch the same bytes") != std::string::npos;
  EXPECT_TRUE(named) << "two copies of one batch into the same bytes were not rejected";
}

TEST_P(CePlanStructure, EagerAndCapturedOpsUseSeparateSlotsAndCursors) {
  // The comm builds eager ops from the eager range with one cursor and captured ops from the
  // graph range with another: interleaving them changes neither kind's plans, and no slot is
  // touched by both kinds.
  const CeDirection dir = GetParam();
  std::mt19937_64 rng(11);
  for (const ArenaLayout& L : small_layouts()) {
    const int n = 3;
    std::vector<OpSpec> ops;
    for (int k = 0; k < 12; ++k) ops.push_back(random_op(n, random_size(L, rng), rng));
    World w(n, L, ops, rng());
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE("slot " + std::to_string(L.slot_bytes) + " rank " + std::to_string(r));
      uint64_t eager = 0, graph = 0, eager_alone = 0, graph_alone = 0;
      std::set<int> eager_slots, graph_slots;
      for (size_t k = 0; k < ops.size(); ++k) {
        const bool g = ops[k].captured;
        const SlotRange range = g ? graph_range(L) : eager_range(L);
        std::vector<PlanOp> mixed, alone;
        zc::build_allgather_plan(L, w.view(r), w.args(k, r), range, g ? &graph : &eager, &mixed,
                                 dir);
        // The same op in a sequence of only its own kind.
        zc::build_allgather_plan(L, w.view(r), w.args(k, r), range, g ? &graph_alone : &eager_alone,
                                 &alone, dir);
        EXPECT_TRUE(same_plan(mixed, alone)) << "op " << k;
        for (const std::string& p :
             structure_problems(L, w.view(r), w.args(k, r), range, dir, mixed))
          ADD_FAILURE() << "op " << k << ": " << p;
        for (int s : slots_touched(L, w.view(r), mixed)) {
          EXPECT_TRUE(in_range(range, s)) << "op " << k << " slot " << s;
          (g ? graph_slots : eager_slots).insert(s);
        }
      }
      for (int s : eager_slots) EXPECT_EQ(graph_slots.count(s), 0u) << "slot " << s;
      // Both ranges were used (12 random ops), and every slot of a range in turn.
      EXPECT_EQ(eager_slots.size(), static_cast<size_t>(L.eager_slots));
      EXPECT_EQ(graph_slots.size(), static_cast<size_t>(L.nslots - L.eager_slots));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Direction, CePlanStructure, ::testing::ValuesIn(kDirections),
                         direction_param_name);

// ---------------------------------------------------------------------------------------------
// Tests: simulations, per direction and number of ranks.

class CePlanSim : public ::testing::TestWithParam<std::tuple<int, CeDirection>> {
 protected:
  int nranks() const { return std::get<0>(GetParam()); }
  CeDirection direction() const { return std::get<1>(GetParam()); }
  // Push splits a slot among the n senders, so its plans have about n times the pieces: it
  // gets pull's number of runs * 3 / (n + 1) (about 2000 queued interleavings in all).
  int scaled(int pull_runs) const {
    return direction() == CeDirection::kPull ? pull_runs
                                             : std::max(pull_runs * 3 / (nranks() + 1), 1);
  }
};

TEST_P(CePlanSim, QueuedOpsGatherCorrectlyUnderRandomInterleavings) {
  const int n = nranks();
  // About 2600 interleavings in all for pull: fewer for more ranks, whose runs are longer.
  const int runs = scaled(n == 2 ? 1000 : n == 3 ? 800 : n == 4 ? 600 : 200);
  int lanes = 0, mixed = 0;
  for (uint64_t seed : seeds(static_cast<uint64_t>(n), runs)) {
    std::mt19937_64 rng(seed);
    const Scenario sc = random_scenario(n, 2 + rng() % 6, direction(), rng);
    const RunReport rep = run_scenario(sc, rng(), /*one_at_a_time=*/false);
    if (!rep.failure.empty()) {
      ADD_FAILURE() << "ZEROCTA_PLAN_SEED=" << seed << " (" << sc.describe() << ")\n"
                    << rep.failure;
      return;
    }
    const auto captured =
        std::count_if(sc.ops.begin(), sc.ops.end(), [](const OpSpec& o) { return o.captured; });
    mixed += captured > 0 && captured < static_cast<long>(sc.ops.size());
    lanes += sc.separate_lanes && captured > 0 && captured < static_cast<long>(sc.ops.size());
  }
  // The mix the test means to cover did occur (eager and captured ops in one run, also on
  // separate streams).
  if (!getenv("ZEROCTA_PLAN_SEED")) {
    EXPECT_GT(mixed, runs / 4);
    EXPECT_GT(lanes, runs / 8);
  }
}

TEST_P(CePlanSim, FlagsReturnToTheirInitialStateAfterEveryOp) {
  const int n = nranks();
  for (uint64_t seed : seeds(100 + static_cast<uint64_t>(n), scaled(n >= 8 ? 60 : 200))) {
    std::mt19937_64 rng(seed);
    const Scenario sc = random_scenario(n, 2 + rng() % 5, direction(), rng);
    const RunReport rep = run_scenario(sc, rng(), /*one_at_a_time=*/true);
    if (!rep.failure.empty()) {
      ADD_FAILURE() << "ZEROCTA_PLAN_SEED=" << seed << " (" << sc.describe() << ")\n"
                    << rep.failure;
      return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, CePlanSim,
                         ::testing::Combine(::testing::Values(2, 3, 4, 8),
                                            ::testing::ValuesIn(kDirections)),
                         [](const ::testing::TestParamInfo<std::tuple<int, CeDirection>>& i) {
                           return std::to_string(std::get<0>(i.param)) + "ranks_" +
                                  direction_name(std::get<1>(i.param));
                         });

class CePlanSimEdges : public ::testing::TestWithParam<CeDirection> {};

TEST_P(CePlanSimEdges, EmptyAndSixtyFourRanks) {
  const CeDirection dir = GetParam();
  // A zero-byte op (the route never sends one, but the plan must stay harmless).
  for (uint64_t seed : seeds(900, 20)) {
    Scenario sc;
    sc.nranks = 3;
    sc.direction = dir;
    sc.layout = ArenaLayout::make(4 * 64, 64);
    sc.separate_lanes = seed % 2 == 0;
    sc.ops = {OpSpec{0, {true, false, true}, seed % 3 == 0}, OpSpec{65, {false, true, false}}};
    const RunReport rep = run_scenario(sc, seed, false);
    EXPECT_TRUE(rep.failure.empty()) << "ZEROCTA_PLAN_SEED=" << seed << ": " << rep.failure;
  }
  // The largest communicator, every rank's flag column in use; the second op wraps around
  // its two graph slots. Push needs 64 sub-slots in a slot: 256-byte slots, 4 bytes each.
  for (uint64_t seed : seeds(901, 2)) {
    Scenario sc;
    sc.nranks = kMaxRanks;
    sc.direction = dir;
    sc.layout =
        dir == CeDirection::kPull ? ArenaLayout::make(2 * 64, 64) : ArenaLayout::make(4 * 256, 256);
    const uint64_t piece = piece_bytes(sc.layout, kMaxRanks, dir);
    std::mt19937_64 rng(seed);
    for (uint64_t bytes : {uint64_t{3}, 4 * piece + 2}) {
      OpSpec o = random_op(kMaxRanks, bytes, rng);
      o.captured = bytes > 3;
      sc.ops.push_back(o);
    }
    const RunReport rep = run_scenario(sc, seed, false);
    EXPECT_TRUE(rep.failure.empty()) << "ZEROCTA_PLAN_SEED=" << seed << ": " << rep.failure;
  }
}

INSTANTIATE_TEST_SUITE_P(Direction, CePlanSimEdges, ::testing::ValuesIn(kDirections),
                         direction_param_name);

// ---------------------------------------------------------------------------------------------
// Tests: the simulator catches broken protocols.

// Scenarios that reuse slots within an op, and ops that follow each other.
Scenario reuse_scenario(int n, CeDirection dir, std::mt19937_64& rng) {
  Scenario sc;
  sc.nranks = n;
  sc.direction = dir;
  sc.layout = ArenaLayout::make(2 * 64, 64);
  sc.separate_lanes = rng() % 2 == 0;
  for (int k = 0; k < 3; ++k) sc.ops.push_back(random_op(n, 64 * 5 + rng() % 64, rng));
  return sc;
}

struct Caught {
  int runs = 0, caught = 0;
  std::map<Outcome, int> by_outcome;  // kOk counts wrong data/flags
  std::string example;
};

// Runs broken plans until `enough` says so (or `runs` seeds are done).
Caught run_broken(
    uint64_t salt, int runs, CeDirection dir,
    const std::function<Mutator(const ArenaLayout&)>& breaker, bool detect_races,
    const std::function<bool(const Caught&)>& enough = [](const Caught&) { return false; }) {
  Caught c;
  for (uint64_t seed : seeds(salt, runs)) {
    std::mt19937_64 rng(seed);
    const Scenario sc = reuse_scenario(2 + static_cast<int>(rng() % 3), dir, rng);
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
      for (int q = 0; q < (done ? 1 : zc::kMaxPieces); ++q)
        if (off == (done ? L.done_offset(s, p) : L.ready_offset(s, p, q))) return true;
  return false;
}

class CePlanSimCatches : public ::testing::TestWithParam<CeDirection> {};

TEST_P(CePlanSimCatches, MissingSlotReuseWaitsAsRacesOrCorruption) {
  const CeDirection dir = GetParam();
  auto breaker = [](const ArenaLayout& layout) {
    return dropping(layout, [](const ArenaLayout& L, const RankView& v, const PlanOp& op) {
      return op.kind == PlanOpKind::kWaitEq1 && local_flag(L, v, op, /*done=*/true);
    });
  };
  // With the race detector: a copy-in (push: a send) overwrites a slot a peer is still
  // pulling (push: that the receiver is still draining).
  Caught races = run_broken(2000, 300, dir, breaker, true,
                            [](const Caught& c) { return c.by_outcome.count(Outcome::kRace) > 0; });
  EXPECT_GT(races.by_outcome[Outcome::kRace], 0) << races.caught << "/" << races.runs;
  // Without it, the damage itself shows: wrong data, or a lost ready signal that deadlocks.
  Caught plain =
      run_broken(2001, 300, dir, breaker, false, [](const Caught& c) { return c.caught > 0; });
  EXPECT_GT(plain.caught, 0) << "dropping the done waits went unnoticed in " << plain.runs
                             << " runs";
  std::cout << "[ info     ] " << direction_name(dir) << " without the done waits: a race in run "
            << races.runs << "; without the race detector caught in run " << plain.runs << ": "
            << plain.example.substr(0, plain.example.find('\n')) << "\n";
}

TEST_P(CePlanSimCatches, MissingReadyResetLeavesFlagsOrDataWrong) {
  auto breaker = [](const ArenaLayout& layout) {
    return dropping(layout, [](const ArenaLayout& L, const RankView& v, const PlanOp& op) {
      return op.kind == PlanOpKind::kWrite0 && local_flag(L, v, op, /*done=*/false);
    });
  };
  Caught c = run_broken(2100, 50, GetParam(), breaker, true);
  EXPECT_EQ(c.caught, c.runs) << "a ready flag left at 1 went unnoticed";
}

TEST_P(CePlanSimCatches, MissingSignalDeadlocksEveryInterleaving) {
  for (bool done : {false, true}) {
    SCOPED_TRACE(done ? "first done signal dropped" : "first ready signal dropped");
    // Push hands sub-slots back from kLocal (see build_push_plan), pull from kPull.
    const PlanStream done_stream =
        GetParam() == CeDirection::kPush ? PlanStream::kLocal : PlanStream::kPull;
    auto breaker = [done, done_stream](const ArenaLayout&) {
      return Mutator([done, done_stream](int rank, size_t op, std::vector<PlanOp>* plan) {
        if (rank != 0 || op != 0) return;
        const PlanStream s = done ? done_stream : PlanStream::kCopyIn;
        for (size_t i = 0; i < plan->size(); ++i)
          if ((*plan)[i].kind == PlanOpKind::kSignal && (*plan)[i].stream == s) {
            plan->erase(plan->begin() + static_cast<long>(i));
            return;
          }
      });
    };
    Caught c = run_broken(done ? 2201 : 2200, 50, GetParam(), breaker, true);
    EXPECT_EQ(c.by_outcome[Outcome::kDeadlock], c.runs) << c.example;
  }
}

TEST_P(CePlanSimCatches, MissingEventWaitsLetTheApplicationRace) {
  struct Case {
    const char* what;
    PlanStream stream;
    std::vector<uint8_t> events;  // the waits of `stream` on these events are dropped
  };
  const bool push = GetParam() == CeDirection::kPush;
  std::vector<Case> cases = {
      {"copy-in (push: send) starts before the application filled sendbuff",
       PlanStream::kCopyIn,
       {0}},
      {"pull (push: drain) starts before the application is done with recvbuff",
       PlanStream::kPull,
       {0}},
      {"the application reuses sendbuff before the copy-in (push: send) stream ends",
       PlanStream::kUser,
       {1}},
  };
  if (push) {
    // The hand-back stream waits for every drain, so the application needs either wait.
    cases.push_back(
        {"the application reads recvbuff before the drains end", PlanStream::kUser, {2, 3}});
  } else {
    cases.push_back(
        {"the application reads recvbuff before the pulls end", PlanStream::kUser, {2}});
  }
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    auto breaker = [k](const ArenaLayout&) {
      return Mutator([k](int, size_t, std::vector<PlanOp>* plan) {
        plan->erase(
            std::remove_if(plan->begin(), plan->end(),
                           [&](const PlanOp& op) {
                             return op.kind == PlanOpKind::kWaitEvent && op.stream == k.stream &&
                                    std::count(k.events.begin(), k.events.end(), op.event) > 0;
                           }),
            plan->end());
      });
    };
    // Caught by the race detector, and without it by the data the application sees.
    const uint64_t salt = k.events.front() + 10 * static_cast<uint64_t>(k.stream);
    Caught raced = run_broken(2300 + salt, 300, GetParam(), breaker, true,
                              [](const Caught& c) { return c.caught > 0; });
    EXPECT_GT(raced.caught, 0) << "went unnoticed in " << raced.runs << " runs";
    Caught wrong = run_broken(2400 + salt, 300, GetParam(), breaker, false,
                              [](const Caught& c) { return c.by_outcome.count(Outcome::kOk) > 0; });
    EXPECT_GT(wrong.by_outcome[Outcome::kOk], 0)
        << "no wrong data in " << wrong.runs << " runs without the race detector";
  }
}

INSTANTIATE_TEST_SUITE_P(Direction, CePlanSimCatches, ::testing::ValuesIn(kDirections),
                         direction_param_name);

TEST(CePlanSimCatchesPush, SendOffItsSubSlotStartCorruptsData) {
  // Push only: rank 0 writes every piece one byte past the start of its sub-slot in the
  // receiver's slot; the receiver drains from the start, so it gets a stale byte and loses
  // the piece's last one (which lands in the next sub-slot or slot).
  auto breaker = [](const ArenaLayout&) {
    return Mutator([](int rank, size_t, std::vector<PlanOp>* plan) {
      if (rank != 0) return;
      // A send is the data copy that follows the reset of a done flag on the copy-in stream.
      PlanOpKind before = PlanOpKind::kRecord;
      for (PlanOp& op : *plan) {
        if (op.stream != PlanStream::kCopyIn) continue;
        if (op.kind == PlanOpKind::kCopy && before == PlanOpKind::kWrite0) op.dst += 1;
        before = op.kind;
      }
    });
  };
  Caught c = run_broken(2500, 20, CeDirection::kPush, breaker, false);
  EXPECT_EQ(c.caught, c.runs) << "a send off its sub-slot went unnoticed";
}

}  // namespace
