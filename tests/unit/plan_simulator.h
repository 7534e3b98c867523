// A simulator for copy-engine plans (ce_plan.h): N ranks, each with in-order streams (user,
// copy-in, pull, local), run against each other on host memory. A seeded random scheduler advances
// one stream op at a time (a copy in up to four steps, so other streams run while it is in flight),
// which explores many interleavings. It reports a deadlock as "no stream can run", and a race when
// an op touches memory that an unfinished copy on another stream reads or writes (at least
// one of the two writing). Header-only, so the unit-test glob needs no change.
//
// Semantics: kWaitEq1 blocks its stream until the 32-bit flag at dst is 1; kWrite0 stores 0;
// kCopy/kSignal copy bytes from src to dst; kRecord/kWaitEvent follow CUDA events: a wait
// applies to the most recent record of that event enqueued (on the same rank) before it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ce_plan.h"

namespace zc_test {

using zc::PlanOp;
using zc::PlanOpKind;
using zc::PlanStream;

constexpr int kStreams = static_cast<int>(PlanStream::kCount);
constexpr int kEvents = zc::kPlanEvents;  // per rank and communicator
constexpr uint64_t kFlagBytes = 4;

inline uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }
inline uint8_t* ptr_of(uint64_t a) { return reinterpret_cast<uint8_t*>(a); }

inline uint32_t load32(uint64_t a) {
  uint32_t v;
  memcpy(&v, ptr_of(a), sizeof(v));
  return v;
}

inline const char* kind_name(PlanOpKind k) {
  switch (k) {
    case PlanOpKind::kWaitEq1:
      return "WaitEq1";
    case PlanOpKind::kWrite0:
      return "Write0";
    case PlanOpKind::kCopy:
      return "Copy";
    case PlanOpKind::kSignal:
      return "Signal";
    case PlanOpKind::kRecord:
      return "Record";
    case PlanOpKind::kWaitEvent:
      return "WaitEvent";
  }
  return "?";
}

inline bool known_kind(PlanOpKind k) {
  switch (k) {
    case PlanOpKind::kWaitEq1:
    case PlanOpKind::kWrite0:
    case PlanOpKind::kCopy:
    case PlanOpKind::kSignal:
    case PlanOpKind::kRecord:
    case PlanOpKind::kWaitEvent:
      return true;
  }
  return false;
}

inline bool overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) {
  return an != 0 && bn != 0 && a < b + bn && b < a + an;
}

// [a, a+n) lies inside [base, base+size).
inline bool inside(uint64_t a, uint64_t n, uint64_t base, uint64_t size) {
  return a >= base && n <= size && a - base <= size - n;
}

// ---------------------------------------------------------------------------------------------
// Memory: named, disjoint host allocations; every simulated access must fall inside one.

struct Region {
  uint64_t base = 0, size = 0;
  std::string name;
};

class MemoryMap {
 public:
  explicit MemoryMap(std::vector<Region> regions) : regions_(std::move(regions)) {
    std::sort(regions_.begin(), regions_.end(),
              [](const Region& a, const Region& b) { return a.base < b.base; });
  }
  const Region* find(uint64_t a, uint64_t n) const {
    // The last region that starts at or before a: a plain loop over raw pointers, as this
    // runs for every op, also in debug builds.
    const Region* regions = regions_.data();
    size_t lo = 0, hi = regions_.size();
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (regions[mid].base <= a)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo == 0) return nullptr;
    const Region& r = regions[lo - 1];
    return inside(a, n, r.base, r.size) ? &r : nullptr;
  }
  std::string describe(uint64_t a) const {
    const Region* r = find(a, 0);
    std::ostringstream os;
    if (r)
      os << r->name << "+" << (a - r->base);
    else
      os << "0x" << std::hex << a << " (outside every buffer)";
    return os.str();
  }

 private:
  std::vector<Region> regions_;
};

// ---------------------------------------------------------------------------------------------
// The simulator.

enum class Outcome { kOk, kDeadlock, kRace, kBadAccess };

inline const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kDeadlock:
      return "deadlock";
    case Outcome::kRace:
      return "race";
    case Outcome::kBadAccess:
      return "bad access";
  }
  return "?";
}

struct SimResult {
  Outcome outcome = Outcome::kOk;
  std::string detail;
};

