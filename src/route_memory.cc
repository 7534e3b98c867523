#include "route_memory.h"

#include <cstdint>

namespace zc {
namespace {

constexpr int kMaxAccess = 64;  // devices one allocation is opened for (the route's rank limit)

// Reserves, maps and opens for `devices` an allocation already held in `handle`.
bool map_for(const CudaDriver& cu, CUmemGenericAllocationHandle handle, size_t bytes,
             const int* devices, int ndevices, MappedAllocation* out) {
  CUdeviceptr va = 0;
  if (cu.cuMemAddressReserve(&va, bytes, 0, 0, 0) != CUDA_SUCCESS) return false;
  if (cu.cuMemMap(va, bytes, 0, handle, 0) != CUDA_SUCCESS) {
    cu.cuMemAddressFree(va, bytes);
    return false;
  }
  CUmemAccessDesc access[kMaxAccess + 1] = {};
  for (int i = 0; i < ndevices; ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devices[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  if (cu.cuMemSetAccess(va, bytes, access, static_cast<size_t>(ndevices)) != CUDA_SUCCESS) {
    cu.cuMemUnmap(va, bytes);
    cu.cuMemAddressFree(va, bytes);
    return false;
  }
  out->va = va;
  out->bytes = bytes;
  out->handle = handle;
  return true;
}

}  // namespace

bool import_mapping(const CudaDriver& cu, int fd, size_t bytes, int device, MappedAllocation* out) {
  CUmemGenericAllocationHandle h = 0;
  void* os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  if (cu.cuMemImportFromShareableHandle(&h, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
      CUDA_SUCCESS)
    return false;
  if (!map_for(cu, h, bytes, &device, 1, out)) {
    cu.cuMemRelease(h);
    return false;
  }
  return true;
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
  if (!map_for(cu, h, rounded, devices, nalso + 1, out)) {
    cu.cuMemRelease(h);
    return false;
  }
  return true;
}

void release_mapping(const CudaDriver& cu, MappedAllocation* m) {
  if (!m->va) return;
  cu.cuMemUnmap(m->va, m->bytes);
  cu.cuMemAddressFree(m->va, m->bytes);
  cu.cuMemRelease(m->handle);
  *m = MappedAllocation{};
}

}  // namespace zc
