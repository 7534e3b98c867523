// What an all-gather's handshakes cost per op on N GPUs, by where the flags live and how many
// streams carry them. The route's in-place all-gather on 4 GPUs trails NCCL's copy-engine path
// by ~10 us an op at 64 MiB; both run a ready and a done handshake around the same pushes, so
// the difference is in how: the route polls pinned host memory (one wait per peer, each a read
// across PCIe) from a stream of its own between two event hops; NCCL polls each flag in the
// waiter's own GPU memory, written by its peers over NVLink, on the application's stream.
//
//   nvcc -O2 -o handshake_probe tests/gpu/probes/handshake_probe.cu -lcuda && ./handshake_probe
//
// One process drives every GPU (peer access), ops queued far ahead of the devices, so a time
// per op is the devices' own. Per op, GPU r:
//   user stream   write ready (host: ready[r]; device: ready_in[p][r] in every peer p's memory)
//   push stream   wait every rank's ready (one batch); push its chunk into every peer, rotated
//                 (r-1, r-2, ...); write done to every peer; wait every peer's done; record end
//   user stream   wait end
// "one stream" puts everything on the user stream (no event hop). Also: how long a stream takes
// to pass K waits that are already satisfied, on host and on device memory.
// Prints the median of 5 runs of 200 ops for each layout, size and GPU count 2..N.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kOps = 200;
constexpr int kRuns = 5;
constexpr int kMaxGpus = 8;

enum class Flags { kHost, kDevice };

struct Gpu {
  cudaStream_t user, push;
  cudaEvent_t end, t0, t1;
  uint32_t* dev_flags;  // ready_in[p] at [p], done_in[p] at [64 + p]
  void* buf;            // the receive buffer, `bytes` long
};

struct World {
  int n = 0;
  Gpu gpu[kMaxGpus];
  uint32_t* host = nullptr;  // ready[r] at [r * 16], done[w][p] at [256 + (w * 16 + p) * 16]
  uint32_t seq = 0;
};

CUdeviceptr ready_flag(World& w, Flags f, int waiter, int writer) {
  if (f == Flags::kHost) return reinterpret_cast<CUdeviceptr>(w.host + writer * 16);
  return reinterpret_cast<CUdeviceptr>(w.gpu[waiter].dev_flags + writer);
}
CUdeviceptr done_flag(World& w, Flags f, int waiter, int writer) {
  if (f == Flags::kHost)
    return reinterpret_cast<CUdeviceptr>(w.host + 256 + (waiter * 16 + writer) * 16);
  return reinterpret_cast<CUdeviceptr>(w.gpu[waiter].dev_flags + 64 + writer);
}

// Issues one op of every GPU, for ranks 0..n-1, phase by phase across the GPUs: a wait only
// depends on writes of an earlier phase, so a host call that blocks on a full queue never waits
// for work not yet issued.
void issue_op(World& w, int n, Flags f, bool one_stream, size_t chunk) {
  const uint32_t s = ++w.seq;
  std::vector<CUstreamBatchMemOpParams> ops;
  auto push_stream = [&](int r) { return one_stream ? w.gpu[r].user : w.gpu[r].push; };
  for (int r = 0; r < n; ++r) {  // ready
    CK(cudaSetDevice(r));
    if (f == Flags::kHost) {
      ops.push_back(write_op(ready_flag(w, f, r, r), s));
    } else {
      for (int p = 0; p < n; ++p) ops.push_back(write_op(ready_flag(w, f, p, r), s));
    }
    batch(w.gpu[r].user, ops);
  }
  for (int r = 0; r < n; ++r) {  // wait ready, push, say done
    CK(cudaSetDevice(r));
    for (int p = 0; p < n; ++p) ops.push_back(wait_op(ready_flag(w, f, r, p), s));
    batch(push_stream(r), ops);
    for (int k = 1; k < n && chunk; ++k) {
      const int p = (r - k + n) % n;
      CK(cudaMemcpyAsync(static_cast<char*>(w.gpu[p].buf) + r * chunk,
                         static_cast<char*>(w.gpu[r].buf) + r * chunk, chunk,
                         cudaMemcpyDeviceToDevice, push_stream(r)));
    }
    for (int p = 0; p < n; ++p)
      if (p != r) ops.push_back(write_op(done_flag(w, f, p, r), s));
    batch(push_stream(r), ops);
  }
  for (int r = 0; r < n; ++r) {  // wait done, hand back to the user stream
    CK(cudaSetDevice(r));
    for (int p = 0; p < n; ++p)
      if (p != r) ops.push_back(wait_op(done_flag(w, f, r, p), s));
    batch(push_stream(r), ops);
    if (!one_stream) {
      CK(cudaEventRecord(w.gpu[r].end, w.gpu[r].push));
      CK(cudaStreamWaitEvent(w.gpu[r].user, w.gpu[r].end, 0));
    }
  }
}

