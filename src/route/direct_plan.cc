#include "direct_plan.h"

namespace zc {
namespace {

class PlanWriter {
 public:
  explicit PlanWriter(std::vector<DirectOp>* plan) : plan_(plan) {}
  void op(DirectStream s, DirectOpKind k, uint64_t dst = 0, uint64_t src = 0, uint64_t bytes = 0,
          uint32_t value = 0, uint8_t event = 0) {
    DirectOp o{};
    o.stream = s;
    o.kind = k;
    o.event = event;
    o.value = value;
    o.dst = dst;
    o.src = src;
    o.bytes = bytes;
    plan_->push_back(o);
  }
  void record(DirectStream s, uint8_t e) { op(s, DirectOpKind::kRecord, 0, 0, 0, 0, e); }
  void wait_event(DirectStream s, uint8_t e) { op(s, DirectOpKind::kWaitEvent, 0, 0, 0, 0, e); }
  void wait_geq(DirectStream s, uint64_t flag, uint32_t v) {
    op(s, DirectOpKind::kWaitGeq, flag, 0, 0, v);
  }
  void wait_signal(DirectStream s, uint64_t word) { op(s, DirectOpKind::kWaitSignal, word); }
  void write(DirectStream s, uint64_t flag, uint32_t v) {
    op(s, DirectOpKind::kWrite, flag, 0, 0, v);
  }
  void copy(DirectStream s, uint64_t dst, uint64_t src, uint64_t bytes) {
    if (bytes) op(s, DirectOpKind::kCopy, dst, src, bytes);
  }

 private:
  std::vector<DirectOp>* plan_;
};

// One rank's plan, stream by stream in the order they meet (the layout in direct_plan.h).
class PlanBuilder {
 public:
  using S = DirectStream;
  PlanBuilder(const DirectOpView& v, std::vector<DirectOp>* plan) : v_(v), w_(plan) {
    for (int p = 0; p < v.nranks; ++p) {
      if (p == v.rank) continue;
      const PeerPart& part = v.peers[p];
      peers_copy_ |= part.peer_copies;
      pulls_ |= part.pull;
      deferred_ |= part.deferred;
    }
    eager_ready_ = !v.captured && peers_copy_;
    in_place_ = v.send == slot(v.recv, v.rank);
  }

    // An eager op says ready where a peer copies to or from this rank's buffers (the last rank,
    // doing both copies of all its pairs, has no one to tell). The push stream says it, once the
    // event the user's stream records at the op's start has come (and after staging my chunk):
    // the user's stream then holds nothing but event records and waits. Measured on 2 H100s, two
    // processes, back to back without a timed event between ops (tools/zerocta-bench's default,
    // nccl-tests' way, and what an application's stream sees): a 64 MiB in-place op 103.6-103.9
    // us this way against 109.4-111.9 with the user's stream writing ready itself, 256 MiB
    // 352.5-358.8 against 363.1-366.0; the handshake probe (PROBE_READY_BY_EVENT) 98.5 against
    // 108.2. Only with a timed event recorded between every two ops is the write on the user's
    // stream ahead (110.6 against 113.7 us; 171.5 against 174 on 4 H200s): docs/PERFORMANCE.md,
    // "How the bench times an op".
  void start() {
    w_.record(S::kUser, kEvStart);
    w_.wait_event(S::kPush, kEvStart);
    if (v_.captured) w_.write(S::kPush, v_.started, 1);
    if (v_.stage) w_.copy(S::kPush, slot(v_.stage, v_.rank), v_.send, v_.chunk);
    if (eager_ready_) w_.write(S::kPush, v_.ready[v_.rank], v_.seq);
    // A peer that touches my buffers pushes into them; it also pulls from them where it does
    // both copies of the pair (then I push nothing to it).
    for (int p = 0; v_.captured && p < v_.nranks; ++p)
      if (p != v_.rank && v_.peers[p].peer_copies) {
        signal(S::kPush, v_.ready_push_out[p]);
        if (!v_.peers[p].push) signal(S::kPush, v_.ready_pull_out[p]);
      }
  }

    // The push stream waits for the ready of every peer it pushes to, in the order it pushes to
    // them; an eager op first reads back its own ready where it wrote it (a read the write precedes
    // on the stream; presumably it hurries the write to the peers that poll for it). Measured on 4
    // H200s, 1 GiB in place, CUPTI copy traces: without the own read the ranks started each op in
    // rank order, rank 0 2.8-4.9 us after the first whatever GPU it ran on, their copies crossing
    // for longer; with it, and the peers in rank order, rank 0's lag fell to 1.9-2.9 us. Paired
    // rounds against NCCL CE in place at 64 MiB / 256 MiB / 1 GiB, median of the passes on three
    // hosts: own read, peers in rank order 1.010 / 1.004 / 0.999 (1 of 24 rounds >= 1 at 1 GiB);
    // this order 1.034 / 1.003 / 0.999-1.000 (5 of 18); own, r+1, r+2, ... 1.015 / 1.003 / 0.999;
    // own last 0.998 / 0.999 / 0.998 (docs/PERFORMANCE.md, "Three and four GPUs"). Captured ops
    // wait on words of their own (capture_blocks.h).
  void pushes() {
    if (eager_ready_) await(S::kPush, v_.ready[v_.rank]);
    for (int i = 0, p = peer_at(0); i < v_.nranks - 1; p = peer_at(++i))
      if (v_.peers[p].push) await(S::kPush, v_.captured ? v_.ready_push_in[p] : v_.ready[p]);
    for (int i = 0, p = peer_at(0); i < v_.nranks - 1; p = peer_at(++i))
      if (v_.peers[p].push) w_.copy(S::kPush, v_.peers[p].to.addr, v_.send, v_.chunk);
  }

