// GPU memory the way PyTorch's expandable segments hand it out: cuMem allocations exportable as
// POSIX file descriptors, mapped back to back in one reserved range. zerocta's zero-copy route
// reaches such memory from other processes; cudaMalloc memory it reaches only in its process.
#pragma once

#include <cstddef>

namespace zgpu {

// `bytes` on the current device in pieces of at most `piece` bytes (rounded to the allocation
// granularity; 0 = one allocation). Fails the rank on error.
void* cumem_alloc(size_t bytes, size_t piece = 0);
void cumem_free(void* p);

}  // namespace zgpu
