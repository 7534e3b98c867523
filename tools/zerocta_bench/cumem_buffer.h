// --alloc cumem: a device buffer laid out the way PyTorch's expandable segments lay out their
// memory, so the paths can be measured on the memory an application using them hands NCCL:
// one reserved virtual range, physical chunks of 20 MiB (cuMemCreate, exportable as POSIX file
// descriptors) mapped back to back, read/write access for the owning device only. The driver
// API is reached through cudaGetDriverEntryPointByVersion, so the bench links no libcuda.
#pragma once

#include <cstddef>
#include <vector>

namespace zcb {

// PyTorch's expandable-segment size for large allocations (the test's reference; the bench
// takes its chunk from --cumem-chunk).
constexpr size_t kCumemChunkBytes = 20ull << 20;

// The physical chunks of a `bytes` buffer: `chunk` rounded up to `granularity`, as many as
// needed, the last one the remainder rounded up to `granularity`. Pure, for the self-test.
std::vector<size_t> cumem_chunk_sizes(size_t bytes, size_t chunk, size_t granularity);

class CumemBuffer {
 public:
  // Reserves, creates, maps and enables `bytes` on `device` (the current device) in physical
  // allocations of `chunk` bytes; fatal() on any driver error.
  CumemBuffer(int device, size_t bytes, size_t chunk);
  ~CumemBuffer();  // unmap, release, free the range: the reverse order
  CumemBuffer(const CumemBuffer&) = delete;
  CumemBuffer& operator=(const CumemBuffer&) = delete;

  void* ptr() const;

 private:
  unsigned long long base_ = 0;  // CUdeviceptr
  size_t reserved_ = 0;
  std::vector<unsigned long long> handles_;  // CUmemGenericAllocationHandle, one per chunk
  std::vector<size_t> sizes_;
};

}  // namespace zcb
