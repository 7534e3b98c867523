// What does it cost the host to ask the driver which allocation lies at an address, per
// allocation, the question a post asks once per allocation its buffers lie in (peer_memory.cc,
// exported_extent: PyTorch's expandable segments put an FSDP2 all-gather of 1.6 GB across 80
// allocations of 20 MiB)? One GPU: 80 allocations that allow POSIX fds, mapped back to back in one
// reservation; each way of asking timed over every allocation, 2000 rounds, median and p90 of a
// round divided by 80. Then what each call an op issues costs the host (stream waits and writes
// on host flags, events, copies): 2000 calls each, the stream drained every 64 outside the
// timing, and several of the flag operations in one cuStreamBatchMemOp. Prints one RESULT line
// per way and per call.
//
//   build/tests/gpu/zerocta_gpu_probe_block_query
#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kAllocs = 80;
constexpr size_t kAllocBytes = size_t{20} << 20;
constexpr int kRounds = 2000;

void time_way(const char* name, const std::vector<CUdeviceptr>& at,
              const std::function<CUresult(CUdeviceptr)>& ask) {
  std::vector<double> per_query_ns;
  int failed = 0;
  for (int r = 0; r < kRounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (CUdeviceptr p : at) failed += ask(p) != CUDA_SUCCESS;
    const auto t1 = std::chrono::steady_clock::now();
    per_query_ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / at.size());
  }
  std::sort(per_query_ns.begin(), per_query_ns.end());
  printf("RESULT %-34s per allocation median %.0f ns p90 %.0f ns (a round of %d: %.1f us) failed=%d\n",
         name, per_query_ns[kRounds / 2], per_query_ns[kRounds * 9 / 10], kAllocs,
         per_query_ns[kRounds / 2] * kAllocs / 1000.0, failed);
}

// One call queued on `stream`, timed alone, kRounds times.
void time_call(const char* name, CUstream stream, const std::function<CUresult()>& call) {
  std::vector<double> ns;
  int failed = 0;
  for (int r = 0; r < kRounds; ++r) {
    if (r % 64 == 0) CU(cuStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    failed += call() != CUDA_SUCCESS;
    const auto t1 = std::chrono::steady_clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  CU(cuStreamSynchronize(stream));
  std::sort(ns.begin(), ns.end());
  printf("RESULT call %-29s median %.0f ns p90 %.0f ns p99 %.0f ns failed=%d\n", name,
         ns[kRounds / 2], ns[kRounds * 9 / 10], ns[kRounds * 99 / 100], failed);
}

}  // namespace

int main() {
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUdeviceptr base = 0;
  CU(cuMemAddressReserve(&base, kAllocBytes * kAllocs, 0, 0, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  std::vector<CUdeviceptr> at;
  for (int i = 0; i < kAllocs; ++i) {
    CUmemGenericAllocationHandle h;
    CU(cuMemCreate(&h, kAllocBytes, &prop, 0));
    CU(cuMemMap(base + i * kAllocBytes, kAllocBytes, 0, h, 0));
    CU(cuMemSetAccess(base + i * kAllocBytes, kAllocBytes, &access, 1));
    CU(cuMemRelease(h));
    at.push_back(base + i * kAllocBytes + 4096);  // inside, as a buffer's start usually is
  }
  time_way("cuPointerGetAttribute BLOCK_ID", at, [](CUdeviceptr p) {
    unsigned long long id = 0;
    return cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, p);
  });
  time_way("cuPointerGetAttribute BUFFER_ID", at, [](CUdeviceptr p) {
    unsigned long long id = 0;
    return cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
  });
  time_way("cuPointerGetAttribute MAPPING_BASE", at, [](CUdeviceptr p) {
    CUdeviceptr b = 0;
    return cuPointerGetAttribute(&b, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p);
  });
  time_way("cuPointerGetAttributes 4", at, [](CUdeviceptr p) {
    CUdeviceptr b = 0;
    size_t n = 0;
    unsigned long long id = 0, types = 0;
    CUpointer_attribute which[4] = {
        CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
        CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES};
    void* into[4] = {&b, &n, &id, &types};
    return cuPointerGetAttributes(4, which, into, p);
  });
  time_way("cuPointerGetAttributes BLOCK_ID", at, [](CUdeviceptr p) {
    unsigned long long id = 0;
    CUpointer_attribute which[1] = {CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID};
    void* into[1] = {&id};
    return cuPointerGetAttributes(1, which, into, p);
  });
  time_way("cuMemGetAddressRange", at, [](CUdeviceptr p) {
    CUdeviceptr b = 0;
    size_t n = 0;
    return cuMemGetAddressRange(&b, &n, p);
  });
  time_way("cuMemRetainAllocationHandle+Release", at, [](CUdeviceptr p) {
    CUmemGenericAllocationHandle h = 0;
    CUresult r = cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(p));
    if (r == CUDA_SUCCESS) r = cuMemRelease(h);
    return r;
  });

  CUstream s;
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent ev;
  CU(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  uint32_t* flag = nullptr;
  CU(cuMemHostAlloc(reinterpret_cast<void**>(&flag), 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr dflag = 0;
  CU(cuMemHostGetDevicePointer(&dflag, flag, 0));
  *flag = 1;
  time_call("cuStreamWaitValue32 (met)", s,
            [&] { return cuStreamWaitValue32(s, dflag, 1, CU_STREAM_WAIT_VALUE_GEQ); });
  time_call("cuStreamWriteValue32", s,
            [&] { return cuStreamWriteValue32(s, dflag + 64, 1, 0); });
  // Several waits and writes in one call: what an op's runs of flag operations between copies
  // would cost batched.
  CUstreamBatchMemOpParams ops[3] = {};
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = dflag + 64;
  ops[0].writeValue.value = 1;
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = dflag;
  ops[1].waitValue.value = 1;
  ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  ops[2] = ops[1];
  ops[2].waitValue.address = dflag + 64;
  time_call("cuStreamBatchMemOp 1 (write)", s, [&] { return cuStreamBatchMemOp(s, 1, ops, 0); });
  time_call("cuStreamBatchMemOp 3 (write, 2 waits)", s,
            [&] { return cuStreamBatchMemOp(s, 3, ops, 0); });
  time_call("cuEventRecord", s, [&] { return cuEventRecord(ev, s); });
  time_call("cuStreamWaitEvent", s, [&] { return cuStreamWaitEvent(s, ev, 0); });
  time_call("cuStreamQuery", s, [&] { return cuStreamQuery(s); });
  time_call("cuMemcpyAsync 20 MiB in one alloc", s,
            [&] { return cuMemcpyAsync(base + kAllocBytes, base, kAllocBytes / 2, s); });
  time_call("cuMemcpyAsync 400 MiB across 20", s, [&] {
    return cuMemcpyAsync(base + 40 * kAllocBytes, base, 20 * kAllocBytes, s);
  });
  return 0;
}
