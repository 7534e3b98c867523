#include "plan.h"

#include <algorithm>
#include <cmath>

namespace zcb {

namespace {

// Pessimistic figures (an H100/H200 does better): process start + CUDA + NCCL init, and a
// slow collective (busbw 75 GB/s plus 40 us; an all-gather on 2 ranks: algbw 150 GB/s) so a
// slow machine still fits its limit.
constexpr double kStartupNccl = 8.0;
constexpr double kStartupNcclCe = 12.0;  // + ncclMemAlloc and two window registrations
constexpr double kStartupSingle = 5.0;
constexpr double kStartupCublas = 4.0;
constexpr double kBusbw = 75e9;
constexpr double kOpLatency = 40e-6;
constexpr double kCheckBw = 50e9;  // fill + poison + compare
// Per size: fresh buffers (allocate, zero, barriers, free; nccl-ce: two window registrations)
// and the first op's one-time costs on them (zerocta: the peers' allocations imported).
constexpr double kFreshBuffers = 0.2;
constexpr double kGemmFlops = 400e12;

// One collective of nccl-tests size `bytes`: busbw = bytes * factor / time.
double op_s(CollOp op, uint64_t bytes, int nranks) {
  return kOpLatency + bytes * bus_factor(op, nranks) / kBusbw;
}

double startup_s(PathId p) {
  if (path_is_single_process(p)) return kStartupSingle;
  return p == PathId::kNcclCe ? kStartupNcclCe : kStartupNccl;
}

}  // namespace

double estimate_sweep_s(const Options& o, PathId p, int nranks) {
  double t = startup_s(p);
  const int ops = (o.check ? 1 : 0) + o.warmups + o.iters;
  // The first collective (lazy set-up) is inside the start-up figure.
  for (uint64_t size : sweep_sizes(o)) {
    const CollShape s = sweep_shape(o, size, nranks);
    if (s.count == 0) continue;
    const double check = o.check ? 0.01 + (s.send_bytes + s.recv_bytes) / kCheckBw : 0;
    t += kFreshBuffers + op_s(o.op, s.bytes, nranks) +
         2 * (ops * op_s(o.op, s.bytes, nranks) + check);
  }
  return t;
}

double estimate_contention_s(const Options& o, PathId p, int nranks) {
  const double gemm = 2.0 * o.gemm_m * o.gemm_n * static_cast<double>(o.gemm_k) / kGemmFlops;
  const double ag = op_s(o.contention_op(), o.contention_total_bytes(nranks), nranks);
  const double window = o.gemm_iters * gemm;
  const double placements =
      static_cast<double>(contention_placements(o.contention_placement).size());
  // Per placement: warm-ups, GEMMs alone, all-gathers alone, overlapped (fixed: the same work;
  // saturate: a sample alone, then all-gathers covering twice the window).
  const double per_placement =
      o.contention_mode == ContentionMode::kFixed
          ? 3 * ag + window + o.contention_ops * ag + std::max(window, o.contention_ops * ag) * 1.5
          : 3 * ag + window + 20 * ag + 3 * window;
  return startup_s(p) + kStartupCublas + 3 * gemm + placements * per_placement;
}

int path_timeout_s(const Options& o, double estimate_s) {
  if (o.timeout_s > 0) return o.timeout_s;
  return static_cast<int>(std::max(90.0, std::ceil(4 * estimate_s + 30)));
}

}  // namespace zcb
