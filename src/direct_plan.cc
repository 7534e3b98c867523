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

}  // namespace

void build_direct_plan(const DirectOpView& v, std::vector<DirectOp>* plan) {
  using S = DirectStream;
  PlanWriter w(plan);
  auto slot = [&](uint64_t base, int r) { return base + static_cast<uint64_t>(r) * v.chunk; };
  const uint64_t own = slot(v.recv, v.rank);
  const bool in_place = v.send == own;
  auto copies = [&](int p) { return p != v.rank && (v.peers[p].push || v.peers[p].pull); };

  // A flag: eager, a counter set to the op's number; captured, a signal its one waiter resets.
  auto signal = [&](S s, uint64_t flag) { w.write(s, flag, v.captured ? 1u : v.seq); };
  auto await = [&](S s, uint64_t flag) {
    if (!v.captured) return w.wait_geq(s, flag, v.seq);
    w.wait_signal(s, flag);
    w.write(s, flag, 0);
  };

  // An eager op says ready where a peer copies to or from this rank's buffers (the last rank,
  // doing both copies of all its pairs, has no one to tell). Unstaged, the user's stream itself
  // says it: one flag write, no wait (a write neither holds the stream's hardware queue nor
  // touches the application's memory). Said from the push stream, it waited for the event hop
  // from the user's stream first: on 4 H200s back to back, from the last peer's done to a rank's
  // next ready took 18.4 us that way and 15.0 us this way, and a 64 MiB in-place op 174 us
  // against 171.5 (docs/PERFORMANCE.md). A staged rank says it after staging its chunk.
  bool peers_copy = false;
  for (int p = 0; p < v.nranks; ++p) peers_copy |= p != v.rank && v.peers[p].peer_copies;
  const bool eager_ready = !v.captured && peers_copy;
  // Where the user's stream says ready itself, that flag also starts my own streams: the push
  // stream waits for it in the same batch as the peers' ready flags, instead of an event the
  // user's stream records and the push stream waits for (one command on the user's stream and
  // one event hop less per op).
  const bool start_from_ready = eager_ready && !v.stage;
  auto start = [&](S s) {
    if (start_from_ready)
      w.wait_geq(s, v.ready[v.rank], v.seq);
    else
      w.wait_event(s, kEvStart);
  };
  bool pushes = false;
  for (int p = 0; p < v.nranks; ++p) pushes |= p != v.rank && v.peers[p].push;
  if (start_from_ready)
    w.write(S::kUser, v.ready[v.rank], v.seq);
  else
    w.record(S::kUser, kEvStart);
  // A push stream without pushes (the earlier rank of pairs whose later rank does both) only
  // waits for its peers' done, each of which came after my ready: it needs no start.
  if (!start_from_ready || pushes) start(S::kPush);
  if (v.captured) w.write(S::kPush, v.started, 1);
  if (v.stage) w.copy(S::kPush, slot(v.stage, v.rank), v.send, v.chunk);
  if (eager_ready && v.stage) w.write(S::kPush, v.ready[v.rank], v.seq);
  // A peer that touches my buffers pushes into them; it also pulls from them where it does
  // both copies of the pair (then I push nothing to it).
  for (int p = 0; v.captured && p < v.nranks; ++p)
    if (p != v.rank && v.peers[p].peer_copies) {
      signal(S::kPush, v.ready_push_out[p]);
      if (!v.peers[p].push) signal(S::kPush, v.ready_pull_out[p]);
    }
  // A GPU's copies to its peers run one after the other. In the same peer order on every rank,
  // all would write into rank 0 first, then all into rank 1: one GPU's links take every write
  // while the others idle. Rank r copies with r-1 first, then r-2, ... (mod n): when each
  // pushes, step i is a permutation (r writes to r-1-i); when later ranks do both, each rank's
  // first peer is the one that arrived just before it.
  auto peer_at = [&](int i) { return (v.rank + v.nranks - 1 - i) % v.nranks; };
  bool pulls = false;
  for (int p = 0; p < v.nranks; ++p) pulls |= p != v.rank && v.peers[p].pull;
  for (int i = 0, p = peer_at(0); i < v.nranks - 1; p = peer_at(++i))
    if (v.peers[p].push) await(S::kPush, v.captured ? v.ready_push_in[p] : v.ready[p]);
  for (int i = 0, p = peer_at(0); i < v.nranks - 1; p = peer_at(++i))
    if (v.peers[p].push) w.copy(S::kPush, v.peers[p].to.addr, v.send, v.chunk);
  // The pull and local streams join the op only where they have a copy: fewer driver calls,
  // and no event wait on the push stream for a stream that did nothing.
  if (pulls) {
    start(S::kPull);
    for (int i = 0, p = peer_at(0); i < v.nranks - 1; p = peer_at(++i))
      if (v.peers[p].pull) await(S::kPull, v.captured ? v.ready_pull_in[p] : v.ready[p]);
    for (int i = 0, p = peer_at(0); i < v.nranks - 1; p = peer_at(++i))
      if (v.peers[p].pull) w.copy(S::kPull, slot(v.recv, p), v.peers[p].from.addr, v.chunk);
    w.record(S::kPull, kEvPulled);
  }
  if (!in_place) {
    start(S::kLocal);
    w.copy(S::kLocal, own, v.send, v.chunk);
    w.record(S::kLocal, kEvLocal);
  }
  if (pulls) w.wait_event(S::kPush, kEvPulled);
  for (int p = 0; p < v.nranks; ++p)
    if (copies(p)) signal(S::kPush, v.done_to[p]);
  for (int p = 0; p < v.nranks; ++p)
    if (p != v.rank && v.peers[p].peer_copies) await(S::kPush, v.done_from[p]);
  for (int p = 0; p < v.nranks; ++p)
    if (v.stage && p != v.rank && v.peers[p].staged)
      w.copy(S::kPush, slot(v.recv, p), slot(v.stage, p), v.chunk);
  if (!in_place) w.wait_event(S::kPush, kEvLocal);
  w.record(S::kPush, kEvEnd);
  w.wait_event(S::kUser, kEvEnd);
}

}  // namespace zc
