// Device helpers of the check and of the GEMM inputs (kernels.cu, built by nvcc).
//
// Moved data (all-gather, broadcast): element e of rank r's chunk is a hash of (seed, r, e),
// so any rank can compute every other rank's chunk on the device and the check never copies
// buffers to the host. The comparison is bitwise, so every data type is checked the same way
// (NaN patterns included): only the element size matters.
//
// Reduced data (all-reduce, reduce-scatter): small integers (reduce_pattern.h), written and
// compared in the real data type, so the sum NCCL computes is checked exactly.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "reduce_pattern.h"

namespace zcb {

// Writes rank `rank`'s chunk pattern for `seed` to dst (elem_bytes in 1, 2, 4, 8; dst aligned
// to elem_bytes; bytes a multiple of elem_bytes).
void launch_fill_pattern(void* dst, size_t bytes, int elem_bytes, uint64_t seed, int rank,
                         cudaStream_t stream);

// Adds to *d_wrong the number of elements of recv (nchunks chunks of chunk_bytes, chunk r
// expected to hold rank r's pattern) that differ bitwise. Chunk skip_chunk (>= 0) is not
// checked. *d_wrong lives in device memory.
void launch_count_wrong(const void* recv, size_t chunk_bytes, int nchunks, int elem_bytes,
                        uint64_t seed, int skip_chunk, unsigned long long* d_wrong,
                        cudaStream_t stream);

// Writes elements [0, n) of rank `rank`'s reduction input, in `type`. Both reduction helpers
// return false (and launch nothing) for a data type they do not know.
bool launch_fill_reduce_input(void* dst, uint64_t n, ncclDataType_t type, const ReducePattern& p,
                              int rank, cudaStream_t stream);

// Adds to *d_wrong the number of elements out[j], j in [0, n), that differ from the sum over
// nranks ranks of input element base + j (all-reduce: base 0; reduce-scatter: rank * n).
bool launch_count_wrong_sum(const void* out, uint64_t n, uint64_t base, int nranks,
                            ncclDataType_t type, const ReducePattern& p,
                            unsigned long long* d_wrong, cudaStream_t stream);

// Fills n bf16 values uniformly in [-1, 1) (the GEMM inputs: random, never constant).
void launch_fill_bf16(void* dst, size_t n, uint64_t seed, cudaStream_t stream);

// The seed of one size/placement: fresh data for every size (the pattern changes, so a stale
// result from the previous size can never pass the check).
inline uint64_t pattern_seed(uint64_t base, int size_index, int in_place) {
  return base * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(size_index) * 2 +
         static_cast<uint64_t>(in_place);
}

}  // namespace zcb
