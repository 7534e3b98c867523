// How much host time (CPU time inside the driver call, not GPU time) does issuing one copy cost
// when its source and destination span many cuMem allocations mapped back to back, and does
// another issue API cost less? PyTorch's expandable segments are 20 MiB allocations each;
// zerocta copies an 805 MB buffer spanning ~40 of them with one cuMemcpyAsync and measured
// ~38 us of host time per call.
//
// One process, two GPUs (GPU 0's stream issues every copy, GPU 0 -> GPU 1). For k = 1, 4, 16, 40
// pieces of 20 MiB, the destination is
//   one       a single k*20 MiB allocation on GPU 1 (the source a single one on GPU 0 too)
//   local     k allocations on GPU 1 mapped back to back, access for GPUs 0 and 1
//   imported  the same k allocations exported to POSIX fds, imported again in this process and
//             mapped back to back at a second address, access for GPU 0 (as zerocta maps a
//             peer's memory)
// and the source, but for "one", k allocations on GPU 0 mapped back to back. Each copy moves
// the whole range, issued by
//   cuMemcpyAsync, cuMemcpyDtoDAsync, cuMemcpyPeerAsync (primary contexts),
//   cuMemcpyBatchAsync (one entry), per-piece (one cuMemcpyAsync per 20 MiB piece; the k
//   calls' total)
// 5 warm-up issues, then 200 timed (100 at k = 40); the stream is synchronized after each
// issue, outside the timed region, so the issue never waits for a full queue.
//
// Prints, per (k, destination):
//   copy-issue k=K dst=D API  median M us  p90 P us    host time of one issue
//   pointer-attr k=K dst=D API  median M us  p90 P us  cuPointerGetAttribute(MEMORY_BLOCK_ID)
//       and cuPointerGetAttributes(MAPPING_BASE_ADDR, MAPPING_SIZE, MEMORY_BLOCK_ID) on the
//       destination's middle byte, 1000 calls each
//   pointer-info k=K dst=D ...                         what those attributes returned
//   copy-check k=40 dst=D API PASS|FAIL                bytes at the start, middle and end of
//       the destination after one copy, each 20 MiB piece of the source holding its own byte
// and once, whether importing a handle in its own process returned the same handle.
//   nvcc -O2 -std=c++17 -arch=sm_90 -o copy_issue_probe tests/gpu/probes/copy_issue_probe.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"
#include "probe_fds.h"

constexpr size_t kPiece = 20ull << 20;  // one expandable segment

// Handles mapped back to back at one reserved address range.
struct Range {
  CUdeviceptr va = 0;
  size_t bytes = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};

