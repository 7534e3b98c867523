// Does the layout of the memory a copy engine reads and writes change a peer copy's rate?
// On 4 H200s the route's in-place all-gather ran 0.2 % behind NCCL's copy-engine path at 1 GiB
// and level at 64 MiB, with the same copies on the same engines; the paths' buffers differ
// (the route's: the application's, here PyTorch-like 20 MiB cuMem allocations; NCCL CE's: one
// ncclMemAlloc allocation each, which asks for GPUDirect RDMA and lies in NCCL's symmetric
// address range). This probe pushes 256 MiB from GPU 1 into GPU 0, both buffers of one layout:
//   chunks20      20 MiB allocations mapped back to back (PyTorch's expandable segments)
//   one           one allocation, its address 2 MiB aligned but not 512 MiB aligned
//   one-aligned   one allocation at an address aligned to 1 GiB
//   nccl-like     one allocation with NCCL's properties (gpuDirectRDMACapable where supported,
//                 the recommended granularity), its address aligned to that granularity
//   nccl-aligned  the same at an address aligned to 1 GiB (as a window's first buffer in
//                 NCCL's symmetric range, whose per-rank stride is a multiple of 4 GiB)
//   cuMemAlloc    cudaMalloc's kind of memory
// One process, both GPUs' memory mapped for both (cuMemSetAccess). Per layout, 9 runs of 40
// back-to-back pushes, layouts interleaved run by run; prints µs per push, median (min..max).
// What it showed (4×H200, driver 580, docs/plots/rounds-4xH200/page-layout-*.txt): 679.3 µs a
// push for nccl-aligned, 680.1–680.7 for chunks20, one, one-aligned and cuMemAlloc, 681.0 for
// nccl-like — within 0.25 %, the size of the route's 1 GiB gap, but the route's views of its
// peers' buffers reserved at 1 GiB-aligned addresses ran no faster (views-ab-*.txt).
//   nvcc -O2 -gencode=arch=compute_90,code=sm_90 -o page_layout_probe page_layout_probe.cu -lcuda
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"

namespace {

constexpr size_t kMiB = 1ull << 20;
constexpr size_t kBytes = 256 * kMiB;
constexpr int kPushes = 40, kRuns = 9;

enum Layout { kChunks20, kOne, kOneAligned, kNcclLike, kNcclAligned, kCuMemAlloc, kLayouts };
const char* kNames[] = {"chunks20", "one", "one-aligned", "nccl-like", "nccl-aligned",
                        "cuMemAlloc"};

CUmemAllocationProp props(int dev, bool nccl_like) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (nccl_like) {
    int rdma = 0;
    CU(cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                            dev));
    p.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
  }
  return p;
}

// Maps [va, va + bytes) onto allocations of `piece` bytes on device `dev`, readable and writable
// by both GPUs.
void map_pieces(CUdeviceptr va, size_t bytes, size_t piece, const CUmemAllocationProp& p) {
  for (size_t at = 0; at < bytes; at += piece) {
    CUmemGenericAllocationHandle h;
    CU(cuMemCreate(&h, piece, &p, 0));
    CU(cuMemMap(va + at, piece, 0, h, 0));
    CU(cuMemRelease(h));  // the mapping keeps it
  }
  CUmemAccessDesc a[2] = {};
  for (int d = 0; d < 2; ++d) {
    a[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a[d].location.id = d;
    a[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CU(cuMemSetAccess(va, bytes, a, 2));
}

CUdeviceptr buffer(Layout l, int dev, CUcontext ctx) {
  CU(cuCtxSetCurrent(ctx));
  if (l == kCuMemAlloc) {
    CUdeviceptr p;
    CU(cuMemAlloc(&p, kBytes));
    return p;
  }
  const bool nccl = l == kNcclLike || l == kNcclAligned;
  const CUmemAllocationProp p = props(dev, nccl);
  size_t gran = 0;
  CU(cuMemGetAllocationGranularity(&gran, &p, nccl ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                                                   : CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const size_t piece = l == kChunks20 ? 20 * kMiB : kBytes;
  const size_t span = (kBytes + piece - 1) / piece * piece;  // whole pieces
  CUdeviceptr va = 0;
  if (l == kOneAligned || l == kNcclAligned) {
    CU(cuMemAddressReserve(&va, span, 1024 * kMiB, 0, 0));
  } else if (l == kOne) {  // 2 MiB past a 512 MiB boundary
    CU(cuMemAddressReserve(&va, span + 512 * kMiB, 512 * kMiB, 0, 0));
    va += 2 * kMiB;
  } else {
    CU(cuMemAddressReserve(&va, span, gran, 0, 0));
  }
  map_pieces(va, span, piece, p);
  return va;
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);
  CU(cuInit(0));
  int n = 0;
  CU(cuDeviceGetCount(&n));
  if (n < 2) {
    printf("page_layout_probe: needs 2 GPUs, found %d: skipped\n", n);
    return 0;
  }
  const CUcontext ctx[2] = {primary_context(0), primary_context(1)};
  CU(cuCtxSetCurrent(ctx[1]));
  CU(cuCtxEnablePeerAccess(ctx[0], 0));
  size_t gran_min = 0, gran_rec = 0;
  {
    const CUmemAllocationProp p = props(0, true);
    CU(cuMemGetAllocationGranularity(&gran_min, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CU(cuMemGetAllocationGranularity(&gran_rec, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  }
  printf("granularity: minimum %zu KiB, recommended %zu KiB; %zu MiB pushes, GPU 1 -> GPU 0\n",
         gran_min >> 10, gran_rec >> 10, kBytes / kMiB);
  CUdeviceptr src[kLayouts], dst[kLayouts];
  for (int l = 0; l < kLayouts; ++l) {
    src[l] = buffer(static_cast<Layout>(l), 1, ctx[1]);
    dst[l] = buffer(static_cast<Layout>(l), 0, ctx[0]);
  }
  CU(cuCtxSetCurrent(ctx[1]));
  CUstream s;
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent a, b;
  CU(cuEventCreate(&a, 0));
  CU(cuEventCreate(&b, 0));
  std::vector<double> us[kLayouts];
  for (int run = -1; run < kRuns; ++run)  // run -1 warms every layout up
    for (int l = 0; l < kLayouts; ++l) {
      CU(cuStreamSynchronize(s));
      CU(cuEventRecord(a, s));
      for (int i = 0; i < kPushes; ++i) CU(cuMemcpyAsync(dst[l], src[l], kBytes, s));
      CU(cuEventRecord(b, s));
      CU(cuEventSynchronize(b));
      float ms = 0;
      CU(cuEventElapsedTime(&ms, a, b));
      if (run >= 0) us[l].push_back(1000.0 * ms / kPushes);
    }
  for (int l = 0; l < kLayouts; ++l) {
    std::sort(us[l].begin(), us[l].end());
    const double med = us[l][us[l].size() / 2];
    printf("RESULT %-13s %8.2f us (%.2f..%.2f)  %6.1f GB/s\n", kNames[l], med, us[l].front(),
           us[l].back(), kBytes / (med / 1e6) / 1e9);
  }
  return 0;
}
