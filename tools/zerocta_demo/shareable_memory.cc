#include "shareable_memory.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <map>

namespace {

// Driver entry points through the runtime: the demo links no libcuda.
template <typename F>
F entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(fn);
}

struct Held {
  size_t bytes;
  CUmemGenericAllocationHandle handle;
};
std::map<void*, Held>& held() {
  static std::map<void*, Held> m;  // one thread per process in the demo
  return m;
}

}  // namespace

void* shareable_alloc(size_t bytes, const char** why) {
  static const auto granularity =
      entry<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  static const auto create = entry<decltype(&cuMemCreate)>("cuMemCreate");
  static const auto reserve = entry<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  static const auto map = entry<decltype(&cuMemMap)>("cuMemMap");
  static const auto set_access = entry<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  int dev = 0;
  if (!granularity || !create || !reserve || !map || !set_access ||
      cudaGetDevice(&dev) != cudaSuccess) {
    *why = "the CUDA driver's virtual memory API is not available";
    return nullptr;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || g == 0) {
    *why = "cuMemGetAllocationGranularity failed";
    return nullptr;
  }
  bytes = (bytes + g - 1) / g * g;
  if (create(&h, bytes, &prop, 0) != CUDA_SUCCESS || reserve(&va, bytes, 0, 0, 0) != CUDA_SUCCESS ||
      map(va, bytes, 0, h, 0) != CUDA_SUCCESS ||
      set_access(va, bytes, &access, 1) != CUDA_SUCCESS) {
    *why = "exportable cuMem allocation failed";
    return nullptr;  // the process ends on this error: nothing to unwind
  }
  void* p = reinterpret_cast<void*>(va);
  held()[p] = Held{bytes, h};
  return p;
}

void shareable_free(void* p) {
  static const auto unmap = entry<decltype(&cuMemUnmap)>("cuMemUnmap");
  static const auto release = entry<decltype(&cuMemRelease)>("cuMemRelease");
  static const auto address_free = entry<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  auto it = held().find(p);
  if (it == held().end() || !unmap || !release || !address_free) return;
  const CUdeviceptr va = reinterpret_cast<CUdeviceptr>(p);
  unmap(va, it->second.bytes);
  release(it->second.handle);
  address_free(va, it->second.bytes);
  held().erase(it);
}
