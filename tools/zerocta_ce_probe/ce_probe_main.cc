// zerocta-ce-probe: measures the building blocks of a copy-engine all-gather on GPUs 0 and 1:
//   pull     GPU0 copies B bytes from GPU1's memory (one stream)
//   local    GPU0 copies B bytes within its own memory (one stream)
//   both     pull and local at the same time on two streams
//   2local   two local copies at the same time (copy-in + own chunk of an out-of-place op)
//   all      pull + 2 local copies at once
// If `both` takes max(pull, local), local copies run on another engine and can be hidden.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                         \
  do {                                                                \
    cudaError_t e_ = (x);                                             \
    if (e_ != cudaSuccess) {                                          \
      fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_)); \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

namespace {

struct Copy {
  void* dst;
  const void* src;
};

// When set, copies go through cudaMemcpyBatchAsync marked "prefer overlap with compute",
// which asks the driver for a copy engine even for a same-device copy.
bool g_batch = false;

cudaError_t copy(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (!g_batch) return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t idx = 0;
  return cudaMemcpyBatchAsync(&dst, const_cast<void**>(&src), &bytes, 1, &attr, &idx, 1, s);
}

// Runs each copy list on its own stream, all started together; returns ms of the whole.
float run(const std::vector<std::vector<Copy>>& lists, size_t bytes, int iters) {
  std::vector<cudaStream_t> s(lists.size());
  for (auto& x : s) CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int it = 0; it < iters; ++it) {
    CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(a, s[0]));
    for (size_t i = 1; i < s.size(); ++i) CK(cudaStreamWaitEvent(s[i], a, 0));
    for (size_t i = 0; i < lists.size(); ++i)
      for (const Copy& c : lists[i]) CK(copy(c.dst, c.src, bytes, s[i]));
    for (size_t i = 1; i < s.size(); ++i) {
      cudaEvent_t e;
      CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      CK(cudaEventRecord(e, s[i]));
      CK(cudaStreamWaitEvent(s[0], e, 0));
      CK(cudaEventDestroy(e));
    }
    CK(cudaEventRecord(b, s[0]));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (it > 0 && ms < best) best = ms;  // first iteration is a warm-up
  }
  for (auto& x : s) CK(cudaStreamDestroy(x));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    printf("zerocta-ce-probe: needs 2 GPUs, found %d\n", n);
    return 0;
  }
  size_t mib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 256;
  size_t bytes = mib << 20;
  int iters = 6;
  void *peer, *l0, *l1, *l2, *l3;
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&peer, bytes));
  CK(cudaMemset(peer, 1, bytes));
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaMalloc(&l0, bytes));
  CK(cudaMalloc(&l1, bytes));
  CK(cudaMalloc(&l2, bytes));
  CK(cudaMalloc(&l3, bytes));
  CK(cudaMemset(l1, 2, bytes));
  CK(cudaMemset(l3, 3, bytes));
  auto gbs = [&](float ms, int copies) { return copies * bytes / (ms * 1e6); };
  float pull = run({{{l0, peer}}}, bytes, iters);
  float local = run({{{l2, l1}}}, bytes, iters);
  float both = run({{{l0, peer}}, {{l2, l1}}}, bytes, iters);
  float two_local = run({{{l2, l1}}, {{l0, l3}}}, bytes, iters);
  float all = run({{{l0, peer}}, {{l2, l1}}, {{l3, l1}}}, bytes, iters);
  float serial = run({{{l0, peer}, {l2, l1}, {l3, l1}}}, bytes, iters);
  printf("zerocta-ce-probe: %zu MiB per copy, best of %d\n", mib, iters - 1);
  printf("  pull (peer->local)         %8.3f ms  %7.1f GB/s\n", pull, gbs(pull, 1));
  printf("  local (d2d)                %8.3f ms  %7.1f GB/s\n", local, gbs(local, 1));
  printf("  pull + local concurrently  %8.3f ms  (max of the two: %.3f, sum: %.3f)\n", both,
         pull > local ? pull : local, pull + local);
  printf("  two locals concurrently    %8.3f ms  %7.1f GB/s each\n", two_local, gbs(two_local, 1));
  printf("  pull + two locals at once  %8.3f ms  (pull alone %.3f)\n", all, pull);
  printf("  pull, local, local serial  %8.3f ms\n", serial);
  g_batch = true;
  float local_ce = run({{{l2, l1}}}, bytes, iters);
  float pull_ce = run({{{l0, peer}}}, bytes, iters);
  float all_ce = run({{{l0, peer}}, {{l2, l1}}, {{l3, l1}}}, bytes, iters);
  printf("  with cudaMemcpyFlagPreferOverlapWithCompute (copy engines only):\n");
  printf("  local (d2d)                %8.3f ms  %7.1f GB/s\n", local_ce, gbs(local_ce, 1));
  printf("  pull (peer->local)         %8.3f ms  %7.1f GB/s\n", pull_ce, gbs(pull_ce, 1));
  printf("  pull + two locals at once  %8.3f ms\n", all_ce);
  return 0;
}
