// The route's own memory: each rank's arena (flags and staging slots, ce_plan.h) is a cuMem
// allocation exportable as a POSIX file descriptor, handed to peers through the fd service
// (fd_exchange.h) and mapped in their address space. No NCCL call is involved.
#pragma once

#include <cuda.h>

#include <cstddef>

#include "cuda_driver.h"

namespace zc {

struct ArenaMapping {
  CUdeviceptr va = 0;
  size_t bytes = 0;  // mapped bytes (a multiple of the allocation granularity)
  CUmemGenericAllocationHandle handle = 0;
  explicit operator bool() const { return va != 0; }
};

// `bytes` rounded up to `device`'s allocation granularity (the size every rank publishes; equal
// GPUs give equal sizes, and the membership compares them).
size_t arena_bytes_for(const CudaDriver& cu, int device, size_t bytes);

// Allocates an exportable arena of exactly `bytes` (arena_bytes_for) on `device`, mapped for
// it. Call with `device` current. False (nothing held) on failure.
bool arena_create(const CudaDriver& cu, int device, size_t bytes, ArenaMapping* out);

// A new file descriptor for the arena's allocation (the caller closes it), or -1.
int arena_export_fd(const CudaDriver& cu, const ArenaMapping& arena);

// Maps a peer's arena from its descriptor at a new address, accessible from `device`. The
// descriptor stays the caller's to close. False (nothing held) on failure.
bool arena_import(const CudaDriver& cu, int fd, size_t bytes, int device, ArenaMapping* out);

// Unmaps and releases; the physical memory goes when its last mapping anywhere goes.
void arena_release(const CudaDriver& cu, ArenaMapping* arena);

}  // namespace zc
