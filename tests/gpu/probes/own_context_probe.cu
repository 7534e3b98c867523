// What does a context of the route's own cost, and does it keep every hazard away? The design it
// serves (#44, the caller never waits for a peer): the earlier rank of a pair returns at once and
// a thread of its process, on a context of its own on the same GPU, issues its push once the
// later rank has claimed the pair. helper_issue_probe.cu showed that a copy and a flag write from
// such a context do not deadlock with the application's lazy module loading. Three more facts,
// one process, GPU 0 (the pusher) and GPU 1 (the peer):
//
//   memory   GPU 0's free memory (cuMemGetInfo) before and after cuCtxCreate and a stream in it
//   imports  thread A makes stream W (primary context) wait on a host flag and launches a kernel
//            never launched before (lazy loading); thread B, 50 ms later, on its own context,
//            imports an allocation of GPU 1 from its POSIX fd, maps it, opens it to GPU 0,
//            copies into it and writes the flag: the driver calls a push would make on first use
//            of a peer's buffer. DEADLOCK after 5 s, else the times.
//   load     256 MiB pushes from GPU 0 into GPU 1's memory, issued on a stream of the primary
//            context or of the own context: alone (GB/s, median of 5), and 24 of them back to
//            back beside an SM-bound loop (40 kernels of ~1 ms) on a primary stream of GPU 0:
//            the loop's time against alone and the pushes' time against alone, 3 rounds.
//   handoff  64 MiB pushes, 20 back to back: on one primary stream (write ready, wait ready, copy,
//            write done), against the handoff the design needs (a primary stream writes ready,
//            a stream of the own context waits for it, copies and writes done, the primary
//            stream waits for done): the time per op of each, median of 5 runs.
//
//   nvcc -O2 -arch=sm_90 -o own_context_probe tests/gpu/probes/own_context_probe.cu -lcuda
//   ./own_context_probe
// What it showed (2xH200, driver 580.159.04, docs/plots/lifecycle-2xH200/own-context-probe.txt):
// the context costs 524 MiB of GPU memory; imports, map, access 0.44 ms and a copy and flag write
// 0.05 ms from it during a lazy load, no deadlock; pushes at 392 GB/s from either context, and
// beside the SM loop neither slows the loop (+0.2 %) nor is slowed; the hand-over adds 4 us an op
// (18.9 against 14.9 us at 1 MiB, 187.0 against 183.1 us at 64 MiB).
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "probe_check.h"

