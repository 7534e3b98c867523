#include "route_memory.h"

#include <cstring>

#include <cstdint>

namespace zc {
namespace {

constexpr int kMaxAccess = 64;  // devices one allocation is opened for (the route's rank limit)

// Unmaps the first `n` of the allocations mapped back to back at `va`; returns their bytes.
uint64_t unmap_first(const CudaDriver& cu, CUdeviceptr va, const uint64_t* bytes, size_t n) {
  uint64_t at = 0;
  for (size_t i = 0; i < n; at += bytes[i], ++i) cu.cuMemUnmap(va + at, bytes[i]);
  return at;
}

}  // namespace

bool import_allocation(const CudaDriver& cu, int fd, CUmemGenericAllocationHandle* handle) {
  *handle = 0;
  void* os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  return cu.cuMemImportFromShareableHandle(handle, os_handle,
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
         CUDA_SUCCESS;
}

bool import_fabric_allocation(const CudaDriver& cu, const void* fabric_handle,
                              CUmemGenericAllocationHandle* handle) {
  *handle = 0;
  CUmemFabricHandle copy;
  memcpy(&copy, fabric_handle, sizeof copy);
  return cu.cuMemImportFromShareableHandle(handle, &copy, CU_MEM_HANDLE_TYPE_FABRIC) ==
         CUDA_SUCCESS;
}

bool map_back_to_back(const CudaDriver& cu, const CUmemGenericAllocationHandle* handles,
                      const uint64_t* bytes, size_t n, const int* devices, int ndevices,
                      CUdeviceptr* va) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += bytes[i];
  *va = 0;
  CUdeviceptr base = 0;
  if (n == 0 || ndevices < 1 || ndevices > kMaxAccess + 1 ||
      cu.cuMemAddressReserve(&base, total, 0, 0, 0) != CUDA_SUCCESS)
    return false;
  CUmemAccessDesc access[kMaxAccess + 1] = {};
  for (int i = 0; i < ndevices; ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devices[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  // Each allocation is mapped and opened on its own: the driver's calls take one mapping each.
  size_t mapped = 0;
  uint64_t at = 0;
  for (; mapped < n; at += bytes[mapped], ++mapped) {
    if (cu.cuMemMap(base + at, bytes[mapped], 0, handles[mapped], 0) != CUDA_SUCCESS) break;
    if (cu.cuMemSetAccess(base + at, bytes[mapped], access, static_cast<size_t>(ndevices)) !=
        CUDA_SUCCESS) {
      cu.cuMemUnmap(base + at, bytes[mapped]);
      break;
    }
  }
  if (mapped < n) {
    unmap_first(cu, base, bytes, mapped);
    cu.cuMemAddressFree(base, total);
    return false;
  }
  *va = base;
  return true;
}

void unmap_back_to_back(const CudaDriver& cu, CUdeviceptr va, const uint64_t* bytes, size_t n) {
  cu.cuMemAddressFree(va, unmap_first(cu, va, bytes, n));
}

bool create_exportable(const CudaDriver& cu, size_t bytes, int device, const int* also, int nalso,
                       MappedAllocation* out) {
  if (nalso < 0 || nalso >= kMaxAccess) return false;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granule = 0;
  if (cu.cuMemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
          CUDA_SUCCESS ||
      granule == 0)
    return false;
  const size_t rounded = (bytes + granule - 1) / granule * granule;
  CUmemGenericAllocationHandle h = 0;
  if (cu.cuMemCreate(&h, rounded, &prop, 0) != CUDA_SUCCESS) return false;
  int devices[kMaxAccess + 1] = {device};
  for (int i = 0; i < nalso; ++i) devices[i + 1] = also[i];
  const uint64_t size = rounded;
  if (!map_back_to_back(cu, &h, &size, 1, devices, nalso + 1, &out->va)) {
    cu.cuMemRelease(h);
    return false;
  }
  out->bytes = rounded;
  out->handle = h;
  return true;
}

void release_mapping(const CudaDriver& cu, MappedAllocation* m) {
  if (!m->va) return;
  const uint64_t size = m->bytes;
  unmap_back_to_back(cu, m->va, &size, 1);
  cu.cuMemRelease(m->handle);
  *m = MappedAllocation{};
}

}  // namespace zc
