// Second mappings of this process's own cuMem buffers, for the GPUs of this process their owner
// did not grant access: legacy CUDA IPC cannot be opened in its own process, but a cuMem
// allocation can be mapped again from its handle. The allocations a buffer lies in are retained
// and mapped back to back at a new address, open to every GPU of a local group plan
// (local_group_allgather.h) that writes into it. Cached by the allocations' block ids, which a
// process never reuses, so an address the application's allocator hands out again never finds a
// stale alias.
//
// An alias keeps its allocations alive after their owner freed them, out of its allocator's
// sight. So every use records an event per device after the copies through it, and tidy()
// releases an alias whose allocations were freed (or the least recently used beyond
// kMaxLocalAliases) once those events have passed; release_idle() releases every alias whose
// events have passed (a communicator's end).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda_driver.h"

namespace zc {

constexpr int kMaxLocalAliases = 64;

// [addr, addr + bytes) of this process's cuMem memory as an address the `ndevices` devices in
// `devices` may write, in *out. False when it is not cuMem memory (or lies across more
// allocations than a post describes, kMaxExtents) or the driver refuses. Call with a context
// current.
bool local_alias(const CudaDriver& cu, uint64_t addr, uint64_t bytes, const int* devices,
                 int ndevices, uint64_t* out);

// The copies through the alias that holds `alias_addr` were issued on `stream` of `device`:
// records the alias's event for that device after them. False on a driver failure.
bool local_alias_used(const CudaDriver& cu, uint64_t alias_addr, int device, CUstream stream);

// Releases the aliases whose allocations their owner freed, and the least recently used beyond
// kMaxLocalAliases, whose copies have finished. Never waits.
void tidy_local_aliases(const CudaDriver& cu);

// Releases every alias whose copies have finished (after a communicator's streams drained).
void release_idle_local_aliases(const CudaDriver& cu);

}  // namespace zc
