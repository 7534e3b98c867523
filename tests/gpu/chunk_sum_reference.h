// The reduction's exact host reference, shared by the GPU tests of the reduce-scatter's kernel
// and plans: 16-bit floats rounded to nearest (ties to even) from exact values, and NCCL's order
// of a sum and a pre-multiplied sum (src/route/chunk_sum.cu), each step rounded once.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "chunk_sum.h"

namespace zc {
namespace chunk_sum_reference {

// A double rounded to a binary format with `mant` stored mantissa bits and exponent bias
// `bias` (fp16: 10, 15; bf16: 7, 127), to nearest with ties to even; its bits.
inline uint16_t round_to_16(double x, int mant, int bias) {
  const int exp_bits = 15 - mant;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const uint16_t inf = static_cast<uint16_t>(((1 << exp_bits) - 1) << mant);
  if (std::isnan(x)) return static_cast<uint16_t>(inf | (1 << (mant - 1)));
  x = std::fabs(x);
  if (x == 0) return sign;
  int e;
  std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  int unbiased = e - 1;
  if (unbiased < 1 - bias) unbiased = 1 - bias;  // subnormal: the smallest exponent's step
  const double step = std::ldexp(1.0, unbiased - mant);
  const double q = std::nearbyint(x / step);  // the default rounding mode: to nearest, even
  const double r = q * step;
  int re;
  std::frexp(r, &re);
  if (re - 1 > bias) return static_cast<uint16_t>(sign | inf);
  if (re - 1 < 1 - bias) return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  const uint16_t biased = static_cast<uint16_t>(re - 1 + bias);
  const uint16_t frac = static_cast<uint16_t>(
      static_cast<uint32_t>(std::ldexp(r, -(re - 1) + mant)) & ((1 << mant) - 1));
  return static_cast<uint16_t>(sign | biased << mant | frac);
}

inline double from_16(uint16_t b, int mant, int bias) {
  const int exp_bits = 15 - mant;
  const int e = b >> mant & ((1 << exp_bits) - 1);
  const int f = b & ((1 << mant) - 1);
  const double s = b & 0x8000 ? -1 : 1;
  if (e == (1 << exp_bits) - 1) return f ? NAN : s * INFINITY;
  if (e == 0) return s * std::ldexp(f, 1 - bias - mant);
  return s * std::ldexp(f + (1 << mant), e - bias - mant);
}

struct TypeCase {
  ChunkType type;
  const char* name;
  size_t bytes;
  int mant, bias;  // fp16/bf16
};
inline const TypeCase kTypes[] = {{ChunkType::kF32, "fp32", 4, 0, 0},
                                  {ChunkType::kF16, "fp16", 2, 10, 15},
                                  {ChunkType::kBF16, "bf16", 2, 7, 127}};

// The reference, NCCL's (chunk_sum.cu): a sum adds the sources in order, each sum rounded once;
// a pre-multiplied sum adds the rounded products of sources 1.. in order and src[0] last with
// one fused multiply-add. fp32 on the host: IEEE single operations and fmaf round exactly once;
// fp16/bf16: products and sums are exact in a double for these values, then rounded once.
// scales[k]: source k's scale (each rank's own scalar), in the element type's bits.
inline void reference(const TypeCase& t, const std::vector<std::vector<uint8_t>>& src, size_t count,
                      bool premul, const std::vector<uint32_t>& scales, std::vector<uint8_t>* out) {
  out->assign(count * t.bytes, 0);
  const size_t n = src.size();
  for (size_t i = 0; i < count; ++i) {
    if (t.type == ChunkType::kF32) {
      float scale[kChunkSumMaxSources] = {}, x[kChunkSumMaxSources] = {};
      for (size_t k = 0; k < n; ++k) memcpy(&scale[k], &scales[k], 4);
      for (size_t k = 0; k < n; ++k) memcpy(&x[k], src[k].data() + 4 * i, 4);
      volatile float acc;  // volatile: each step rounded as written, nothing contracted
      if (!premul) {
        acc = x[0];
        for (size_t k = 1; k < n; ++k) acc = acc + x[k];
      } else {
        acc = x[1] * scale[1];
        for (size_t k = 2; k < n; ++k) {
          volatile float term = x[k] * scale[k];
          acc = acc + term;
        }
        acc = std::fmaf(x[0], scale[0], acc);
      }
      const float r = acc;
      memcpy(out->data() + 4 * i, &r, 4);
      continue;
    }
    auto value = [&](size_t k) {
      uint16_t b;
      memcpy(&b, src[k].data() + 2 * i, 2);
      return from_16(b, t.mant, t.bias);
    };
    auto round = [&](double v) { return from_16(round_to_16(v, t.mant, t.bias), t.mant, t.bias); };
    auto scale = [&](size_t k) {
      return from_16(static_cast<uint16_t>(scales[k]), t.mant, t.bias);
    };
    double acc;
    if (!premul) {
      acc = value(0);
      for (size_t k = 1; k < n; ++k) acc = round(acc + value(k));
    } else {
      acc = round(value(1) * scale(1));
      for (size_t k = 2; k < n; ++k) acc = round(acc + round(value(k) * scale(k)));
      acc = round(value(0) * scale(0) + acc);
    }
    const uint16_t b = round_to_16(acc, t.mant, t.bias);
    memcpy(out->data() + 2 * i, &b, 2);
  }
}

// The same with one scale for every source (an average's, or the kernel's scale_bits).
inline void reference(const TypeCase& t, const std::vector<std::vector<uint8_t>>& src, size_t count,
                      bool premul, uint32_t scale_bits, std::vector<uint8_t>* out) {
  reference(t, src, count, premul, std::vector<uint32_t>(src.size(), scale_bits), out);
}

// Random values of a few magnitudes (sums that cancel, carry and round), in the type's bits.
inline std::vector<uint8_t> random_chunk(const TypeCase& t, size_t count, std::mt19937* rng) {
  std::uniform_real_distribution<float> mag(-8.f, 8.f);
  std::uniform_int_distribution<int> scale_exp(-6, 6);
  std::vector<uint8_t> v(count * t.bytes);
  for (size_t i = 0; i < count; ++i) {
    const double x = std::ldexp(mag(*rng), scale_exp(*rng));
    if (t.type == ChunkType::kF32) {
      const float f = static_cast<float>(x);
      memcpy(v.data() + 4 * i, &f, 4);
    } else {
      const uint16_t b = round_to_16(x, t.mant, t.bias);
      memcpy(v.data() + 2 * i, &b, 2);
    }
  }
  return v;
}

}  // namespace chunk_sum_reference
}  // namespace zc
