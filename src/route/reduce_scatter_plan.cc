#include "reduce_scatter_plan.h"

#include <algorithm>

namespace zc {
namespace {

// A slice's target size: large enough that a copy runs near the copy engines' rate (64 MiB in
// place all-gathers reach 87-90 % of the ceiling on 2 H200s, PERFORMANCE.md), small enough that
// the first slice's pulls, which nothing overlaps, are a small part of a large op.
constexpr uint64_t kSliceTarget = uint64_t{16} << 20;
constexpr uint64_t kMaxSlices = 16;
constexpr uint64_t kSliceAlign = 256;

class RsPlanBuilder {
 public:
  using S = RsStream;
  RsPlanBuilder(const RsOpView& v, std::vector<RsOp>* plan) : v_(v), plan_(plan) {}

  void build() {
    const uint64_t slices = (v_.chunk + v_.slice - 1) / v_.slice;
    op(S::kUser, RsOpKind::kRecord, kRsStart);
    // My input holds the op's data once the user's stream reached the op: ready for the peers.
    op(S::kPull, RsOpKind::kWaitEvent, kRsStart);
    write(S::kPull, v_.ready[v_.rank]);
    for (int j = 1; j < v_.nranks; ++j) wait(S::kPull, v_.ready[peer(j)]);
    // The reduce stream needs no wait of its own for the start: its first sum waits for the
    // first pulls, which follow it.
    for (uint64_t i = 0; i < slices; ++i) {
      const uint8_t b = static_cast<uint8_t>(i % kRsBuffers);
      const uint64_t at = i * v_.slice, bytes = std::min(v_.slice, v_.chunk - at);
      if (i >= kRsBuffers) op(S::kPull, RsOpKind::kWaitEvent, kRsReduced + b);
      for (int j = 1; j < v_.nranks; ++j) {
        RsOp& c = op(S::kPull, RsOpKind::kCopy);
        c.dst = slot(b, j);
        c.src = v_.peer_send[peer(j)] + static_cast<uint64_t>(v_.rank) * v_.chunk + at;
        c.bytes = bytes;
      }
      op(S::kPull, RsOpKind::kRecord, kRsPulled + b);
      op(S::kReduce, RsOpKind::kWaitEvent, kRsPulled + b);
      RsOp& sum = op(S::kReduce, RsOpKind::kSum);
      sum.dst = v_.recv + at;
      sum.src = v_.send + static_cast<uint64_t>(v_.rank) * v_.chunk + at;
      sum.aux = slot(b, 1);
      sum.stride = v_.slice;
      sum.nsrc = static_cast<uint8_t>(v_.nranks);
      sum.bytes = bytes;
      // Waited for by the pulls two slices on, and the last by the end; the one before the
      // last has no waiter (the end's wait for the last covers it: one stream).
      if (i + kRsBuffers < slices || i + 1 == slices)
        op(S::kReduce, RsOpKind::kRecord, kRsReduced + b);
    }
    // Done with the peers' inputs; they are done with mine; my sums are over.
    for (int j = 1; j < v_.nranks; ++j) write(S::kPull, v_.done_to[peer(j)]);
    for (int j = 1; j < v_.nranks; ++j) wait(S::kPull, v_.done_from[peer(j)]);
    op(S::kPull, RsOpKind::kWaitEvent,
       static_cast<uint8_t>(kRsReduced + (slices - 1) % kRsBuffers));
    op(S::kPull, RsOpKind::kRecord, kRsEnd);
    op(S::kUser, RsOpKind::kWaitEvent, kRsEnd);
  }

 private:
  // The j-th peer in pull and sum order: me+1, me+2, ... (mod n).
  int peer(int j) const { return (v_.rank + j) % v_.nranks; }
  // Peer j's slot in scratch buffer b.
  uint64_t slot(uint8_t b, int j) const {
    return v_.scratch + (static_cast<uint64_t>(b) * (v_.nranks - 1) + (j - 1)) * v_.slice;
  }
  RsOp& op(S s, RsOpKind k, uint8_t event = 0) {
    RsOp o{};
    o.stream = s;
    o.kind = k;
    o.event = event;
    plan_->push_back(o);
    return plan_->back();
  }
  void write(S s, uint64_t flag) {
    RsOp& o = op(s, RsOpKind::kWrite);
    o.dst = flag;
    o.value = v_.seq;
  }
  void wait(S s, uint64_t flag) {
    RsOp& o = op(s, RsOpKind::kWaitGeq);
    o.dst = flag;
    o.value = v_.seq;
  }

  const RsOpView& v_;
  std::vector<RsOp>* plan_;
};

}  // namespace

uint64_t rs_slice_bytes(uint64_t chunk, uint64_t elem) {
  const uint64_t slices = std::clamp<uint64_t>((chunk + kSliceTarget - 1) / kSliceTarget, 1,
                                               kMaxSlices);
  const uint64_t align = std::max(kSliceAlign, elem) / elem * elem;  // whole elements
  const uint64_t slice = (chunk + slices - 1) / slices;
  return std::max<uint64_t>(align, (slice + align - 1) / align * align);
}

uint64_t rs_scratch_bytes(int nranks, uint64_t slice) {
  return static_cast<uint64_t>(kRsBuffers) * static_cast<uint64_t>(nranks - 1) * slice;
}

void build_reduce_scatter_plan(const RsOpView& v, std::vector<RsOp>* plan) {
  RsPlanBuilder(v, plan).build();
}

}  // namespace zc
