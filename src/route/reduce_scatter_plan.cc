#include "reduce_scatter_plan.h"

#include <algorithm>

namespace zc {
namespace {

// A slice's target size: large enough that a copy runs near the copy engines' rate (64 MiB in
// place all-gathers reach 87-90 % of the ceiling on 2 H200s, PERFORMANCE.md), small enough that
// the first slice's pushes and the last slice's sum, which nothing overlaps, are a small part of
// a large op.
constexpr uint64_t kSliceTarget = uint64_t{16} << 20;
constexpr uint64_t kSliceAlign = 256;

class RsPlanBuilder {
 public:
  using S = RsStream;
  RsPlanBuilder(const RsOpView& v, std::vector<RsOp>* plan)
      : v_(v), plan_(plan), slices_(rs_slices(v.chunk, v.slice)) {}

  void build() {
    op(S::kUser, RsOpKind::kRecord, kRsStart);
    op(S::kPush, RsOpKind::kWaitEvent, kRsStart);
    op(S::kReduce, RsOpKind::kWaitEvent, kRsStart);
    if (v_.captured) write(S::kPush, v_.started, 1);
    if (!(v_.captured && v_.broken)) {
      if (v_.captured) free_buffers_at_start();
      if (v_.scalar_src != 0 && v_.write_scalar)
        write(S::kPush, rs_own_scalar_word(v_.scratch), v_.scalar_bits);
      for (uint64_t i = 0; i < slices_; ++i) slice(i);
    }
    op(S::kReduce, RsOpKind::kRecord, kRsReduced);
    op(S::kPush, RsOpKind::kWaitEvent, kRsReduced);
    op(S::kPush, RsOpKind::kRecord, kRsEnd);
    op(S::kUser, RsOpKind::kWaitEvent, kRsEnd);
  }

 private:
  // Slice i of the op: pushed into every peer's buffer once it is free, summed here once every
  // peer's landed.
  void slice(uint64_t i) {
    const uint64_t g = v_.first_slice + i;
    const uint64_t at = i * v_.slice, bytes = std::min(v_.slice, v_.chunk - at);
    const uint8_t b = static_cast<uint8_t>(g % kRsBuffers);
    // Each peer's buffer b is free once it summed the slice two before this one (eager), or
    // once its token says so (captured).
    for (int j = 1; j < v_.nranks; ++j)
      if (v_.captured)
        wait_token(S::kPush, v_.token_out[peer(j)][b], kRsTokenFree);
      else if (g >= kRsBuffers)
        wait(S::kPush, v_.freed[peer(j)], g - 1);
    // My scalar goes with the op's first slice into each buffer; its later slices there find it
    // still in place (only this op pushes into the buffer meanwhile).
    if (v_.scalar_src != 0 && i < kRsBuffers)
      for (int j = 1; j < v_.nranks; ++j) {
        RsOp& c = op(S::kPush, RsOpKind::kCopy);
        c.dst = rs_scalar_word(v_.peer_scratch[peer(j)], b, v_.nranks - j);
        c.src = v_.scalar_src;
        c.bytes = v_.scalar_bytes;
      }
    for (int j = 1; j < v_.nranks; ++j) {
      const int p = peer(j);
      RsOp& c = op(S::kPush, RsOpKind::kCopy);
      c.dst = slot(v_.peer_scratch[p], b, v_.nranks - j);  // I am peer p's (n - j)-th
      c.src = v_.send + static_cast<uint64_t>(p) * v_.chunk + at;
      c.bytes = bytes;
    }
    for (int j = 1; j < v_.nranks; ++j)
      if (v_.captured)
        write(S::kPush, v_.token_out[peer(j)][b], kRsTokenLanded);
      else
        write(S::kPush, v_.landed_out[peer(j)], g + 1);
    for (int j = 1; j < v_.nranks; ++j)
      if (v_.captured)
        wait_token(S::kReduce, v_.token_in[peer(j)][b], kRsTokenLanded);
      else
        wait(S::kReduce, v_.landed_in[peer(j)], g + 1);
    RsOp& sum = op(S::kReduce, RsOpKind::kSum);
    sum.dst = v_.recv + at;
    sum.src = v_.send + static_cast<uint64_t>(v_.rank) * v_.chunk + at;
    sum.aux = slot(v_.scratch, b, 1);
    sum.stride = v_.slice;
    sum.nsrc = static_cast<uint8_t>(v_.nranks);
    sum.bytes = bytes;
    sum.scalars = v_.scalar_src != 0 ? rs_scalar_word(v_.scratch, b, 1) : 0;
    if (!v_.captured) {
      write(S::kReduce, v_.freed[v_.rank], g + 1);
    } else if (i + kRsBuffers < slices_) {  // a token passed back only where a slice follows
      for (int j = 1; j < v_.nranks; ++j) write(S::kReduce, v_.token_in[peer(j)][b], kRsTokenFree);
    }
  }

