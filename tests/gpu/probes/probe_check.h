// The probes' error checks: a failed CUDA runtime (CK) or driver (CU) call prints where and why
// and ends the probe with status 1; and what the timing probes share. Header-only, for nvcc.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <thread>
#include <string>
#include <chrono>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)
#define CU(x)                                                                   \
  do {                                                                          \
    CUresult r_ = (x);                                                          \
    if (r_ != CUDA_SUCCESS) {                                                   \
      const char* s_ = nullptr;                                                 \
      cuGetErrorString(r_, &s_);                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

// Device `dev`'s primary context, retained (cuInit first: it may be the process's first call).
inline CUcontext primary_context(int dev) {
  CU(cuInit(0));
  CUdevice d;
  CU(cuDeviceGet(&d, dev));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, d));
  return ctx;
}

// Stream memory operations on 32-bit flags, as the route's plan issues them: a wait until the
// flag, a wrapping counter, is >= v, and a write of v; batch() issues and clears `ops`.
inline CUstreamBatchMemOpParams wait_op(CUdeviceptr a, uint32_t v) {
  CUstreamBatchMemOpParams p = {};
  p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  p.waitValue.address = a;
  p.waitValue.value = v;
  p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  return p;
}
inline CUstreamBatchMemOpParams write_op(CUdeviceptr a, uint32_t v) {
  CUstreamBatchMemOpParams p = {};
  p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  p.writeValue.address = a;
  p.writeValue.value = v;
  return p;
}
inline void batch(CUstream s, std::vector<CUstreamBatchMemOpParams>& ops) {
  if (!ops.empty()) CU(cuStreamBatchMemOp(s, static_cast<unsigned>(ops.size()), ops.data(), 0));
  ops.clear();
}

// Microseconds per op of a timed run of `ops` ops between events t0 and t1 (recorded already;
// waits for t1). Runtime events are driver events (cudaEvent_t is a CUevent).
inline double us_per_op(CUevent t0, CUevent t1, int ops) {
  CU(cuEventSynchronize(t1));
  float ms = 0;
  CU(cuEventElapsedTime(&ms, t0, t1));
  return ms * 1000.0 / ops;
}

// The median of `v` (sorted in place; not empty).
inline double median_of(std::vector<double>& v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The number of visible GPUs; where it is below two, says that `probe` needs two and returns 0.
inline int gpus_for_probe(const char* probe) {
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n >= 2) return n;
  printf("%s: needs 2 GPUs, found %d\n", probe, n);
  return 0;
}

// Watches a part of a probe that may deadlock: unless done() is called within 5 s, prints
// "RESULT <what> DEADLOCK (nothing finished within 5 s)" and ends the process with status 2.
class DeadlockWatch {
 public:
  explicit DeadlockWatch(std::string what) : what_(std::move(what)), thread_([this] { watch(); }) {}
  void done() {
    finished_ = true;
    if (thread_.joinable()) thread_.join();
  }
  ~DeadlockWatch() { done(); }

 private:
  void watch() {
    const auto t = std::chrono::steady_clock::now();
    while (!finished_.load() && std::chrono::steady_clock::now() - t < std::chrono::seconds(5))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (finished_.load()) return;
    printf("RESULT %s DEADLOCK (nothing finished within 5 s)\n", what_.c_str());
    fflush(stdout);
    _exit(2);
  }
  std::string what_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};
