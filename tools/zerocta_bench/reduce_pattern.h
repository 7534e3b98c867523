// Test data of the reductions (all-reduce, reduce-scatter with ncclSum): small integers, so
// every input and every partial sum NCCL can form, in any order, is exact in the data type and
// the expected output is known exactly on the device without copying anything back. Element i
// of rank r's input is ((7i + 13r + shift) mod (2k+1)) - k + offset: k = 8 gives the values
// -8..8 (unsigned types: 0..16); k shrinks for narrow types and many ranks (see
// make_reduce_pattern). Shared by the host (self-test) and the device (kernels.cu).
#pragma once

#include <nccl.h>

#include <cstdint>

#if defined(__CUDACC__)
#define ZCB_HOST_DEVICE __host__ __device__
#else
#define ZCB_HOST_DEVICE
#endif

namespace zcb {

struct ReducePattern {
  uint64_t amplitude = 8;  // k: values span 2k+1 consecutive integers
  uint64_t offset = 0;     // k for unsigned types (values >= 0), else 0
  uint64_t shift = 0;      // per size and placement, so a stale output never passes
};

ZCB_HOST_DEVICE inline int64_t reduce_input_value(const ReducePattern& p, uint64_t i, int rank) {
  const uint64_t period = 2 * p.amplitude + 1;
  const uint64_t v = (i * 7 + static_cast<uint64_t>(rank) * 13 + p.shift) % period;
  return static_cast<int64_t>(v) - static_cast<int64_t>(p.amplitude) +
         static_cast<int64_t>(p.offset);
}

// The exact sum over ranks 0..nranks-1 of element i.
ZCB_HOST_DEVICE inline int64_t reduce_expected_sum(const ReducePattern& p, uint64_t i, int nranks) {
  int64_t sum = 0;
  for (int r = 0; r < nranks; ++r) sum += reduce_input_value(p, i, r);
  return sum;
}

// The largest M such that every integer in [-M, M] (unsigned types: [0, M]) is exactly
// representable in `type`: int8 127, half 2048, bfloat16 256, f8e4m3 16, f8e5m2 8, ...
uint64_t exact_integer_limit(ncclDataType_t type);
bool is_unsigned_type(ncclDataType_t type);

// The pattern for `type` on `nranks` ranks: k = min(8, M / nranks) (unsigned: M / (2 nranks)),
// so no sum of up to nranks inputs leaves the exact range. k = 0 (e.g. f8e5m2 on more than 8
// ranks) makes every value 0: the check then still finds unwritten (poisoned) elements.
ReducePattern make_reduce_pattern(ncclDataType_t type, int nranks, uint64_t seed);

}  // namespace zcb
