// The reduce-scatter's reduction kernels (src/route/chunk_sum.h) on one GPU,
// loaded from the library's embedded fatbin as the route loads them, against a host reference
// that rounds every step exactly once (to nearest, ties to even) from its exact value, in NCCL's
// order (chunk_sum.cu): a sum of 2-8 chunks, and a pre-multiplied one (an average's scale and
// another), fp32/fp16/bf16, odd counts, chunks on and off 16-byte boundaries, 1-16 CTAs. Bitwise.
// Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "chunk_sum_gpu.h"
#include "chunk_sum_reference.h"

namespace zc {
namespace {

using namespace chunk_sum_reference;

class ChunkSum : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* why = "";
    const ChunkSumGpuState state = gpu_.open(&why);
    if (state == ChunkSumGpuState::kNoGpu) GTEST_SKIP() << "no GPU";
    ASSERT_TRUE(state == ChunkSumGpuState::kReady) << why;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    for (void* p : owned_) cudaFree(p);
    if (stream_) cudaStreamDestroy(stream_);
    if (gpu_.cu) gpu_.kernels.unload(*gpu_.cu);
  }
  // `bytes` of device memory, `offset` bytes into a fresh allocation (off 16-byte boundaries
  // where offset is not a multiple of 16), filled with `host` if given.
  uint8_t* device(size_t bytes, size_t offset, const std::vector<uint8_t>* host) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes + offset + 16), cudaSuccess);
    owned_.push_back(p);
    uint8_t* at = static_cast<uint8_t*>(p) + offset;
    if (host)
      EXPECT_EQ(cudaMemcpy(at, host->data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    else
      EXPECT_EQ(cudaMemset(p, 0xA5, bytes + offset + 16), cudaSuccess);  // poisoned
    return at;
  }

  // One case: nsrc random chunks of `count` elements summed into a poisoned output; bitwise
  // against the reference, and the bytes around the output untouched.
  // own_scales: each source's scale of its own, read from device memory (a pre-multiplied
  // sum of each rank's scalar), source 0's as scale_bits.
  void check(const TypeCase& t, size_t count, int nsrc, bool premul, size_t offset, unsigned ctas,
             std::mt19937* rng, bool own_scales = false) {
    const std::string label = std::string(t.name) + " count " + std::to_string(count) + " nsrc " +
                              std::to_string(nsrc) + (premul ? " premul" : " sum") +
                              (own_scales ? " own scales" : "") + " offset " +
                              std::to_string(offset) + " ctas " + std::to_string(ctas);
    std::vector<std::vector<uint8_t>> src;
    ChunkSumArgs a;
    for (int k = 0; k < nsrc; ++k) {
      src.push_back(random_chunk(t, count, rng));
      a.src[k] = device(count * t.bytes, k % 2 ? offset : 0, &src.back());
    }
    // A scale as an average's or a pre-multiplied sum's: 1/nsrc, or an arbitrary one.
    const double scale = premul ? (nsrc % 2 ? 1.0 / nsrc : 0.7071067811865476) : 1.0;
    auto bits_of = [&](double v) -> uint32_t {
      if (t.type != ChunkType::kF32) return round_to_16(v, t.mant, t.bias);
      const float f = static_cast<float>(v);
      uint32_t b;
      memcpy(&b, &f, 4);
      return b;
    };
    const uint32_t scale_bits = bits_of(scale);
    std::vector<uint32_t> scales(static_cast<size_t>(nsrc), scale_bits);
    if (own_scales)
      for (int k = 1; k < nsrc; ++k) {  // source k's in device memory, one element
        scales[k] = bits_of(scale * (1.0 + 0.37 * k));
        std::vector<uint8_t> word(t.bytes);
        memcpy(word.data(), &scales[k], t.bytes);
        a.scale_at[k] = device(t.bytes, 0, &word);
      }
    const size_t bytes = count * t.bytes;
    uint8_t* out = device(bytes + 32, offset, nullptr);
    a.dst = out + 16;
    a.count = count;
    a.nsrc = nsrc;
    a.premul = premul;
    a.scale_bits = scale_bits;
    ASSERT_EQ(gpu_.kernels.launch(*gpu_.cu, t.type, a, ctas, stream_), CUDA_SUCCESS) << label;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << label;
    std::vector<uint8_t> got(bytes + 32), want;
    ASSERT_EQ(cudaMemcpy(got.data(), out, bytes + 32, cudaMemcpyDeviceToHost), cudaSuccess);
    reference(t, src, count, premul, scales, &want);
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

  ChunkSumGpu gpu_;
  cudaStream_t stream_ = nullptr;
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

// A pre-multiplied sum whose sources bring scales of their own (ncclRedOpCreatePreMulSum's
// scalar differs by rank), read by the kernel from device memory.
TEST_F(ChunkSum, SourcesWithScalesOfTheirOwnAreExactlyRounded) {
  std::mt19937 rng(29);
  for (const TypeCase& t : kTypes)
    for (size_t count : {size_t{7}, size_t{(1u << 16) + 5}})
      for (int nsrc : {2, 3, 8}) check(t, count, nsrc, true, 0, 8, &rng, true);
}

TEST_F(ChunkSum, LaunchRefusesWhatTheKernelCannotTake) {
  ChunkSumArgs a;
  a.nsrc = 0;
  EXPECT_NE(gpu_.kernels.launch(*gpu_.cu, ChunkType::kF32, a, 1, stream_), CUDA_SUCCESS);
  a.nsrc = 1;
  a.premul = 1;  // a pre-multiplied sum of one source has no partial sum to fuse into
  EXPECT_NE(gpu_.kernels.launch(*gpu_.cu, ChunkType::kF32, a, 1, stream_), CUDA_SUCCESS);
  a.premul = 0;
  a.nsrc = kChunkSumMaxSources + 1;
  EXPECT_NE(gpu_.kernels.launch(*gpu_.cu, ChunkType::kF32, a, 1, stream_), CUDA_SUCCESS);
  a.nsrc = 2;
  EXPECT_NE(gpu_.kernels.launch(*gpu_.cu, ChunkType::kF32, a, 0, stream_), CUDA_SUCCESS);
}

}  // namespace
}  // namespace zc
