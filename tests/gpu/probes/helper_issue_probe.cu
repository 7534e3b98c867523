// Can a helper thread issue the earlier rank's push after the application's thread returned?
// The idea (docs/PERFORMANCE.md, FSDP2): the earlier rank of a pair returns at once, its route
// stream W already waiting on a flag, and a thread of its process issues the push on stream P
// when the later rank claims "each pushes"; P's last operation writes the flag W waits on. Two
// hazards decide whether that can ever hang, and this probe measures both on one GPU:
//
//   queues  W's stream-memory wait blocks W's hardware queue: if P shares that queue, P's
//           later work sits behind the wait that waits for it. Streams share queues when there
//           are more of them than CUDA_DEVICE_MAX_CONNECTIONS (8 by default). For W, then j
//           other streams, then P (j = 0..39), it waits on W, issues a copy and the flag write
//           on P, and reports whether P finished while W still waited.
//   loading With lazy module loading (CUDA 12.2+'s default) a kernel's first launch may
//           synchronize the context. Thread A makes W wait on the flag, then launches a kernel
//           never launched before; thread B, 50 ms later, issues the copy and the flag write
//           on P. If A's launch waits for W while B's calls wait for A's lock: a deadlock,
//           reported after 5 s (and the process ends with status 2).
//
//   nvcc -O2 -o helper_issue_probe tests/gpu/probes/helper_issue_probe.cu -lcuda
//   ./helper_issue_probe;  CUDA_DEVICE_MAX_CONNECTIONS=32 ./helper_issue_probe
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "probe_check.h"

__global__ void never_launched_before(int* out) { out[threadIdx.x] = threadIdx.x; }

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// Host flags the devices read and write (as the route's, pinned and mapped).
struct Flags {
  volatile uint32_t* host = nullptr;
  CUdeviceptr release = 0, done = 0;  // [0]: what W waits on; [1]: what P writes when done
};

Flags make_flags() {
  Flags f;
  void* p = nullptr;
  CK(cudaHostAlloc(&p, 2 * sizeof(uint32_t), cudaHostAllocMapped));
  f.host = static_cast<volatile uint32_t*>(p);
  void* d = nullptr;
  CK(cudaHostGetDevicePointer(&d, p, 0));
  f.release = reinterpret_cast<CUdeviceptr>(d);
  f.done = f.release + sizeof(uint32_t);
  return f;
}

// Whether P's work finishes while W waits (distinct hardware queues), for j streams made
// between them.
bool p_runs_past_w(int j, const Flags& f, void* a, void* b, size_t bytes) {
  cudaStream_t w, p;
  std::vector<cudaStream_t> between(static_cast<size_t>(j));
  CK(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
  for (auto& s : between) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&p, cudaStreamNonBlocking));
  f.host[0] = 0;
  f.host[1] = 0;
  CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(w), f.release, 1, CU_STREAM_WAIT_VALUE_GEQ));
  CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, p));
  CU(cuStreamWriteValue32(reinterpret_cast<CUstream>(p), f.done, 1, 0));
  const auto t = std::chrono::steady_clock::now();
  while (f.host[1] == 0 && ms_since(t) < 200) std::this_thread::yield();
  const bool ran = f.host[1] != 0;
  f.host[0] = 1;  // release W whatever happened; P then runs too
  CK(cudaStreamSynchronize(w));
  CK(cudaStreamSynchronize(p));
  for (auto& s : between) CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(w));
  CK(cudaStreamDestroy(p));
  return ran;
}

int main() {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  const char* conn = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const char* lazy = getenv("CUDA_MODULE_LOADING");
  printf("helper_issue_probe: CUDA_DEVICE_MAX_CONNECTIONS=%s CUDA_MODULE_LOADING=%s\n",
         conn ? conn : "(unset)", lazy ? lazy : "(unset)");
  const size_t bytes = size_t{64} << 20;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  const Flags f = make_flags();

  printf("queues: j streams made between W and P; blocked = P waited behind W's flag wait\n");
  int blocked = 0;
  for (int j = 0; j < 40; ++j) {
    const bool ran = p_runs_past_w(j, f, a, b, bytes);
    blocked += !ran;
    printf("  j=%2d %s\n", j, ran ? "ran" : "BLOCKED");
  }
  printf("RESULT queues blocked=%d of 40\n", blocked);

  // loading: thread A waits W on the flag and launches a new kernel; thread B issues P later.
  cudaStream_t w, p;
  CK(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&p, cudaStreamNonBlocking));
  f.host[0] = 0;
  f.host[1] = 0;
  int* out = nullptr;
  CK(cudaMalloc(&out, 32 * sizeof(int)));
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    const auto t = std::chrono::steady_clock::now();
    while (!finished.load() && ms_since(t) < 5000)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!finished.load()) {
      printf("RESULT loading DEADLOCK (nothing finished within 5 s)\n");
      fflush(stdout);
      _exit(2);
    }
  });
  double launch_ms = 0, issue_ms = 0;
  std::thread helper([&] {
    CK(cudaSetDevice(0));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t = std::chrono::steady_clock::now();
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, p));
    CU(cuStreamWriteValue32(reinterpret_cast<CUstream>(p), f.release, 1, 0));
    issue_ms = ms_since(t);
  });
  CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(w), f.release, 1, CU_STREAM_WAIT_VALUE_GEQ));
  const auto t = std::chrono::steady_clock::now();
  never_launched_before<<<1, 32, 0, w>>>(out);
  CK(cudaGetLastError());
  launch_ms = ms_since(t);
  helper.join();
  CK(cudaStreamSynchronize(w));
  CK(cudaStreamSynchronize(p));
  finished = true;
  watchdog.join();
  printf("RESULT loading ok: first launch returned after %.2f ms, the helper's copy and flag "
         "write were issued in %.2f ms\n",
         launch_ms, issue_ms);
  return blocked == 0 ? 0 : 1;
}
