#include "route_memory.h"

#include <cstdint>

namespace zc {
namespace {

CUmemAllocationProp prop_for(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// Reserves, maps and opens for `device` an allocation already held in `handle`.
bool map_for(const CudaDriver& cu, CUmemGenericAllocationHandle handle, size_t bytes, int device,
             ArenaMapping* out) {
  CUdeviceptr va = 0;
  if (cu.cuMemAddressReserve(&va, bytes, 0, 0, 0) != CUDA_SUCCESS) return false;
  if (cu.cuMemMap(va, bytes, 0, handle, 0) != CUDA_SUCCESS) {
    cu.cuMemAddressFree(va, bytes);
    return false;
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (cu.cuMemSetAccess(va, bytes, &access, 1) != CUDA_SUCCESS) {
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

size_t arena_bytes_for(const CudaDriver& cu, int device, size_t bytes) {
  const CUmemAllocationProp p = prop_for(device);
  size_t g = 0;
  if (cu.cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
          CUDA_SUCCESS ||
      g == 0)
    g = size_t{2} << 20;
  return (bytes + g - 1) / g * g;
}

bool arena_create(const CudaDriver& cu, int device, size_t bytes, ArenaMapping* out) {
  const CUmemAllocationProp p = prop_for(device);
  CUmemGenericAllocationHandle h = 0;
  if (cu.cuMemCreate(&h, bytes, &p, 0) != CUDA_SUCCESS) return false;
  if (!map_for(cu, h, bytes, device, out)) {
    cu.cuMemRelease(h);
    return false;
  }
  return true;
}

int arena_export_fd(const CudaDriver& cu, const ArenaMapping& arena) {
  int fd = -1;
  if (cu.cuMemExportToShareableHandle(&fd, arena.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                      0) != CUDA_SUCCESS)
    return -1;
  return fd;
}

bool arena_import(const CudaDriver& cu, int fd, size_t bytes, int device, ArenaMapping* out) {
  CUmemGenericAllocationHandle h = 0;
  void* os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  if (cu.cuMemImportFromShareableHandle(&h, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
      CUDA_SUCCESS)
    return false;
  if (!map_for(cu, h, bytes, device, out)) {
    cu.cuMemRelease(h);
    return false;
  }
  return true;
}

void arena_release(const CudaDriver& cu, ArenaMapping* arena) {
  if (!arena->va) return;
  cu.cuMemUnmap(arena->va, arena->bytes);
  cu.cuMemAddressFree(arena->va, arena->bytes);
  cu.cuMemRelease(arena->handle);
  *arena = ArenaMapping{};
}

}  // namespace zc
