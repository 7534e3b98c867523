#include "timing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cuda_check.h"

namespace zcb {

IterTimer::IterTimer(int max_iters) : events_(static_cast<size_t>(max_iters) + 1) {
  for (cudaEvent_t& e : events_) ZCB_CUDA(cudaEventCreate(&e));
}

IterTimer::~IterTimer() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void IterTimer::record(int i, cudaStream_t stream) {
  ZCB_CUDA(cudaEventRecord(events_[i], stream));
}

float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  ZCB_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

double IterTimer::mean_us(int n) const {
  if (n <= 0) return 0;
  return 1000.0 * elapsed_ms(events_[0], events_[n]) / n;
}

std::vector<double> IterTimer::times_us(int n) const {
  std::vector<double> d;
  d.reserve(static_cast<size_t>(std::max(n, 0)));
  for (int i = 0; i < n; ++i) d.push_back(1000.0 * elapsed_ms(events_[i], events_[i + 1]));
  return d;
}

double IterTimer::median_us(int n) const { return median_of(times_us(n)); }

void print_iter_times(int rank, uint64_t bytes, bool in_place, const char* phase,
                      const IterTimer& t, int n) {
  std::string line;
  for (double us : t.times_us(n)) line += " " + std::to_string(std::lround(us));
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