  // A captured op's buffers are free when it starts (reduce_scatter_plan.h): each peer is told
  // so for each buffer the op uses.
  void free_buffers_at_start() {
    for (uint64_t b = 0; b < std::min<uint64_t>(kRsBuffers, slices_); ++b)
      for (int j = 1; j < v_.nranks; ++j) write(S::kReduce, v_.token_in[peer(j)][b], kRsTokenFree);
  }

  // The j-th peer in push and sum order: me+1, me+2, ... (mod n).
  int peer(int j) const { return (v_.rank + j) % v_.nranks; }
  // The slot of a scratch's j-th peer (j from 1) in its buffer b.
  uint64_t slot(uint64_t scratch, uint8_t b, int j) const {
    return scratch + kRsHeadBytes +
           (static_cast<uint64_t>(b) * (v_.nranks - 1) + (j - 1)) * v_.slice;
  }
  RsOp& op(S s, RsOpKind k, uint8_t event = 0) {
    RsOp o{};
    o.stream = s;
    o.kind = k;
    o.event = event;
    plan_->push_back(o);
    return plan_->back();
  }
  void write(S s, uint64_t flag, uint64_t value) {
    RsOp& o = op(s, RsOpKind::kWrite);
    o.dst = flag;
    o.value = static_cast<uint32_t>(value);
  }
  void wait(S s, uint64_t flag, uint64_t value) {
    RsOp& o = op(s, RsOpKind::kWaitGeq);
    o.dst = flag;
    o.value = static_cast<uint32_t>(value);
  }
  void wait_token(S s, uint64_t token, uint32_t state) {
    RsOp& o = op(s, RsOpKind::kWaitToken);
    o.dst = token;
    o.value = state;
  }

  const RsOpView& v_;
  std::vector<RsOp>* plan_;
  const uint64_t slices_;
};

}  // namespace

uint64_t rs_region_bytes(int nranks, uint64_t setting) {
  if (nranks < 2) return 0;
  return std::min(setting / 2 / kSliceAlign * kSliceAlign, rs_scratch_bytes(nranks, kSliceTarget));
}

uint64_t rs_slice_bytes(uint64_t chunk, uint64_t elem, int nranks, uint64_t region_bytes) {
  if (nranks < 2 || elem == 0) return 0;
  const uint64_t align = std::max(kSliceAlign, elem) / elem * elem;  // whole elements
  if (region_bytes <= kRsHeadBytes) return 0;
  const uint64_t room =
      (region_bytes - kRsHeadBytes) / (static_cast<uint64_t>(kRsBuffers) * (nranks - 1));
  const uint64_t most = std::min(kSliceTarget, room) / align * align;
  if (most == 0) return 0;
  const uint64_t slices = std::max<uint64_t>(1, (chunk + most - 1) / most);
  const uint64_t slice = (chunk + slices - 1) / slices;
  return std::min(most, std::max(align, (slice + align - 1) / align * align));
}

uint64_t rs_slices(uint64_t chunk, uint64_t slice) {
  return slice == 0 ? 0 : std::max<uint64_t>(1, (chunk + slice - 1) / slice);
}

uint64_t rs_scratch_bytes(int nranks, uint64_t slice) {
  return kRsHeadBytes +
         static_cast<uint64_t>(kRsBuffers) * static_cast<uint64_t>(nranks - 1) * slice;
}

void build_reduce_scatter_plan(const RsOpView& v, std::vector<RsOp>* plan) {
  RsPlanBuilder(v, plan).build();
}

}  // namespace zc
