// The reduce-scatter's test data and check (rs_kernels.cu, built by nvcc): random finite inputs
// in the op's data type (float, half, bfloat16), and a kernel that compares an output bitwise
// with the expected bits (NCCL's own result, or the reduction kernel's adds redone in order)
// and measures its largest distance from the float64 reduction of every rank's input (the sum, the
// mean, or the sum of each input times its rank's scalar).
// Every rank's input is a hash of (seed, rank, element), so any GPU can regenerate all of them:
// nothing is copied between GPUs or to the host.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>

namespace zcb {

// Writes elements [0, n) of rank `rank`'s input for `seed`: element e is uniform in [-1, 1)
// (24 random bits) rounded to `type`, so finite and never NaN. False (nothing launched) for a
// type other than float, half and bfloat16.
bool launch_fill_random(void* dst, uint64_t n, ncclDataType_t type, uint64_t seed, int rank,
                        cudaStream_t stream);

// One output of `count` elements: element j is the reduction over ranks 0..nranks-1 of their
// input element base + j (reduce-scatter: base = the output's rank x count).
struct RsCheck {
  const void* out = nullptr;
  uint64_t count = 0;
  uint64_t base = 0;
  int nranks = 0;
  ncclDataType_t type = ncclFloat32;
  uint64_t seed = 0;
  bool avg = false;     // the mean, else the sum
  bool premul = false;  // the sum of each rank's input times its premul_scalar_bits
  // The bits out must have: `ref` (NCCL's result), else with in_order the reduction kernel's
  // arithmetic redone element by element (src/route/chunk_sum.cu: sources 0, 1, ... in order;
  // avg: a pre-multiplied sum with scale_bits, source 0 fused last), else none (no count).
  const void* ref = nullptr;
  bool in_order = false;
  unsigned scale_bits = 0;  // avg with in_order: the scale in the element type's bits
};

// Adds to *d_wrong the elements whose bits differ from the expected ones, and raises
// *d_maxdiff (the bits of a non-negative double, compared as an integer) to the largest
// |out[j] - float64 reference| (a NaN or infinite output counts as +inf). False for a type
// other than float, half and bfloat16.
bool launch_check_rs(const RsCheck& c, unsigned long long* d_wrong, unsigned long long* d_maxdiff,
                     cudaStream_t stream);

// The scale of an average over n ranks in the bits of `type` (1/n rounded to the type), as the
// sum-kernel floor passes it to the reduction kernel.
unsigned avg_scale_bits(ncclDataType_t type, int n);

// Rank `rank`'s scalar of the pre-multiplied sum of --redop premul and premul-dev in the bits of
// `type` (half, bfloat16: the low 16): (rank + 1) / (nranks + 1), rounded to float, then to the
// type, to nearest even each time; the check multiplies by the same.
unsigned premul_scalar_bits(ncclDataType_t type, int rank, int nranks);

}  // namespace zcb
