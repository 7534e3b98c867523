#include "timing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cuda_check.h"

namespace zcb {

IterTimer::IterTimer(int max_iters, int every)
    : max_iters_(max_iters),
      every_(every < 1 ? 1 : every),
      events_(static_cast<size_t>(max_iters) + 1) {
  for (int i = 0; i <= max_iters_; ++i)
    if (recorded(i)) ZCB_CUDA(cudaEventCreate(&events_[static_cast<size_t>(i)]));
}

IterTimer::~IterTimer() {
  for (cudaEvent_t e : events_)
    if (e) cudaEventDestroy(e);
}

void IterTimer::record(int i, cudaStream_t stream) {
  if (recorded(i)) ZCB_CUDA(cudaEventRecord(events_[static_cast<size_t>(i)], stream));
}

float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  ZCB_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

double IterTimer::mean_us() const {
  if (max_iters_ <= 0) return 0;
  return 1000.0 * elapsed_ms(events_[0], events_[static_cast<size_t>(max_iters_)]) / max_iters_;
}

std::vector<double> IterTimer::times_us() const {
  std::vector<double> d;
  for (int i = 0; i < max_iters_;) {
    const int next = std::min(i + every_, max_iters_);
    d.push_back(1000.0 *
                elapsed_ms(events_[static_cast<size_t>(i)], events_[static_cast<size_t>(next)]) /
                (next - i));
    i = next;
  }
  return d;
}

double IterTimer::median_us() const { return median_of(times_us()); }

void print_iter_times(int rank, uint64_t bytes, bool in_place, const char* phase,
                      const IterTimer& t) {
  std::string line;
  for (double us : t.times_us()) line += " " + std::to_string(std::lround(us));
  fprintf(stderr, "# iter-times rank %d bytes %llu %s %s (us):%s\n", rank,
          static_cast<unsigned long long>(bytes), in_place ? "in-place" : "out-of-place", phase,
          line.c_str());
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double hi = v[mid];
  if (v.size() % 2) return hi;
  double lo = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lo + hi);
}

}  // namespace zcb
