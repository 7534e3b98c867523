// The reduce-scatter's reduction kernels (src/collectives/reduce_scatter/chunk_sum.h) on one GPU,
// loaded from the library's embedded fatbin as the route loads them, against a host reference
// that rounds every step exactly once (to nearest, ties to even) from its exact value, in NCCL's
// order (chunk_sum.cu): a sum of 2-8 chunks, and a pre-multiplied one (an average's scale and
// another), fp32/fp16/bf16, odd counts, chunks on and off 16-byte boundaries, 1-16 CTAs. Bitwise.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "chunk_sum.h"
#include "cuda_driver.h"

namespace zc {
namespace {

// A double rounded to a binary format with `mant` stored mantissa bits and exponent bias
// `bias` (fp16: 10, 15; bf16: 7, 127), to nearest with ties to even; its bits.
uint16_t round_to_16(double x, int mant, int bias) {
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
  const uint16_t frac =
      static_cast<uint16_t>(static_cast<uint32_t>(std::ldexp(r, -(re - 1) + mant)) & ((1 << mant) - 1));
  return static_cast<uint16_t>(sign | biased << mant | frac);
}

double from_16(uint16_t b, int mant, int bias) {
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
const TypeCase kTypes[] = {{ChunkType::kF32, "fp32", 4, 0, 0},
                           {ChunkType::kF16, "fp16", 2, 10, 15},
                           {ChunkType::kBF16, "bf16", 2, 7, 127}};

// The reference, NCCL's (chunk_sum.cu): a sum adds the sources in order, each sum rounded once;
// a pre-multiplied sum adds the rounded products of sources 1.. in order and src[0] last with
// one fused multiply-add. fp32 on the host: IEEE single operations and fmaf round exactly once;
// fp16/bf16: products and sums are exact in a double for these values, then rounded once.
void reference(const TypeCase& t, const std::vector<std::vector<uint8_t>>& src, size_t count,
               bool premul, uint32_t scale_bits, std::vector<uint8_t>* out) {
  out->assign(count * t.bytes, 0);
  const size_t n = src.size();
  for (size_t i = 0; i < count; ++i) {
    if (t.type == ChunkType::kF32) {
      float scale, x[kChunkSumMaxSources] = {};
      memcpy(&scale, &scale_bits, 4);
      for (size_t k = 0; k < n; ++k) memcpy(&x[k], src[k].data() + 4 * i, 4);
      volatile float acc;  // volatile: each step rounded as written, nothing contracted
      if (!premul) {
        acc = x[0];
        for (size_t k = 1; k < n; ++k) acc = acc + x[k];
      } else {
        acc = x[1] * scale;
        for (size_t k = 2; k < n; ++k) {
          volatile float term = x[k] * scale;
          acc = acc + term;
        }
        acc = std::fmaf(x[0], scale, acc);
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
    const double scale = from_16(static_cast<uint16_t>(scale_bits), t.mant, t.bias);
    double acc;
    if (!premul) {
      acc = value(0);
      for (size_t k = 1; k < n; ++k) acc = round(acc + value(k));
    } else {
      acc = round(value(1) * scale);
      for (size_t k = 2; k < n; ++k) acc = round(acc + round(value(k) * scale));
      acc = round(value(0) * scale + acc);
    }
    const uint16_t b = round_to_16(acc, t.mant, t.bias);
    memcpy(out->data() + 2 * i, &b, 2);
  }
}

// Random values of a few magnitudes (sums that cancel, carry and round), in the type's bits.
std::vector<uint8_t> random_chunk(const TypeCase& t, size_t count, std::mt19937* rng) {
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

class ChunkSum : public ::testing::Test {
 protected:
  void SetUp() override {
    cu_ = cuda_driver();
    int n = 0;
    if (!cu_ || !cu_->kernel_ok || cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
      GTEST_SKIP() << "no GPU";
    ASSERT_TRUE(chunk_sum_built()) << "this build carries no kernel";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // the primary context, current
    const char* why = "";
    ASSERT_TRUE(kernels_.load(*cu_, &why)) << why;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    for (void* p : owned_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
    if (cu_) kernels_.unload(*cu_);
  }
  // `bytes` of device memory, `offset` bytes into a fresh allocation (off 16-byte boundaries
  // where offset is not a multiple of 16), filled with `host` if given.
  uint8_t* device(size_t bytes, size_t offset, const std::vector<uint8_t>* host) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes + offset + 16), cudaSuccess);
    owned_.push_back(p);
    uint8_t* at = static_cast<uint8_t*>(p) + offset;
    if (host) EXPECT_EQ(cudaMemcpy(at, host->data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    else EXPECT_EQ(cudaMemset(p, 0xA5, bytes + offset + 16), cudaSuccess);  // poisoned
    return at;
  }

  // One case: nsrc random chunks of `count` elements summed into a poisoned output; bitwise
  // against the reference, and the bytes around the output untouched.
  void check(const TypeCase& t, size_t count, int nsrc, bool premul, size_t offset,
             unsigned ctas, std::mt19937* rng) {
    const std::string label = std::string(t.name) + " count " + std::to_string(count) + " nsrc " +
                              std::to_string(nsrc) + (premul ? " premul" : " sum") + " offset " +
                              std::to_string(offset) + " ctas " + std::to_string(ctas);
    std::vector<std::vector<uint8_t>> src;
    ChunkSumArgs a;
    for (int k = 0; k < nsrc; ++k) {
      src.push_back(random_chunk(t, count, rng));
      a.src[k] = device(count * t.bytes, k % 2 ? offset : 0, &src.back());
    }
    // A scale as an average's or a pre-multiplied sum's: 1/nsrc, or an arbitrary one.
    const double scale = premul ? (nsrc % 2 ? 1.0 / nsrc : 0.7071067811865476) : 1.0;
    uint32_t scale_bits;
    if (t.type == ChunkType::kF32) {
      const float f = static_cast<float>(scale);
      memcpy(&scale_bits, &f, 4);
    } else {
      scale_bits = round_to_16(scale, t.mant, t.bias);
    }
    const size_t bytes = count * t.bytes;
    uint8_t* out = device(bytes + 32, offset, nullptr);
    a.dst = out + 16;
    a.count = count;
    a.nsrc = nsrc;
    a.premul = premul;
    a.scale_bits = scale_bits;
    ASSERT_EQ(kernels_.launch(*cu_, t.type, a, ctas, stream_), CUDA_SUCCESS) << label;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << label;
    std::vector<uint8_t> got(bytes + 32), want;
    ASSERT_EQ(cudaMemcpy(got.data(), out, bytes + 32, cudaMemcpyDeviceToHost), cudaSuccess);
    reference(t, src, count, premul, scale_bits, &want);
    size_t wrong = 0, first = SIZE_MAX;
    for (size_t i = 0; i < bytes; ++i)
      if (got[16 + i] != want[i]) {
        ++wrong;
        first = std::min(first, i / t.bytes);
      }
    EXPECT_EQ(wrong, 0u) << label << ": first wrong element " << first;
    for (size_t i = 0; i < 16; ++i) {
      EXPECT_EQ(got[i], 0xA5) << label << ": wrote before the output";
      EXPECT_EQ(got[16 + bytes + i], 0xA5) << label << ": wrote past the output";
    }
  }

  const CudaDriver* cu_ = nullptr;
  cudaStream_t stream_ = nullptr;
  ChunkSumKernels kernels_;
  std::vector<void*> owned_;
};

TEST_F(ChunkSum, EveryTypeCountSourceCountAndCtaCountIsExactlyRounded) {
  std::mt19937 rng(20261129);
  for (const TypeCase& t : kTypes)
    for (size_t count : {size_t{1}, size_t{7}, size_t{4096 + 3}, size_t{(1u << 20) + 5}})
      for (int nsrc : {2, 3, 8})
        for (bool premul : {false, true})
          for (unsigned ctas : {1u, 4u, 16u}) check(t, count, nsrc, premul, 0, ctas, &rng);
}

TEST_F(ChunkSum, ChunksOffSixteenByteBoundariesGiveTheSameBits) {
  std::mt19937 rng(7);
  for (const TypeCase& t : kTypes)
    for (size_t offset : {t.bytes, size_t{8}, size_t{12}})
      for (bool premul : {false, true}) check(t, (1u << 16) + 9, 2, premul, offset, 8, &rng);
}

TEST_F(ChunkSum, LaunchRefusesWhatTheKernelCannotTake) {
  ChunkSumArgs a;
  a.nsrc = 0;
  EXPECT_NE(kernels_.launch(*cu_, ChunkType::kF32, a, 1, stream_), CUDA_SUCCESS);
  a.nsrc = 1;
  a.premul = 1;  // a pre-multiplied sum of one source has no partial sum to fuse into
  EXPECT_NE(kernels_.launch(*cu_, ChunkType::kF32, a, 1, stream_), CUDA_SUCCESS);
  a.premul = 0;
  a.nsrc = kChunkSumMaxSources + 1;
  EXPECT_NE(kernels_.launch(*cu_, ChunkType::kF32, a, 1, stream_), CUDA_SUCCESS);
  a.nsrc = 2;
  EXPECT_NE(kernels_.launch(*cu_, ChunkType::kF32, a, 0, stream_), CUDA_SUCCESS);
}

}  // namespace
}  // namespace zc