// Maps `handles` (each `piece` bytes) back to back at a new address range, read-write for each
// of `devs`. One cuMemSetAccess over the whole range, as zerocta does.
Range map_back_to_back(std::vector<CUmemGenericAllocationHandle> handles, size_t piece,
                       const std::vector<int>& devs) {
  Range r;
  r.bytes = handles.size() * piece;
  r.handles = std::move(handles);
  CU(cuMemAddressReserve(&r.va, r.bytes, 0, 0, 0));
  for (size_t i = 0; i < r.handles.size(); ++i)
    CU(cuMemMap(r.va + i * piece, piece, 0, r.handles[i], 0));
  std::vector<CUmemAccessDesc> access(devs.size());
  for (size_t i = 0; i < devs.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devs[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CU(cuMemSetAccess(r.va, r.bytes, access.data(), access.size()));
  return r;
}

// `count` allocations of `piece` bytes on `dev`, exportable to POSIX fds, mapped back to back.
Range create_range(int dev, size_t count, size_t piece, const std::vector<int>& devs) {
  const CUmemAllocationProp p = prop(dev);
  std::vector<CUmemGenericAllocationHandle> h(count);
  for (auto& x : h) CU(cuMemCreate(&x, piece, &p, 0));
  return map_back_to_back(std::move(h), piece, devs);
}

// `of`'s allocations exported to fds and imported again, mapped back to back at a new range
// (the model of a peer's memory). Sets `same_handle` when an import returned the original.
Range import_range(const Range& of, const std::vector<int>& devs, bool* same_handle) {
  std::vector<CUmemGenericAllocationHandle> h(of.handles.size());
  for (size_t i = 0; i < h.size(); ++i) {
    int fd = -1;
    CU(cuMemExportToShareableHandle(&fd, of.handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                    0));
    CU(cuMemImportFromShareableHandle(&h[i], reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);  // the imported handle holds its own reference
    if (h[i] == of.handles[i]) *same_handle = true;
  }
  return map_back_to_back(std::move(h), of.bytes / of.handles.size(), devs);
}

// A failed cuMemRelease only warns: should an import in the same process hand back the original
// handle without a reference of its own, the second release fails, and the probe's findings so
// far still stand.
void free_range(Range& r) {
  CU(cuMemUnmap(r.va, r.bytes));
  CU(cuMemAddressFree(r.va, r.bytes));
  for (auto h : r.handles)
    if (cuMemRelease(h) != CUDA_SUCCESS) printf("note: cuMemRelease failed for a handle\n");
  r = Range{};
}

const char* error_name(CUresult r) {
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  return s ? s : "?";
}

enum Api { kMemcpy, kDtoD, kPeer, kBatch, kPerPiece, kApis };
const char* const kApiNames[kApis] = {"cuMemcpyAsync", "cuMemcpyDtoDAsync", "cuMemcpyPeerAsync",
                                      "cuMemcpyBatchAsync", "per-piece"};

struct Copy {
  CUdeviceptr dst, src;
  size_t bytes;
  CUcontext dst_ctx, src_ctx;
  CUstream stream;
};

// Issues one copy of the whole range with `api`; returns the first failure. Not CU: an API the
// driver refuses for a layout is a finding, printed, and the probe goes on.
CUresult issue(Api api, const Copy& c) {
  switch (api) {
    case kMemcpy:
      return cuMemcpyAsync(c.dst, c.src, c.bytes, c.stream);
    case kDtoD:
      return cuMemcpyDtoDAsync(c.dst, c.src, c.bytes, c.stream);
    case kPeer:
      return cuMemcpyPeerAsync(c.dst, c.dst_ctx, c.src, c.src_ctx, c.bytes, c.stream);
    case kBatch: {
#if CUDA_VERSION >= 12080
      CUdeviceptr dst = c.dst, src = c.src;
      size_t bytes = c.bytes, attr_idx = 0;
      CUmemcpyAttributes attr{};
      attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
#if CUDA_VERSION >= 13000  // cuda.h maps the name to cuMemcpyBatchAsync_v2, without failIdx
      return cuMemcpyBatchAsync(&dst, &src, &bytes, 1, &attr, &attr_idx, 1, c.stream);
#else
      size_t fail_idx = 0;
      return cuMemcpyBatchAsync(&dst, &src, &bytes, 1, &attr, &attr_idx, 1, &fail_idx, c.stream);
#endif
#else
      return CUDA_ERROR_NOT_SUPPORTED;
#endif
    }
    case kPerPiece:
      for (size_t at = 0; at < c.bytes; at += kPiece) {
        const CUresult r = cuMemcpyAsync(c.dst + at, c.src + at, kPiece, c.stream);
        if (r != CUDA_SUCCESS) return r;
      }
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

double us_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

// Prints `label` with the median and 90th percentile of `us` (sorted in place).
void print_times(const char* label, std::vector<double>& us) {
  const double median = median_of(us);  // sorts
  printf("%s  median %7.1f us  p90 %7.1f us\n", label, median, us[us.size() * 9 / 10]);
}

void time_issues(const char* what, Api api, const Copy& c, int reps) {
  char label[160];
  snprintf(label, sizeof label, "copy-issue %s %-18s", what, kApiNames[api]);
  std::vector<double> us;
  us.reserve(static_cast<size_t>(reps));
  for (int i = 0; i < 5 + reps; ++i) {
    const auto t = std::chrono::steady_clock::now();
    const CUresult r = issue(api, c);
    const double took = us_since(t);
    if (r != CUDA_SUCCESS) {
      printf("%s  failed: %s\n", label, error_name(r));
      CU(cuStreamSynchronize(c.stream));
      return;
    }
    CU(cuStreamSynchronize(c.stream));
    if (i >= 5) us.push_back(took);
  }
  print_times(label, us);
}

// The time of cuPointerGetAttribute(MEMORY_BLOCK_ID) and of cuPointerGetAttributes with three
// attributes on `ptr`, and what they returned: how zerocta could find an address's allocation.
void time_pointer_queries(const char* what, CUdeviceptr ptr, CUdeviceptr range_va) {
  constexpr int kCalls = 1000;
  std::vector<double> one, three;
  unsigned long long block_id = 0;
  void* base = nullptr;
  size_t size = 0;
  unsigned long long block_id3 = 0;
  CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                  CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
                                  CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID};
  void* data[3] = {&base, &size, &block_id3};
  for (int i = 0; i < kCalls; ++i) {
    auto t = std::chrono::steady_clock::now();
    CUresult r = cuPointerGetAttribute(&block_id, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, ptr);
    one.push_back(us_since(t));
    if (r == CUDA_SUCCESS) {
      t = std::chrono::steady_clock::now();
      r = cuPointerGetAttributes(3, attrs, data, ptr);
      three.push_back(us_since(t));
    }
    if (r != CUDA_SUCCESS) {  // a finding, not the end of the probe
      printf("pointer-attr %s failed: %s\n", what, error_name(r));
      return;
    }
  }
  char label[160];
  snprintf(label, sizeof label, "pointer-attr %s %-30s", what, "cuPointerGetAttribute(BLOCK_ID)");
  print_times(label, one);
  snprintf(label, sizeof label, "pointer-attr %s %-30s", what, "cuPointerGetAttributes(3)");
  print_times(label, three);
  // The mapping's base relative to the range says whether "mapping" means one allocation's
  // piece or the whole reserved range.
  printf("pointer-info %s mapping_base=range+%lld MiB mapping_size=%zu MiB block_id=%llu\n", what,
         static_cast<long long>(reinterpret_cast<CUdeviceptr>(base) - range_va) / (1 << 20),
         size >> 20, block_id);
}

// Fills each 20 MiB piece of `src` with its own byte, clears `dst`, copies once with `api` and
// compares 64 bytes at the start, middle and end of `dst`. Per piece: a memset spanning several
// allocations is not what is being checked.
bool copy_is_right(Api api, const Copy& c, CUdeviceptr dst_va) {
  auto byte_at = [](size_t off) { return static_cast<unsigned char>(0x11 + 7 * (off / kPiece)); };
  for (size_t at = 0; at < c.bytes; at += kPiece) {
    CU(cuMemsetD8(c.src + at, byte_at(at), kPiece));
    CU(cuMemsetD8(dst_va + at, 0, kPiece));
  }
  CU(cuCtxSynchronize());
  if (issue(api, c) != CUDA_SUCCESS) return false;
  CU(cuStreamSynchronize(c.stream));
  constexpr size_t kLook = 64;
  for (size_t off : {size_t{0}, c.bytes / 2 - kLook / 2, c.bytes - kLook}) {
    unsigned char got[kLook];
    CU(cuMemcpyDtoH(got, dst_va + off, kLook));
    for (size_t i = 0; i < kLook; ++i)
      if (got[i] != byte_at(off + i)) return false;
  }
  return true;
}

// Peer access both ways through the runtime (the same primary contexts), tolerating an
// already-enabled one; without it the copies still run, staged, and the times say so.
void enable_peer_access() {
  for (int d : {0, 1}) {
    int can = 0;
    CK(cudaDeviceCanAccessPeer(&can, d, 1 - d));
    if (!can) {
      printf("note: GPU %d cannot access GPU %d as a peer\n", d, 1 - d);
      continue;
    }
    CK(cudaSetDevice(d));
    const cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();  // clear the sticky-until-read error
    else
      CK(e);
  }
  CK(cudaSetDevice(0));
}

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (!gpus_for_probe("copy_issue_probe")) return 0;
  CU(cuInit(0));
  CUcontext ctx[2];
  for (int d : {0, 1}) {
    CUdevice dev;
    CU(cuDeviceGet(&dev, d));
    CU(cuDevicePrimaryCtxRetain(&ctx[d], dev));
  }
  enable_peer_access();
  CU(cuCtxSetCurrent(ctx[0]));

  for (int d : {0, 1}) {  // 20 MiB pieces must be a multiple of the granularity to map them
    const CUmemAllocationProp p = prop(d);
    size_t gran = 0;
    CU(cuMemGetAllocationGranularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (kPiece % gran != 0) {
      printf("copy_issue_probe: GPU %d's granularity %zu does not divide 20 MiB\n", d, gran);
      return 1;
    }
  }

  CUstream stream;
  CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  bool same_handle = false;
  for (size_t k : {size_t{1}, size_t{4}, size_t{16}, size_t{40}}) {
    const int reps = k == 40 ? 100 : 200;  // 800 MiB copies: keep the whole run well under 60 s
    Range one_src = create_range(0, 1, k * kPiece, {0, 1});
    Range one_dst = create_range(1, 1, k * kPiece, {0, 1});
    Range src = create_range(0, k, kPiece, {0, 1});
    Range dst = create_range(1, k, kPiece, {0, 1});
    Range imported = import_range(dst, {0}, &same_handle);
    if (k == 1)  // said at once: it decides whether "imported" models a peer's handles at all
      printf("import: importing a handle in its own process returned %s handle\n",
             same_handle ? "the same" : "a new");
    struct Layout {
      const char* name;
      CUdeviceptr src, dst;
    } layouts[] = {{"one", one_src.va, one_dst.va},
                   {"local", src.va, dst.va},
                   {"imported", src.va, imported.va}};
    for (const Layout& l : layouts) {
      const Copy c{l.dst, l.src, k * kPiece, ctx[1], ctx[0], stream};
      char what[64];
      snprintf(what, sizeof what, "k=%-2zu dst=%-8s", k, l.name);
      for (int api = 0; api < kApis; ++api) time_issues(what, static_cast<Api>(api), c, reps);
      time_pointer_queries(what, l.dst + c.bytes / 2, l.dst);
      if (k == 40)
        for (int api = 0; api < kApis; ++api)
          printf("copy-check %s %-18s %s\n", what, kApiNames[api],
                 copy_is_right(static_cast<Api>(api), c, l.dst) ? "PASS" : "FAIL");
    }
    CU(cuCtxSynchronize());
    free_range(imported);
    free_range(dst);
    free_range(src);
    free_range(one_dst);
    free_range(one_src);
  }
  CU(cuStreamDestroy(stream));
  for (int d : {0, 1}) {
    CUdevice dev;
    CU(cuDeviceGet(&dev, d));
    CU(cuDevicePrimaryCtxRelease(dev));
  }
  return 0;
}