    // The pull and local streams join the op only where they have a copy: fewer driver calls,
    // and no event wait on the push stream for a stream that did nothing.
  void pulls_and_local() {
    if (pulls_) {
      w_.wait_event(S::kPull, kEvStart);
      for (int i = 0, p = peer_at(0); i < v_.nranks - 1; p = peer_at(++i))
        if (v_.peers[p].pull) await(S::kPull, v_.captured ? v_.ready_pull_in[p] : v_.ready[p]);
      for (int i = 0, p = peer_at(0); i < v_.nranks - 1; p = peer_at(++i))
        if (v_.peers[p].pull)
          w_.copy(S::kPull, slot(v_.recv, p), v_.peers[p].from.addr, v_.chunk);
      w_.record(S::kPull, kEvPulled);
    }
    if (!in_place_) {
      w_.wait_event(S::kLocal, kEvStart);
      w_.copy(S::kLocal, slot(v_.recv, v_.rank), v_.send, v_.chunk);
      w_.record(S::kLocal, kEvLocal);
    }
  }

  // Done signals once my copies (and the issuer's, where deferred) are over, the peers' done
  // waits, the chunks they pushed into my stage copied out, and the end.
  void finish() {
    if (pulls_) w_.wait_event(S::kPush, kEvPulled);
    // My deferred pushes are the issuer's: done for those peers only once it says so.
    if (deferred_ && !v_.captured) w_.wait_geq(S::kPush, v_.pushed, v_.seq);
    for (int p = 0; p < v_.nranks; ++p)
      if (copies(p)) signal(S::kPush, v_.done_to[p]);
    // The done waits in rank order: descending, or r+1, r+2, ... (the order peers push into me),
    // were no faster on 4 H200s (docs/PERFORMANCE.md, "Tried and rejected").
    for (int p = 0; p < v_.nranks; ++p)
      if (p != v_.rank && v_.peers[p].peer_copies) await(S::kPush, v_.done_from[p]);
    for (int p = 0; p < v_.nranks; ++p)
      if (v_.stage && p != v_.rank && v_.peers[p].staged)
        w_.copy(S::kPush, slot(v_.recv, p), slot(v_.stage, p), v_.chunk);
    if (!in_place_) w_.wait_event(S::kPush, kEvLocal);
    w_.record(S::kPush, kEvEnd);
    w_.wait_event(S::kUser, kEvEnd);
  }

 private:
  uint64_t slot(uint64_t base, int r) const { return base + static_cast<uint64_t>(r) * v_.chunk; }
  bool copies(int p) const {
    return p != v_.rank && (v_.peers[p].push || v_.peers[p].pull || v_.peers[p].deferred);
  }
  // A flag: eager, a counter set to the op's number; captured, a signal its one waiter resets.
  void signal(S s, uint64_t flag) { w_.write(s, flag, v_.captured ? 1u : v_.seq); }
  void await(S s, uint64_t flag) {
    if (!v_.captured) return w_.wait_geq(s, flag, v_.seq);
    w_.wait_signal(s, flag);
    w_.write(s, flag, 0);
  }
    // A GPU's copies to its peers run one after the other. In the same peer order on every rank,
    // all would write into rank 0 first, then all into rank 1: one GPU's links take every write
    // while the others idle. Rank r copies with r-1 first, then r-2, ... (mod n): when each
    // pushes, step i is a permutation (r writes to r-1-i); when later ranks do both, each rank's
    // first peer is the one that arrived just before it.
  int peer_at(int i) const { return (v_.rank + v_.nranks - 1 - i) % v_.nranks; }

  const DirectOpView& v_;
  PlanWriter w_;
  bool peers_copy_ = false, pulls_ = false, deferred_ = false;
  bool eager_ready_ = false, in_place_ = false;
};

}  // namespace

void build_direct_plan(const DirectOpView& v, std::vector<DirectOp>* plan) {
  PlanBuilder b(v, plan);
  b.start();
  b.pushes();
  b.pulls_and_local();
  b.finish();
}

void build_deferred_push(const DirectOpView& v, int peer, bool first, bool last,
                         std::vector<DirectOp>* plan) {
  using S = DirectStream;
  PlanWriter w(plan);
  // My send buffer holds the op's input once my push stream said ready (after the event of the
  // op's start on the user's stream); the peer's receive buffer, once its stream said so.
  if (peer >= 0) {
    if (first) w.wait_geq(S::kPush, v.ready[v.rank], v.seq);
    w.wait_geq(S::kPush, v.ready[peer], v.seq);
    w.copy(S::kPush, v.peers[peer].to.addr, v.send, v.chunk);
  }
  if (last) w.write(S::kPush, v.pushed, v.seq);
}

}  // namespace zc
