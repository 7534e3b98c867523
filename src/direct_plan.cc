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
  void write(DirectStream s, uint64_t flag, uint32_t v) {
    op(s, DirectOpKind::kWrite, flag, 0, 0, v);
  }
  void copy(DirectStream s, uint64_t dst, uint64_t src, uint64_t bytes) {
    if (bytes) op(s, DirectOpKind::kCopy, dst, src, bytes);
  }

 private:
  std::vector<DirectOp>* plan_;
};

// Copies `bytes` between a contiguous local range and a peer's spans, in span order.
template <typename Emit>
void along_spans(const std::vector<Span>& spans, uint64_t local, Emit emit) {
  uint64_t at = 0;
  for (const Span& s : spans) {
    emit(s.addr, local + at, s.bytes);
    at += s.bytes;
  }
}

}  // namespace

void build_direct_plan(const DirectOpView& v, std::vector<DirectOp>* plan) {
  using S = DirectStream;
  PlanWriter w(plan);
  const uint64_t own = v.recv + static_cast<uint64_t>(v.rank) * v.chunk;
  const bool in_place = v.send == own;
  auto earlier = [&](int r) { return r != v.rank && (v.before >> r & 1); };
  auto later = [&](int r) { return r != v.rank && !(v.before >> r & 1); };

  w.record(S::kUser, kEvStart);
  w.wait_event(S::kPush, kEvStart);
  w.write(S::kPush, v.ready[v.rank], v.seq);
  for (int e = 0; e < v.nranks; ++e)
    if (earlier(e)) w.wait_geq(S::kPush, v.ready[e], v.seq);
  w.record(S::kPush, kEvReady);
  for (int e = 0; e < v.nranks; ++e)
    if (earlier(e))
      along_spans(v.push_to[e], v.send,
                  [&](uint64_t peer, uint64_t mine, uint64_t n) { w.copy(S::kPush, peer, mine, n); });
  w.wait_event(S::kPull, kEvReady);
  for (int e = 0; e < v.nranks; ++e)
    if (earlier(e))
      along_spans(v.pull_from[e], v.recv + static_cast<uint64_t>(e) * v.chunk,
                  [&](uint64_t peer, uint64_t mine, uint64_t n) { w.copy(S::kPull, mine, peer, n); });
  w.record(S::kPull, kEvPulled);
  w.wait_event(S::kLocal, kEvStart);
  if (!in_place) w.copy(S::kLocal, own, v.send, v.chunk);
  w.record(S::kLocal, kEvLocal);
  w.wait_event(S::kPush, kEvPulled);
  for (int e = 0; e < v.nranks; ++e)
    if (earlier(e)) w.write(S::kPush, v.done_to[e], v.seq);
  for (int l = 0; l < v.nranks; ++l)
    if (later(l)) w.wait_geq(S::kPush, v.done_from[l], v.seq);
  w.wait_event(S::kPush, kEvLocal);
  w.record(S::kPush, kEvEnd);
  w.wait_event(S::kUser, kEvEnd);
}

}  // namespace zc
