// Mapping a peer's exported cuMem allocation (a POSIX file descriptor from its fd service,
// fd_exchange.h) into this address space, and releasing it. No NCCL call is involved.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "cuda_driver.h"

namespace zc {

struct ImportedMapping {
  CUdeviceptr va = 0;
  size_t bytes = 0;  // mapped bytes: the whole allocation
  CUmemGenericAllocationHandle handle = 0;
  explicit operator bool() const { return va != 0; }
};

// Maps the allocation behind `fd` (of `bytes`, its whole size: cuMemMap needs offset 0 and the
// imported granularity) at a new address, accessible from `device`. The descriptor stays the
// caller's to close. False (nothing held) on failure.
bool import_mapping(const CudaDriver& cu, int fd, size_t bytes, int device, ImportedMapping* out);

// Unmaps and releases; the physical memory goes when its last mapping anywhere goes.
void release_mapping(const CudaDriver& cu, ImportedMapping* m);

}  // namespace zc