class Simulator {
 public:
  // plans[r] = every op rank r enqueues, in enqueue order (the order ce_exec issues them).
  // A "rank" here is one set of three streams and three events; a communicator that has two
  // such sets (eager ops and graph-captured ops) is simulated as two, named by `names` (by
  // default "rank <index>") so that reports say which set blocked.
  Simulator(const std::vector<std::vector<PlanOp>>& plans, const MemoryMap& memory,
            std::vector<std::string> names = {})
      : memory_(memory), ranks_(plans.size()), names_(std::move(names)) {
    for (size_t r = names_.size(); r < plans.size(); ++r)
      names_.push_back("rank " + std::to_string(r));
    for (size_t r = 0; r < plans.size(); ++r) {
      size_t per_stream[kStreams] = {};
      for (const PlanOp& op : plans[r])
        if (static_cast<int>(op.stream) < kStreams) ++per_stream[static_cast<int>(op.stream)];
      for (int s = 0; s < kStreams; ++s) ranks_[r].streams[s].ops.reserve(per_stream[s]);
      // CUDA event semantics: a wait applies to the most recent record of the event that
      // was enqueued before the wait (none recorded yet: the wait is a no-op).
      uint64_t records[kEvents] = {};
      for (const PlanOp& op : plans[r]) {
        const int s = static_cast<int>(op.stream);
        const bool event_op = op.kind == PlanOpKind::kRecord || op.kind == PlanOpKind::kWaitEvent;
        if (s < 0 || s >= kStreams || !known_kind(op.kind) || (event_op && op.event >= kEvents)) {
          invalid_ = names_[r] + " has an op with an invalid stream/kind/event";
          continue;
        }
        uint64_t seq = 0;
        if (op.kind == PlanOpKind::kRecord) seq = ++records[op.event];
        if (op.kind == PlanOpKind::kWaitEvent) seq = records[op.event];
        StreamState& st = ranks_[r].streams[s];
        st.ops.push_back({op, seq});
        // Addresses are fixed when the plan is built: check them all once, up front.
        if (invalid_.empty() && !mapped(op))
          invalid_ = where(r * kStreams + static_cast<size_t>(s), st.ops.size() - 1) +
                     " touches memory outside every buffer";
      }
      for (int e = 0; e < kEvents; ++e) {
        ranks_[r].recorded[e].assign(records[e] + 1, false);
        ranks_[r].recorded[e][0] = true;  // "record 0" = nothing recorded yet
      }
    }
  }

  // Runs every stream to completion (or until deadlock / a race). Single use.
  SimResult run(uint64_t seed, bool detect_races) {
    if (!invalid_.empty()) return {Outcome::kBadAccess, invalid_};
    detect_races_ = detect_races;
    std::mt19937_64 rng(seed);
    // Two schedules: uniform picks among runnable streams, and "priorities" that let one
    // stream (hence one rank) run far ahead of the others for a while.
    const bool by_priority = rng() % 2 == 0;
    pieces_ = uint64_t{1} << (rng() % 3);  // a copy runs in 1, 2 or 4 steps
    const size_t nstreams = ranks_.size() * kStreams;
    std::vector<uint64_t> priority(nstreams);
    for (auto& p : priority) p = rng();
    pos_.assign(nstreams, kNone);
    waiting_on_.assign(nstreams, kNone);
    flag_pos_.assign(nstreams, kNone);
    for (size_t i = 0; i < nstreams; ++i) {
      if (stream(i).pc < stream(i).ops.size()) ++unfinished_;
      evaluate(i);
    }
    while (unfinished_ > 0) {
      if (runnable_.empty()) return {Outcome::kDeadlock, blocked_streams()};
      size_t pick = runnable_[rng() % runnable_.size()];
      if (by_priority) {
        for (size_t i : runnable_)
          if (priority[i] > priority[pick]) pick = i;
        if (rng() % 32 == 0) priority[rng() % nstreams] = rng();
      }
      SimResult r = step(pick);
      if (r.outcome != Outcome::kOk) return r;
    }
    return {};
  }

 private:
  static constexpr size_t kNone = SIZE_MAX;
  struct QueuedOp {
    PlanOp op;
    uint64_t seq;  // kRecord: this record's number; kWaitEvent: the record awaited (0: none)
  };
  struct StreamState {
    std::vector<QueuedOp> ops;
    size_t pc = 0;
    bool copying = false;  // the op at pc is a copy in flight
    uint64_t copied = 0;
  };
  struct RankState {
    StreamState streams[kStreams];
    std::vector<bool> recorded[kEvents];
    std::vector<size_t> event_waiters[kEvents];  // streams whose head waits on the event
  };
  struct InFlight {
    size_t stream;
    uint64_t src, dst, bytes;
  };

