#include "plan.h"

#include <algorithm>
#include <cmath>

namespace zcb {

namespace {

// Pessimistic figures (an H100/H200 does better): process start + CUDA + NCCL init, and a
// slow all-gather (algbw 150 GB/s plus 40 us) so a slow machine still fits its limit.
constexpr double kStartupNccl = 8.0;
constexpr double kStartupNcclCe = 12.0;  // + ncclMemAlloc and two window registrations
constexpr double kStartupSingle = 5.0;
constexpr double kStartupCublas = 4.0;
constexpr double kAlgbw = 150e9;
constexpr double kOpLatency = 40e-6;
constexpr double kCheckBw = 50e9;  // fill + poison + compare
constexpr double kGemmFlops = 400e12;

double op_s(uint64_t bytes) { return kOpLatency + bytes / kAlgbw; }

double startup_s(PathId p) {
  if (path_is_single_process(p)) return kStartupSingle;
  return p == PathId::kNcclCe ? kStartupNcclCe : kStartupNccl;
}

}  // namespace

double estimate_sweep_s(const Options& o, PathId p, int nranks) {
  double t = startup_s(p);
  const int ops = (o.check ? 1 : 0) + o.warmups + o.iters;
  for (uint64_t size : sweep_sizes(o)) {
    const uint64_t total = per_rank_count(size, nranks, o.dtype.bytes) * o.dtype.bytes * nranks;
    if (total == 0) continue;
    t += 2 * (ops * op_s(total) + (o.check ? 0.01 + total / kCheckBw : 0));
  }
  return t;
}

double estimate_contention_s(const Options& o, PathId p, int nranks) {
  const double gemm = 2.0 * o.gemm_m * o.gemm_n * static_cast<double>(o.gemm_k) / kGemmFlops;
  const double ag = op_s(o.contention_total_bytes(nranks));
  const double window = o.gemm_iters * gemm;
  // warm-ups + GEMM alone + all-gathers alone + overlapped (issued to cover 2x the window).
  return startup_s(p) + kStartupCublas + 3 * (gemm + ag) + window + 20 * ag + 3 * window;
}

int path_timeout_s(const Options& o, double estimate_s) {
  if (o.timeout_s > 0) return o.timeout_s;
  return static_cast<int>(std::max(90.0, std::ceil(4 * estimate_s + 30)));
}

}  // namespace zcb