namespace {

constexpr size_t kPushBytes = size_t{256} << 20;
constexpr int kLoopKernels = 40;
constexpr int kPushesUnderLoad = 24;
constexpr int kRounds = 3;

__global__ void lazily_loaded(int* out) { out[threadIdx.x] = threadIdx.x + 1; }

// An SM-bound kernel: every thread runs `iters` dependent FMAs.
__global__ void fma_loop(float* out, int iters) {
  float a = threadIdx.x * 1e-3f, b = 1.0001f;
  for (int i = 0; i < iters; ++i) a = fmaf(a, b, 1e-7f);
  if (a == 42.0f) out[blockIdx.x] = a;  // keeps the loop
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

size_t free_bytes() {
  size_t f = 0, total = 0;
  CU(cuMemGetInfo(&f, &total));
  return f;
}

// An exportable allocation of `bytes` on `device`, mapped in this process and open to both GPUs.
struct Shareable {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr va = 0;
  size_t bytes = 0;
};

CUmemAllocationProp prop_on(int device) {
  CUmemAllocationProp p = {};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

void open_to_both(CUdeviceptr va, size_t bytes) {
  CUmemAccessDesc access[2] = {};
  for (int d = 0; d < 2; ++d) {
    access[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[d].location.id = d;
    access[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CU(cuMemSetAccess(va, bytes, access, 2));
}

Shareable make_shareable(int device, size_t bytes) {
  Shareable s;
  const CUmemAllocationProp p = prop_on(device);
  size_t gran = 0;
  CU(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  s.bytes = (bytes + gran - 1) / gran * gran;
  CU(cuMemCreate(&s.handle, s.bytes, &p, 0));
  CU(cuMemAddressReserve(&s.va, s.bytes, 0, 0, 0));
  CU(cuMemMap(s.va, s.bytes, 0, s.handle, 0));
  open_to_both(s.va, s.bytes);
  return s;
}

// The `imports` part; a deadlock ends the process with status 2 after 5 s.
void imports_under_lazy_loading(CUcontext own, const Shareable& peer, CUdeviceptr src,
                                volatile uint32_t* flag_host, CUdeviceptr flag) {
  int fd = -1;
  CU(cuMemExportToShareableHandle(&fd, peer.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  cudaStream_t w;
  CK(cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking));
  int* out = nullptr;
  CK(cudaMalloc(&out, 32 * sizeof(int)));
  *flag_host = 0;
  DeadlockWatch watch("imports");
  double import_ms = 0, issue_ms = 0, launch_ms = 0;
  std::thread helper([&] {
    CU(cuCtxSetCurrent(own));
    CUstream s;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto t = std::chrono::steady_clock::now();
    CUmemGenericAllocationHandle h;
    CU(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CUdeviceptr va = 0;
    CU(cuMemAddressReserve(&va, peer.bytes, 0, 0, 0));
    CU(cuMemMap(va, peer.bytes, 0, h, 0));
    open_to_both(va, peer.bytes);
    import_ms = ms_since(t);
    t = std::chrono::steady_clock::now();
    CU(cuMemcpyAsync(va, src, size_t{1} << 20, s));
    CU(cuStreamWriteValue32(s, flag, 1, 0));
    issue_ms = ms_since(t);
    CU(cuStreamSynchronize(s));
    CU(cuMemUnmap(va, peer.bytes));
    CU(cuMemAddressFree(va, peer.bytes));
    CU(cuMemRelease(h));
    CU(cuStreamDestroy(s));
  });
  CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(w), flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
  const auto t = std::chrono::steady_clock::now();
  lazily_loaded<<<1, 32, 0, w>>>(out);
  CK(cudaGetLastError());
  launch_ms = ms_since(t);
  helper.join();
  CK(cudaStreamSynchronize(w));
  watch.done();
  close(fd);
  printf("RESULT imports ok: first launch returned after %.2f ms; the helper's import, map and "
         "access took %.2f ms, its copy and flag write %.2f ms\n",
         launch_ms, import_ms, issue_ms);
  CK(cudaStreamDestroy(w));
  CK(cudaFree(out));
}

// One push of kPushBytes on `s` (of context `ctx`), timed with events of that context.
float push_ms(CUcontext ctx, CUstream s, CUdeviceptr dst, CUdeviceptr src, int count) {
  CU(cuCtxSetCurrent(ctx));
  CUevent a, b;
  CU(cuEventCreate(&a, CU_EVENT_DEFAULT));
  CU(cuEventCreate(&b, CU_EVENT_DEFAULT));
  CU(cuEventRecord(a, s));
  for (int i = 0; i < count; ++i) CU(cuMemcpyAsync(dst, src, kPushBytes, s));
  CU(cuEventRecord(b, s));
  CU(cuEventSynchronize(b));
  float ms = 0;
  CU(cuEventElapsedTime(&ms, a, b));
  CU(cuEventDestroy(a));
  CU(cuEventDestroy(b));
  return ms;
}

// The `handoff` part: per-op time of `ops` pushes of `bytes`, all on `p` (own == nullptr) or
// handed from `p` to `o` (a stream of the own context) through host flags.
double handoff_us(CUcontext primary, CUstream p, CUcontext own, CUstream o, CUdeviceptr dst,
                  CUdeviceptr src, size_t bytes, int ops, CUdeviceptr ready, CUdeviceptr done,
                  uint32_t* seq) {
  CU(cuCtxSetCurrent(primary));
  CU(cuStreamSynchronize(p));
  const auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) {
    const uint32_t v = ++*seq;
    CU(cuStreamWriteValue32(p, ready, v, 0));
    if (!own) {
      CU(cuStreamWaitValue32(p, ready, v, CU_STREAM_WAIT_VALUE_GEQ));
      CU(cuMemcpyAsync(dst, src, bytes, p));
      CU(cuStreamWriteValue32(p, done, v, 0));
    } else {
      CU(cuCtxSetCurrent(own));
      CU(cuStreamWaitValue32(o, ready, v, CU_STREAM_WAIT_VALUE_GEQ));
      CU(cuMemcpyAsync(dst, src, bytes, o));
      CU(cuStreamWriteValue32(o, done, v, 0));
      CU(cuCtxSetCurrent(primary));
    }
    CU(cuStreamWaitValue32(p, done, v, CU_STREAM_WAIT_VALUE_GEQ));
  }
  CU(cuStreamSynchronize(p));
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() /
         ops;
}

}  // namespace

int main() {
  CK(cudaSetDevice(1));
  CK(cudaFree(nullptr));
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  CUcontext primary;
  CU(cuCtxGetCurrent(&primary));
  CUdevice dev0;
  CU(cuDeviceGet(&dev0, 0));
  const char* lazy = getenv("CUDA_MODULE_LOADING");
  printf("own_context_probe: CUDA_MODULE_LOADING=%s\n", lazy ? lazy : "(unset)");

  // memory
  const size_t before = free_bytes();
  CUcontext own;
  CU(cuCtxCreate(&own, nullptr, 0, dev0));
  const size_t after_ctx = free_bytes();
  CUstream own_stream;
  CU(cuStreamCreate(&own_stream, CU_STREAM_NON_BLOCKING));
  const size_t after_stream = free_bytes();
  CU(cuCtxSetCurrent(primary));
  printf("RESULT memory own_context_mib=%.1f with_stream_mib=%.1f\n",
         (before - after_ctx) / 1048576.0, (before - after_stream) / 1048576.0);

  // buffers: the source on GPU 0, the destination on GPU 1 (open to GPU 0), the flag in host
  // memory every context sees
  const Shareable src = make_shareable(0, kPushBytes);
  const Shareable dst = make_shareable(1, kPushBytes);
  const Shareable imported = make_shareable(1, size_t{64} << 20);
  void* flag_mem = nullptr;
  CK(cudaHostAlloc(&flag_mem, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
  CUdeviceptr flag = 0;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&flag), flag_mem, 0));
  CK(cudaSetDevice(0));

  imports_under_lazy_loading(own, imported, src.va, static_cast<volatile uint32_t*>(flag_mem),
                             flag);

  // load: pushes alone
  CU(cuCtxSetCurrent(primary));
  CUstream prim_stream;
  CU(cuStreamCreate(&prim_stream, CU_STREAM_NON_BLOCKING));
  push_ms(primary, prim_stream, dst.va, src.va, 1);  // warm-up
  push_ms(own, own_stream, dst.va, src.va, 1);
  for (const char* which : {"primary", "own"}) {
    const bool o = which[0] == 'o';
    std::vector<float> t;
    for (int i = 0; i < 5; ++i)
      t.push_back(push_ms(o ? own : primary, o ? own_stream : prim_stream, dst.va, src.va, 1));
    std::sort(t.begin(), t.end());
    printf("RESULT push context=%s median_ms=%.3f GBps=%.1f\n", which, t[2],
           kPushBytes / (t[2] * 1e6));
  }

  // load: the SM loop, calibrated to ~1 ms a kernel
  CU(cuCtxSetCurrent(primary));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int blocks = sms * 8;
  float* sink = nullptr;
  CK(cudaMalloc(&sink, blocks * sizeof(float)));
  cudaStream_t loop;
  CK(cudaStreamCreateWithFlags(&loop, cudaStreamNonBlocking));
  cudaEvent_t l0, l1;
  CK(cudaEventCreate(&l0));
  CK(cudaEventCreate(&l1));
  auto loop_ms = [&](int iters, int kernels) {
    CK(cudaEventRecord(l0, loop));
    for (int k = 0; k < kernels; ++k) fma_loop<<<blocks, 256, 0, loop>>>(sink, iters);
    CK(cudaEventRecord(l1, loop));
    CK(cudaEventSynchronize(l1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, l0, l1));
    return ms;
  };
  int iters = 4096;
  loop_ms(iters, 1);
  iters = std::max(1, static_cast<int>(iters / loop_ms(iters, 1)));
  printf("CALIB loop blocks=%d iters=%d kernel_ms=%.3f\n", blocks, iters, loop_ms(iters, 1));
  for (int round = 1; round <= kRounds; ++round) {
    const float alone = loop_ms(iters, kLoopKernels);
    for (const char* which : {"primary", "own"}) {
      const bool o = which[0] == 'o';
      const float pushes_alone =
          push_ms(o ? own : primary, o ? own_stream : prim_stream, dst.va, src.va,
                  kPushesUnderLoad);
      CU(cuCtxSetCurrent(primary));
      CK(cudaEventRecord(l0, loop));
      for (int k = 0; k < kLoopKernels; ++k) fma_loop<<<blocks, 256, 0, loop>>>(sink, iters);
      CK(cudaEventRecord(l1, loop));
      const float pushes_with = push_ms(o ? own : primary, o ? own_stream : prim_stream, dst.va,
                                        src.va, kPushesUnderLoad);
      CU(cuCtxSetCurrent(primary));
      CK(cudaEventSynchronize(l1));
      float with = 0;
      CK(cudaEventElapsedTime(&with, l0, l1));
      printf("LOAD round=%d context=%s loop_alone_ms=%.2f loop_with_ms=%.2f slowdown_pct=%.1f "
             "pushes_alone_ms=%.2f pushes_with_ms=%.2f\n",
             round, which, alone, with, 100.0 * (with - alone) / alone, pushes_alone,
             pushes_with);
    }
  }
  // handoff
  void* flags = nullptr;
  CK(cudaHostAlloc(&flags, 2 * sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
  CUdeviceptr fdev = 0;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&fdev), flags, 0));
  uint32_t seq = 0;
  for (size_t bytes : {size_t{1} << 20, size_t{64} << 20}) {
    for (const char* which : {"primary", "own"}) {
      const bool o = which[0] == 'o';
      std::vector<double> t;
      for (int i = 0; i < 6; ++i)
        t.push_back(handoff_us(primary, prim_stream, o ? own : nullptr, own_stream, dst.va, src.va,
                               bytes, 20, fdev, fdev + 4, &seq));
      std::sort(t.begin() + 1, t.end());  // the first run warms up
      printf("RESULT handoff bytes=%zu issuer=%s us_per_op_median=%.1f min=%.1f max=%.1f\n", bytes,
             which, t[3], t[1], t[5]);
    }
  }
  return 0;
}