  StreamState& stream(size_t i) { return ranks_[i / kStreams].streams[i % kStreams]; }
  const StreamState& stream(size_t i) const { return ranks_[i / kStreams].streams[i % kStreams]; }

  bool mapped(const PlanOp& op) const {
    switch (op.kind) {
      case PlanOpKind::kWaitEq1:
      case PlanOpKind::kWrite0:
        return memory_.find(op.dst, kFlagBytes) != nullptr;
      case PlanOpKind::kCopy:
      case PlanOpKind::kSignal:
        return memory_.find(op.src, op.bytes) && memory_.find(op.dst, op.bytes);
      default:
        return true;
    }
  }

  std::string where(size_t i, size_t pc) const {
    const StreamState& st = stream(i);
    std::ostringstream os;
    os << names_[i / kStreams] << " stream " << i % kStreams << " op #" << pc;
    if (pc < st.ops.size()) {
      const PlanOp& op = st.ops[pc].op;
      os << " " << kind_name(op.kind);
      if (op.kind == PlanOpKind::kRecord || op.kind == PlanOpKind::kWaitEvent)
        os << " event " << int{op.event};
      else
        os << " dst " << memory_.describe(op.dst);
      if (op.kind == PlanOpKind::kCopy || op.kind == PlanOpKind::kSignal)
        os << " src " << memory_.describe(op.src) << " bytes " << op.bytes;
      if (op.kind == PlanOpKind::kWaitEq1 && memory_.find(op.dst, kFlagBytes))
        os << " (flag is " << load32(op.dst) << ")";
    }
    return os.str();
  }
  std::string where(size_t i) const { return where(i, stream(i).pc); }

  std::string blocked_streams() const {
    std::ostringstream os;
    os << "no stream can run; blocked:";
    for (size_t i = 0; i < ranks_.size() * kStreams; ++i)
      if (stream(i).pc < stream(i).ops.size()) os << "\n  " << where(i);
    return os.str();
  }

  // Bookkeeping of which streams can run, updated only where something changed: after a
  // stream steps (its head), after a flag write (the streams waiting on that flag) and
  // after an event record (the streams waiting on that event).
  void set_runnable(size_t i, bool on) {
    if (on == (pos_[i] != kNone)) return;
    if (on) {
      pos_[i] = runnable_.size();
      runnable_.push_back(i);
    } else {
      const size_t last = runnable_.back();
      runnable_[pos_[i]] = last;
      pos_[last] = pos_[i];
      runnable_.pop_back();
      pos_[i] = kNone;
    }
  }

  static void erase_value(std::vector<size_t>* v, size_t x) {
    v->erase(std::remove(v->begin(), v->end(), x), v->end());
  }

  void unregister(size_t i) {
    if (waiting_on_[i] == kNone) return;
    const StreamState& st = stream(i);
    const PlanOp& op = st.ops[st.pc].op;
    if (op.kind == PlanOpKind::kWaitEq1) {
      const size_t last = flag_waiting_.back();
      flag_waiting_[flag_pos_[i]] = last;
      flag_addr_[flag_pos_[i]] = flag_addr_.back();
      flag_pos_[last] = flag_pos_[i];
      flag_waiting_.pop_back();
      flag_addr_.pop_back();
      flag_pos_[i] = kNone;
    } else {
      erase_value(&ranks_[i / kStreams].event_waiters[op.event], i);
    }
    waiting_on_[i] = kNone;
  }

  void evaluate(size_t i) {
    const StreamState& st = stream(i);
    if (st.pc == st.ops.size()) return set_runnable(i, false);
    const QueuedOp& q = st.ops[st.pc];
    RankState& rank = ranks_[i / kStreams];
    switch (q.op.kind) {
      case PlanOpKind::kWaitEq1:
        if (waiting_on_[i] == kNone) {
          flag_pos_[i] = flag_waiting_.size();
          flag_waiting_.push_back(i);
          flag_addr_.push_back(q.op.dst);
          waiting_on_[i] = st.pc;
        }
        return set_runnable(i, load32(q.op.dst) == 1);
      case PlanOpKind::kWaitEvent:
        if (waiting_on_[i] == kNone) {
          rank.event_waiters[q.op.event].push_back(i);
          waiting_on_[i] = st.pc;
        }
        return set_runnable(i, rank.recorded[q.op.event][q.seq]);
      default:
        return set_runnable(i, true);
    }
  }

