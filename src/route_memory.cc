#include "route_memory.h"

#include <cstdint>

namespace zc {
namespace {

// Reserves, maps and opens for `device` an allocation already held in `handle`.
bool map_for(const CudaDriver& cu, CUmemGenericAllocationHandle handle, size_t bytes, int device,
             ImportedMapping* out) {
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

bool import_mapping(const CudaDriver& cu, int fd, size_t bytes, int device, ImportedMapping* out) {
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

void release_mapping(const CudaDriver& cu, ImportedMapping* m) {
  if (!m->va) return;
  cu.cuMemUnmap(m->va, m->bytes);
  cu.cuMemAddressFree(m->va, m->bytes);
  cu.cuMemRelease(m->handle);
  *m = ImportedMapping{};
}

}  // namespace zc
