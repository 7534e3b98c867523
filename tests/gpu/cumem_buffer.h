// GPU memory the way PyTorch's expandable segments hand it out: cuMem allocations exportable as
// POSIX file descriptors, mapped back to back in one reserved range. zerocta's zero-copy route
// reaches such memory from other processes; cudaMalloc memory it reaches only in its process.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zgpu {

// `bytes` on the current device in pieces of at most `piece` bytes (rounded to the allocation
// granularity; 0 = one allocation). Fails the rank on error.
// `fabric`: exportable as FABRIC handles only (as PyTorch's segments on an IMEX node).
// `also_open_to`: more devices granted read-write access (as PyTorch grants the peers it
// enabled access to); by default only the current one.
void* cumem_alloc(size_t bytes, size_t piece = 0, bool fabric = false,
                  const std::vector<int>& also_open_to = {});
void cumem_free(void* p);
// Whether the current device can make FABRIC-exportable memory here (an IMEX channel is open
// to this process): tries one allocation. "" when it can, else why not.
std::string fabric_unavailable();

}  // namespace zgpu
