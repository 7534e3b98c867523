// The route's cuMem mappings: peers' exported allocations imported from their file descriptors
// (fd service, fd_exchange.h) and mapped back to back, and an allocation of this rank's own that
// its peers can import (a stage, stage_buffer.h). No NCCL call is involved.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "cuda_driver.h"

namespace zc {

struct MappedAllocation {
  CUdeviceptr va = 0;
  size_t bytes = 0;  // mapped bytes: the whole allocation
  CUmemGenericAllocationHandle handle = 0;
  explicit operator bool() const { return va != 0; }
};

// Imports the allocation behind `fd` (a peer's export) into *handle, unmapped. The descriptor
// stays the caller's to close. False (nothing held) on failure.
bool import_allocation(const CudaDriver& cu, int fd, CUmemGenericAllocationHandle* handle);
// The same from the 64 bytes of a FABRIC handle (cuMem memory of an IMEX node).
bool import_fabric_allocation(const CudaDriver& cu, const void* fabric_handle,
                              CUmemGenericAllocationHandle* handle);

// Maps `n` allocations back to back at one new address, each whole (cuMemMap needs offset 0
// and the imported granularity: `bytes[i]` is allocation i's whole size), accessible from the
// `ndevices` devices in `devices`, so that a buffer its owner laid across them is one range
// here too. *va is the address of the first; the handles stay the caller's. False (nothing
// mapped) on failure.
bool map_back_to_back(const CudaDriver& cu, const CUmemGenericAllocationHandle* handles,
                      const uint64_t* bytes, size_t n, const int* devices, int ndevices,
                      CUdeviceptr* va);

// Undoes map_back_to_back (the same sizes, in the same order) and frees the address range.
void unmap_back_to_back(const CudaDriver& cu, CUdeviceptr va, const uint64_t* bytes, size_t n);

// Allocates at least `bytes` on `device` (rounded up to the recommended granularity), exportable
// as a POSIX fd, mapped and accessible from `device` and the `nalso` devices in `also`. False
// (nothing held) on failure.
bool create_exportable(const CudaDriver& cu, size_t bytes, int device, const int* also, int nalso,
                       MappedAllocation* out);

// Unmaps and releases; the physical memory goes when its last mapping anywhere goes.
void release_mapping(const CudaDriver& cu, MappedAllocation* m);

}  // namespace zc