// Microseconds per op (slowest GPU), median of kRuns.
double time_ops(World& w, int n, Flags f, bool one_stream, size_t chunk) {
  for (int i = 0; i < 20; ++i) issue_op(w, n, f, one_stream, chunk);
  std::vector<double> us;
  for (int run = 0; run < kRuns; ++run) {
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaEventRecord(w.gpu[r].t0, w.gpu[r].user));
    }
    for (int i = 0; i < kOps; ++i) issue_op(w, n, f, one_stream, chunk);
    double worst = 0;
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaEventRecord(w.gpu[r].t1, w.gpu[r].user));
    }
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      worst = std::max(worst, us_per_op(w.gpu[r].t0, w.gpu[r].t1, kOps));
    }
    us.push_back(worst);
  }
  return median_of(us);
}

// Microseconds for GPU 0's stream to pass `k` already satisfied waits in one batch.
double satisfied_waits(World& w, Flags f, int k) {
  CK(cudaSetDevice(0));
  Gpu& g = w.gpu[0];
  CUdeviceptr a = f == Flags::kHost ? reinterpret_cast<CUdeviceptr>(w.host + 4000)
                                    : reinterpret_cast<CUdeviceptr>(g.dev_flags + 500);
  std::vector<CUstreamBatchMemOpParams> ops;
  std::vector<double> us;
  for (int run = 0; run < kRuns; ++run) {
    CK(cudaEventRecord(g.t0, g.user));
    for (int i = 0; i < kOps; ++i) {
      for (int j = 0; j < k; ++j) ops.push_back(wait_op(a, 0));
      batch(g.user, ops);
    }
    CK(cudaEventRecord(g.t1, g.user));
    us.push_back(us_per_op(g.t0, g.t1, kOps));
  }
  return median_of(us);
}

}  // namespace

int main() {
  World w;
  w.n = gpus_for_probe("handshake_probe");
  if (w.n == 0) return 0;
  w.n = std::min(w.n, kMaxGpus);
  CU(cuInit(0));
  const size_t max_bytes = 64ull << 20;
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(r));
    for (int p = 0; p < w.n; ++p)
      if (p != r) CK(cudaDeviceEnablePeerAccess(p, 0));
    Gpu& g = w.gpu[r];
    CK(cudaStreamCreateWithFlags(&g.user, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&g.push, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&g.end, cudaEventDisableTiming));
    CK(cudaEventCreate(&g.t0));
    CK(cudaEventCreate(&g.t1));
    CK(cudaMalloc(&g.dev_flags, 4096));
    CK(cudaMemset(g.dev_flags, 0, 4096));
    CK(cudaMalloc(&g.buf, max_bytes));
    CK(cudaMemset(g.buf, 1, max_bytes));
  }
  void* page = aligned_alloc(4096, 1 << 16);
  std::fill_n(static_cast<uint32_t*>(page), (1 << 16) / 4, 0u);
  CK(cudaHostRegister(page, 1 << 16, cudaHostRegisterPortable | cudaHostRegisterMapped));
  w.host = static_cast<uint32_t*>(page);
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaDeviceSynchronize());
  }

  printf("stream passing K satisfied waits in one batch (us, median of %d x %d):\n", kRuns, kOps);
  for (int k : {1, 2, 4, 8}) {
    printf("  K=%d  host %.2f  device %.2f\n", k, satisfied_waits(w, Flags::kHost, k),
           satisfied_waits(w, Flags::kDevice, k));
  }
  printf("\nper op, slowest GPU (us, median of %d runs of %d ops; total bytes = chunk x n):\n",
         kRuns, kOps);
  printf("%5s %10s %12s %12s %12s %12s\n", "gpus", "total", "host,2str", "device,2str", "host,1str",
         "device,1str");
  for (int n = 2; n <= w.n; ++n) {
    for (size_t total : {size_t(0), size_t(16) << 20, max_bytes}) {
      const size_t chunk = total / n / 4096 * 4096;
      printf(
          "%5d %9zuM %12.1f %12.1f %12.1f %12.1f\n", n, total >> 20,
          time_ops(w, n, Flags::kHost, false, chunk), time_ops(w, n, Flags::kDevice, false, chunk),
          time_ops(w, n, Flags::kHost, true, chunk), time_ops(w, n, Flags::kDevice, true, chunk));
      fflush(stdout);
    }
  }
  return 0;
}
