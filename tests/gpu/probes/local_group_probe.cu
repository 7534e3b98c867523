// How close one process can bring an in-place all-gather to the copy engines' ceiling when it
// holds every rank (nccl-tests -g N: one thread, a group over every GPU's communicator) and so
// synchronizes the ranks with events instead of flags in host memory.
//
//   nvcc -O2 -o local_group_probe tests/gpu/probes/local_group_probe.cu -lcuda &&
//   ./local_group_probe
//
// Per GPU a "user" stream and a "push" stream; an op is: every user stream records its start;
// every push stream waits for every start (the peers' buffers are free, its own chunk written),
// pushes its chunk into every peer's buffer and records its end; every user stream waits for
// every end. Against the bare pushes back to back with no synchronization (the bench's ceiling).
// Prints per chunk size the median time per op of 5 runs of 20 ops, and busbw.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kOps = 20;
constexpr int kRuns = 5;
constexpr int kMaxGpus = 8;

struct Gpu {
  cudaStream_t user = nullptr, push = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  char* buf = nullptr;  // n chunks: the receive buffer, own chunk in place
};

// Median microseconds per op. `synced`: with the events; else bare pushes.
double run(std::vector<Gpu>& g, size_t chunk, bool synced) {
  const int n = static_cast<int>(g.size());
  cudaEvent_t t0, t1;
  CK(cudaSetDevice(0));
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  std::vector<double> us;
  for (int run = -1; run < kRuns; ++run) {  // run -1: warm-up
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaStreamSynchronize(g[r].user));
      CK(cudaStreamSynchronize(g[r].push));
    }
    CK(cudaSetDevice(0));
    CK(cudaEventRecord(t0, g[0].user));
    for (int r = 1; r < n; ++r) {  // every stream starts after t0
      CK(cudaSetDevice(r));
      CK(cudaStreamWaitEvent(g[r].user, t0, 0));
    }
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaStreamWaitEvent(g[r].push, t0, 0));
    }
    for (int op = 0; op < kOps; ++op) {
      if (synced)
        for (int r = 0; r < n; ++r) {
          CK(cudaSetDevice(r));
          CK(cudaEventRecord(g[r].start, g[r].user));
        }
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(r));
        if (synced)
          for (int q = 0; q < n; ++q) CK(cudaStreamWaitEvent(g[r].push, g[q].start, 0));
        for (int i = 1; i < n; ++i) {
          const int q = (r + n - i) % n;
          CK(cudaMemcpyAsync(g[q].buf + r * chunk, g[r].buf + r * chunk, chunk,
                             cudaMemcpyDeviceToDevice, g[r].push));
        }
        CK(cudaEventRecord(g[r].end, g[r].push));
      }
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(r));
        if (synced)
          for (int q = 0; q < n; ++q) CK(cudaStreamWaitEvent(g[r].user, g[q].end, 0));
        else
          CK(cudaStreamWaitEvent(g[r].user, g[r].end, 0));
      }
    }
    for (int r = 1; r < n; ++r) {  // t1 after every stream's last op
      CK(cudaSetDevice(0));
      CK(cudaStreamWaitEvent(g[0].user, g[r].end, 0));
    }
    CK(cudaSetDevice(0));
    CK(cudaEventRecord(t1, g[0].user));
    CK(cudaEventSynchronize(t1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    if (run >= 0) us.push_back(ms * 1000.0 / kOps);
  }
  return median_of(us);
}

}  // namespace

int main() {
  int n = gpus_for_probe("local_group_probe");
  if (n == 0) return 0;
  n = std::min(n, kMaxGpus);
  const size_t max_total = size_t{1} << 30;  // each GPU's receive buffer
  for (int gpus = 2; gpus <= n; gpus *= 2) {
    std::vector<Gpu> g(static_cast<size_t>(gpus));
    for (int r = 0; r < gpus; ++r) {
      CK(cudaSetDevice(r));
      for (int q = 0; q < gpus; ++q)
        if (q != r) {
          cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
          if (e != cudaErrorPeerAccessAlreadyEnabled) CK(e);
          cudaGetLastError();
        }
      CK(cudaStreamCreateWithFlags(&g[r].user, cudaStreamNonBlocking));
      CK(cudaStreamCreateWithFlags(&g[r].push, cudaStreamNonBlocking));
      CK(cudaEventCreateWithFlags(&g[r].start, cudaEventDisableTiming));
      CK(cudaEventCreateWithFlags(&g[r].end, cudaEventDisableTiming));
      CK(cudaMalloc(&g[r].buf, max_total));
    }
    printf("%d GPUs, in place, one process (median us per op of %d runs of %d ops; busbw GB/s)\n",
           gpus, kRuns, kOps);
    printf("%12s %12s %10s %12s %10s %8s\n", "size (B)", "bare us", "busbw", "events us", "busbw",
           "ratio");
    for (size_t total = size_t{64} << 20; total <= max_total; total *= 4) {
      const size_t chunk = total / gpus;
      const double bare = run(g, chunk, false), synced = run(g, chunk, true);
      const double moved = static_cast<double>(chunk) * (gpus - 1);
      printf("%12zu %12.1f %10.1f %12.1f %10.1f %8.3f\n", total, bare, moved / bare / 1e3, synced,
             moved / synced / 1e3, bare / synced);
    }
    for (int r = 0; r < gpus; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaDeviceSynchronize());
      CK(cudaFree(g[r].buf));
    }
  }
  return 0;
}
