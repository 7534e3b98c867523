// ncclAvg's scale as the reduce-scatter's kernel gets it (chunk_avg_scale_bits, chunk_sum.h):
// 1/n in double, rounded to float, then to half or bfloat16, to nearest even each time — NCCL's
// own conversion (__float2half / __float2bfloat16 of float(1.0 / nRanks)). The expected bit
// patterns are worked out by hand from the float's bits.
#include <gtest/gtest.h>

#include <cstring>

#include "chunk_sum.h"

namespace {

using zc::ChunkType;
using zc::chunk_avg_scale_bits;

unsigned float_bits(float f) {
  unsigned b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(ChunkAvgScale, Float32IsTheFloatOfOneOverN) {
  for (int n = 1; n <= 8; ++n)
    EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kF32, n), float_bits(static_cast<float>(1.0 / n))) << n;
}

TEST(ChunkAvgScale, HalfRoundsTheFloatToNearestEven) {
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kF16, 1), 0x3C00u);
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kF16, 2), 0x3800u);
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kF16, 3), 0x3555u);  // 0x3EAAAAAB: rest 0xAAB, down
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kF16, 5), 0x3266u);  // 0x3E4CCCCD: rest 0xCCD, down
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kF16, 6), 0x3155u);  // 0x3E2AAAAB
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kF16, 7), 0x3092u);  // 0x3E124925: rest 0x925, down
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kF16, 8), 0x3000u);
}

TEST(ChunkAvgScale, Bfloat16RoundsTheFloatToNearestEven) {
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kBF16, 1), 0x3F80u);
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kBF16, 2), 0x3F00u);
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kBF16, 3), 0x3EABu);  // 0x3EAAAAAB: low 0xAAAB, up
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kBF16, 5), 0x3E4Du);  // 0x3E4CCCCD: up
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kBF16, 6), 0x3E2Bu);  // 0x3E2AAAAB: up
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kBF16, 7), 0x3E12u);  // 0x3E124925: low 0x4925, down
  EXPECT_EQ(chunk_avg_scale_bits(ChunkType::kBF16, 8), 0x3E00u);
}

}  // namespace
