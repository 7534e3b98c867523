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
//   loading, own context (argument "ctx2"): the same, but thread B issues its copy (between
//           cuMem allocations, which every context of the device reaches) and its flag write
//           on a stream of a context of its own on the same GPU (cuCtxCreate), as a route
//           helper could; A's lazy load then has to wait for W, which only B's context
//           releases. Only this part runs (the same-context one ends the process).
//
// What it showed (2xH200, driver 580.159.04, CUDA_MODULE_LOADING unset, i.e. lazy;
// docs/plots/lifecycle-2xH200/helper-own-context-probe.txt, and earlier 4xH200): queues 0 of 40
// blocked; loading from the primary context DEADLOCKS; from a context of the helper's own it
// does not (the first launch returned after 110 ms, once the helper had released W; the
// helper's two calls took 0.08 ms).
//
//   nvcc -O2 -o helper_issue_probe tests/gpu/probes/helper_issue_probe.cu -lcuda
//   ./helper_issue_probe;  CUDA_DEVICE_MAX_CONNECTIONS=32 ./helper_issue_probe
//   ./helper_issue_probe ctx2
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
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
  CK(cudaHostAlloc(&p, 2 * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
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

// One allocation of `bytes` on device 0 through the cuMem API, mapped and open to the device:
// unlike cudaMalloc memory, any context of the device reaches it.
CUdeviceptr cumem_alloc(size_t bytes) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  bytes = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, bytes, &prop, 0));
  CUdeviceptr va = 0;
  CU(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  CU(cuMemMap(va, bytes, 0, h, 0));
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(cuMemSetAccess(va, bytes, &access, 1));
  return va;
}

// Thread A makes W wait on the flag and launches a kernel never launched before; thread B
// issues P's copy and flag write 50 ms later, on a stream of the primary context or (own_context)
// of a context of its own.
void loading(bool own_context, const Flags& f, size_t bytes) {
  const CUdeviceptr a = cumem_alloc(bytes), b = cumem_alloc(bytes);
  cudaStream_t w, p = nullptr;
  CK(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
  if (!own_context) CK(cudaStreamCreateWithFlags(&p, cudaStreamNonBlocking));
  f.host[0] = 0;
  f.host[1] = 0;
  int* out = nullptr;
  CK(cudaMalloc(&out, 32 * sizeof(int)));
  DeadlockWatch watch(own_context ? "loading (own context)" : "loading");
  double launch_ms = 0, issue_ms = 0;
  CUcontext own = nullptr;
  CUstream own_stream = nullptr;
  if (own_context) {  // made before the race, as a route would at set-up
    CUdevice dev;
    CU(cuDeviceGet(&dev, 0));
    CUcontext primary;
    CU(cuCtxGetCurrent(&primary));
    CU(cuCtxCreate(&own, nullptr, 0, dev));
    CU(cuStreamCreate(&own_stream, CU_STREAM_NON_BLOCKING));
    CU(cuCtxSetCurrent(primary));
  }
  std::thread helper([&] {
    if (own_context)
      CU(cuCtxSetCurrent(own));
    else
      CK(cudaSetDevice(0));
    const CUstream s = own_context ? own_stream : reinterpret_cast<CUstream>(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t = std::chrono::steady_clock::now();
    CU(cuMemcpyAsync(b, a, bytes, s));
    CU(cuStreamWriteValue32(s, f.release, 1, 0));
    issue_ms = ms_since(t);
  });
  CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(w), f.release, 1, CU_STREAM_WAIT_VALUE_GEQ));
  const auto t = std::chrono::steady_clock::now();
  never_launched_before<<<1, 32, 0, w>>>(out);
  CK(cudaGetLastError());
  launch_ms = ms_since(t);
  helper.join();
  CK(cudaStreamSynchronize(w));
  if (own_context) {
    CU(cuStreamSynchronize(own_stream));
    CU(cuStreamDestroy(own_stream));
    CU(cuCtxDestroy(own));
  } else {
    CK(cudaStreamSynchronize(p));
  }
  watch.done();
  printf("RESULT loading%s ok: first launch returned after %.2f ms, the helper's copy and flag "
         "write were issued in %.2f ms\n",
         own_context ? " (own context)" : "", launch_ms, issue_ms);
}

int main(int argc, char** argv) {
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
  if (argc > 1 && std::string(argv[1]) == "ctx2") {
    loading(true, f, bytes);
    return 0;
  }

  printf("queues: j streams made between W and P; blocked = P waited behind W's flag wait\n");
  int blocked = 0;
  for (int j = 0; j < 40; ++j) {
    const bool ran = p_runs_past_w(j, f, a, b, bytes);
    blocked += !ran;
    printf("  j=%2d %s\n", j, ran ? "ran" : "BLOCKED");
  }
  printf("RESULT queues blocked=%d of 40\n", blocked);

  loading(false, f, bytes);
  return blocked == 0 ? 0 : 1;
}
