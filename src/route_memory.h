// The route's cuMem mappings: a peer's exported allocation mapped from its file descriptor (fd
// service, fd_exchange.h), and an allocation of this rank's own that its peers can import (a
// stage, stage_buffer.h). No NCCL call is involved.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "cuda_driver.h"

namespace zc {

struct MappedAllocation {
  CUdeviceptr va = 0;
  size_t bytes = 0;  // mapped bytes: the whole allocation
  CUmemGenericAllocationHandle handle = 0;
  explicit operator bool() const { return va != 0; }
};

// Maps the allocation behind `fd` (of `bytes`, its whole size: cuMemMap needs offset 0 and the
// imported granularity) at a new address, accessible from `device`. The descriptor stays the
// caller's to close. False (nothing held) on failure.
bool import_mapping(const CudaDriver& cu, int fd, size_t bytes, int device, MappedAllocation* out);

// Allocates at least `bytes` on `device` (rounded up to the recommended granularity), exportable
// as a POSIX fd, mapped and accessible from `device` and the `nalso` devices in `also`. False
// (nothing held) on failure.
bool create_exportable(const CudaDriver& cu, size_t bytes, int device, const int* also, int nalso,
                       MappedAllocation* out);

// Unmaps and releases; the physical memory goes when its last mapping anywhere goes.
void release_mapping(const CudaDriver& cu, MappedAllocation* m);

}  // namespace zc