  // A plain scan over raw arrays: at most two streams per rank wait on a flag at once, and
  // this runs for every write, so it must be cheap in a debug build too.
  void wrote(uint64_t dst, uint64_t n) {
    const uint64_t* flag = flag_addr_.data();
    const size_t count = flag_addr_.size();
    for (size_t k = 0; k < count; ++k)
      if (n != 0 && flag[k] < dst + n && dst < flag[k] + kFlagBytes)
        set_runnable(flag_waiting_[k], load32(flag[k]) == 1);
  }

  // A new access by stream `me` conflicts with a copy in flight on another stream when
  // they overlap and at least one of them writes.
  bool conflict(size_t me, uint64_t src, uint64_t src_n, uint64_t dst, uint64_t dst_n,
                std::string* why) const {
    const InFlight* flights = in_flight_.data();
    for (size_t k = 0; k < in_flight_.size(); ++k) {
      const InFlight& f = flights[k];
      if (f.stream == me) continue;
      if (overlaps(dst, dst_n, f.dst, f.bytes) || overlaps(dst, dst_n, f.src, f.bytes) ||
          overlaps(src, src_n, f.dst, f.bytes)) {
        *why = where(me) + "\n  overlaps the copy in flight on\n  " + where(f.stream);
        return true;
      }
    }
    return false;
  }

  SimResult step(size_t i) {
    StreamState& st = stream(i);
    const QueuedOp& q = st.ops[st.pc];
    const PlanOp& op = q.op;
    std::string why;
    switch (op.kind) {
      case PlanOpKind::kWaitEq1:
      case PlanOpKind::kWaitEvent:
        break;
      case PlanOpKind::kRecord: {
        RankState& rank = ranks_[i / kStreams];
        rank.recorded[op.event][q.seq] = true;
        const std::vector<size_t> waiters = rank.event_waiters[op.event];
        for (size_t w : waiters) evaluate(w);
        break;
      }
      case PlanOpKind::kWrite0: {
        if (detect_races_ && conflict(i, 0, 0, op.dst, kFlagBytes, &why))
          return {Outcome::kRace, why};
        const uint32_t zero = 0;
        memcpy(ptr_of(op.dst), &zero, sizeof(zero));
        wrote(op.dst, kFlagBytes);
        break;
      }
      case PlanOpKind::kSignal:  // a 4-byte copy: one indivisible step
        if (detect_races_ && conflict(i, op.src, op.bytes, op.dst, op.bytes, &why))
          return {Outcome::kRace, why};
        memmove(ptr_of(op.dst), ptr_of(op.src), op.bytes);
        wrote(op.dst, op.bytes);
        break;
      case PlanOpKind::kCopy: {
        if (!st.copying) {
          if (detect_races_ && conflict(i, op.src, op.bytes, op.dst, op.bytes, &why))
            return {Outcome::kRace, why};
          st.copying = true;
          st.copied = 0;
          in_flight_.push_back({i, op.src, op.dst, op.bytes});
        }
        const uint64_t n = std::min((op.bytes + pieces_ - 1) / pieces_, op.bytes - st.copied);
        if (n) memmove(ptr_of(op.dst + st.copied), ptr_of(op.src + st.copied), n);
        wrote(op.dst + st.copied, n);
        st.copied += n;
        if (st.copied < op.bytes) return {};  // still in flight, still runnable
        st.copying = false;
        in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                        [i](const InFlight& f) { return f.stream == i; }),
                         in_flight_.end());
        break;
      }
    }
    unregister(i);
    ++st.pc;
    if (st.pc == st.ops.size()) --unfinished_;
    evaluate(i);
    return {};
  }

  const MemoryMap& memory_;
  std::vector<RankState> ranks_;
  std::vector<std::string> names_;
  std::vector<InFlight> in_flight_;
  std::string invalid_;
  bool detect_races_ = true;
  uint64_t pieces_ = 1;
  size_t unfinished_ = 0;
  std::vector<size_t> runnable_, pos_, waiting_on_;
  // The streams whose head waits on a flag, the flag of each, and each stream's position.
  std::vector<size_t> flag_waiting_;
  std::vector<uint64_t> flag_addr_;
  std::vector<size_t> flag_pos_;
};

}  // namespace zc_test
