// --alloc cumem: a device buffer laid out the way PyTorch's expandable segments lay out their
// memory, so the paths can be measured on the memory an application using them hands NCCL:
// one reserved virtual range, physical chunks of 20 MiB (cuMemCreate, exportable as POSIX file
// descriptors) mapped back to back, read/write access for the owning device only. The driver
// API is reached through cudaGetDriverEntryPointByVersion, so the bench links no libcuda.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace zcb {

// PyTorch's expandable-segment size for large allocations (the test's reference; the bench
// takes its chunk from --cumem-chunk).
constexpr size_t kCumemChunkBytes = 20ull << 20;

// The physical chunks of a `bytes` buffer: `chunk` rounded up to `granularity`, as many as
// needed, the last one the remainder rounded up to `granularity`. Pure, for the self-test.
std::vector<size_t> cumem_chunk_sizes(size_t bytes, size_t chunk, size_t granularity);

// --cumem-props: what ncclMemAlloc gives its allocations and PyTorch's segments lack, each on
// its own, so that a difference between the two kinds of memory can be pinned to one of them.
// (ncclMemAlloc's FABRIC handle type is left out: the lent hosts refuse FABRIC memory, so their
// ncclMemAlloc buffers have none either.)
struct CumemProps {
  bool rdma = false;         // allocFlags.gpuDirectRDMACapable where the GPU supports it
  bool recommended = false;  // chunks and VA alignment at the recommended granularity
  bool peer_access = false;  // read/write access for every device that can reach this one
};

// "rdma,recommended,peers" (any subset, any order) or "none"; false on anything else.
bool parse_cumem_props(const std::string& text, CumemProps* out);
// The inverse: "none" or the set in the order above.
std::string cumem_props_name(const CumemProps& props);

class CumemBuffer {
 public:
  // Reserves, creates, maps and enables `bytes` on `device` (the current device) in physical
  // allocations of `chunk` bytes with `props`; fatal() on any driver error.
  CumemBuffer(int device, size_t bytes, size_t chunk, const CumemProps& props);
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
