// Device side of the reduce-scatter soak (gpu_rs_soak_test.cc). Every input element is a hash
// of (seed, rank, index), so that any rank recomputes any other rank's input: the float64
// reference of a rank's output needs no exchange, and the checks of hundreds of MiB per op run
// on the GPU. The element functions are also compiled for the host, for error messages.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gpu_kernels.h"  // ZG_HOST_DEVICE

namespace zgpu {

// The element types the shim's reduce-scatter route sums.
enum class RsElem : uint8_t { kF32, kF16, kBF16 };

ZG_HOST_DEVICE inline size_t rs_elem_bytes(RsElem t) { return t == RsElem::kF32 ? 4 : 2; }

// Input element `index` of rank `src` for an op seeded with `seed`, as the element's bits:
// finite, a random sign and mantissa, magnitude in [1/16, 4) (sums round, never overflow,
// never go subnormal), and one element in 32 a zero of either sign (where a sum's sign of zero
// shows its order and starting value).
ZG_HOST_DEVICE inline uint32_t rs_input_bits(RsElem t, uint64_t seed, int src, uint64_t index) {
  uint64_t x = seed ^ (static_cast<uint64_t>(src + 1) * 0xD1B54A32D192ED03ull) ^
               (index * 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  const uint32_t sign = static_cast<uint32_t>(x >> 63);
  const bool zero = (x & 31) == 0;
  const int exponent = -4 + static_cast<int>((x >> 8) % 6);  // 2^-4 .. 2^1
  const uint32_t mantissa = static_cast<uint32_t>(x >> 16);
  uint32_t magnitude = 0;  // exponent and mantissa fields
  uint32_t sign_bit = 15;
  switch (t) {
    case RsElem::kF32:
      magnitude = (static_cast<uint32_t>(127 + exponent) << 23) | (mantissa & 0x7FFFFFu);
      sign_bit = 31;
      break;
    case RsElem::kF16:
      magnitude = (static_cast<uint32_t>(15 + exponent) << 10) | (mantissa & 0x3FFu);
      break;
    case RsElem::kBF16:
      magnitude = (static_cast<uint32_t>(127 + exponent) << 7) | (mantissa & 0x7Fu);
      break;
  }
  return (sign << sign_bit) | (zero ? 0u : magnitude);
}

ZG_HOST_DEVICE inline double rs_double_from_bits(uint64_t bits) {
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

// 2^k for -1022 <= k <= 1023.
ZG_HOST_DEVICE inline double rs_pow2(int k) {
  return rs_double_from_bits(static_cast<uint64_t>(1023 + k) << 52);
}

// An element's bits as a double (exact: every float, half and bfloat16 is a double), NaN,
// infinities and subnormals included: an output may hold anything.
ZG_HOST_DEVICE inline double rs_to_double(RsElem t, uint32_t bits) {
  if (t == RsElem::kF32) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return static_cast<double>(f);
  }
  const int mant = t == RsElem::kF16 ? 10 : 7;
  const int bias = t == RsElem::kF16 ? 15 : 127;
  const uint32_t exp_max = t == RsElem::kF16 ? 31u : 255u;
  const uint32_t e = (bits >> mant) & exp_max;
  const uint32_t f = bits & ((1u << mant) - 1);
  const uint64_t sign = static_cast<uint64_t>((bits >> 15) & 1) << 63;
  if (e == exp_max)
    return rs_double_from_bits(sign | (f ? 0x7FF8000000000000ull : 0x7FF0000000000000ull));
  const double magnitude =
      e == 0 ? static_cast<double>(f) * rs_pow2(1 - bias - mant)
             : static_cast<double>(f | (1u << mant)) * rs_pow2(static_cast<int>(e) - bias - mant);
  return sign ? -magnitude : magnitude;
}

// How an op reduces the ranks' inputs: NCCL's sum, its average, or a pre-multiplied sum
// (ncclRedOpCreatePreMulSum), where each rank's input is multiplied by that rank's own scalar.
enum class RsRed : uint8_t { kSum, kAvg, kPreMulSum };

// Ranks the float64 reference sums exactly (see rs_reference).
constexpr int kRsMaxRanks = 8;

struct RsReduction {
  RsRed kind = RsRed::kSum;
  double scale[kRsMaxRanks] = {};  // kPreMulSum: rank q's scalar, as the element type holds it
};

// The scalar `value` in the element type's bits (fp16/bf16: the low 16), rounded to float and
// then to the type, to nearest even each time, as NCCL rounds ncclAvg's 1/n.
uint32_t rs_scalar_bits(RsElem t, double value);

// Output element `index` of an op seeded with `seed` in float64: the reduction of input element
// `index` of ranks 0 .. nranks - 1 (nranks <= kRsMaxRanks). Exact for the sum: up to 8 terms of
// 24 significant bits within 6 binades fit in 53 bits; a product with a scalar of the type is
// exact too, their sum within a rounding of float64. *magnitude gets the sum of the terms'
// magnitudes (reduced alike), the scale of the rounding an element type's sum may add.
ZG_HOST_DEVICE inline double rs_reference(RsElem t, uint64_t seed, int nranks, uint64_t index,
                                          const RsReduction& red, double* magnitude) {
  double sum = 0, total = 0;
  for (int q = 0; q < nranks; ++q) {
    double v = rs_to_double(t, rs_input_bits(t, seed, q, index));
    if (red.kind == RsRed::kPreMulSum) v *= red.scale[q];
    sum += v;
    total += fabs(v);
  }
  if (red.kind == RsRed::kAvg) {
    sum /= nranks;
    total /= nranks;
  }
  *magnitude = total;
  return sum;
}

// What the checks of one op found. Offsets are element indices into the checked range (bytes
// for the poison), ~0 when none; maxima are the bits of non-negative doubles (ordered as the
// doubles are), +infinity for a NaN.
struct RsOpCheck {
  unsigned long long differ_from_nccl, first_differ_from_nccl;    // output bits != NCCL's
  unsigned long long out_beyond_bound, first_out_beyond_bound;    // output too far from float64
  unsigned long long nccl_beyond_bound, first_nccl_beyond_bound;  // NCCL's output so
  unsigned long long input_changed, first_input_changed;    // input not as written before the op
  unsigned long long poison_changed, first_poison_changed;  // bytes beside the buffers written
  unsigned long long max_out_error, max_nccl_error, max_out_vs_nccl;
};

void rs_reset_check(RsOpCheck* device_check, cudaStream_t stream);

// dst[i] = rs_input_bits(t, seed, src, i) for i < count.
void rs_fill_input(void* dst, RsElem t, size_t count, uint64_t seed, int src, cudaStream_t stream);

// One rank's output of a reduce-scatter: `count` elements at `out`, the reduction `red` over
// the `nranks` ranks of input elements first_index .. first_index + count - 1. Compares `out`
// with NCCL's output `nccl_out` bit for bit, and both with rs_reference within the rounding of
// a sum of nranks terms in the element type.
void rs_check_output(const void* out, const void* nccl_out, RsElem t, size_t count,
                     uint64_t first_index, int nranks, const RsReduction& red, uint64_t seed,
                     RsOpCheck* device_check, cudaStream_t stream);

// Checks that the `count` input elements of rank `src` at `in` are still as rs_fill_input
// wrote them, except [skip_begin, skip_end) (an in-place op's output).
void rs_check_input_kept(const void* in, RsElem t, size_t count, size_t skip_begin, size_t skip_end,
                         uint64_t seed, int src, RsOpCheck* device_check, cudaStream_t stream);

// Checks that `len` bytes at p still hold `value`; offsets reported from `offset_base`.
void rs_check_poison(const void* p, size_t len, uint8_t value, unsigned long long offset_base,
                     RsOpCheck* device_check, cudaStream_t stream);

}  // namespace zgpu
