// The reduce-scatter's reduction kernels (src/route/chunk_sum.cu) as the fake driver runs them:
// on the host, element by element, bit for bit what the GPU computes (fake_chunk_sum.cc says
// how). fake_cuda_kernel.cc launches them; this header is also the layout tests build the
// kernels' argument with.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fake_log.h"

constexpr int kFakeChunkSumMaxSources = 8;

// chunk_sum.cu's Args, field for field: the bytes a launch passes in kernelParams[0].
struct FakeChunkSumArgs {
  const void* src[kFakeChunkSumMaxSources];
  void* dst;
  unsigned long long count;  // elements
  int nsrc;
  int premul;           // nonzero: a pre-multiplied sum, src[0] this rank's own chunk
  unsigned scale_bits;  // the scale in the element type's bits (fp16/bf16: the low 16)
  unsigned pad;
  // Source k's own scale (one element in memory, read at the launch) where set; scale_bits
  // where null.
  const void* scale_at[kFakeChunkSumMaxSources];
};
static_assert(sizeof(FakeChunkSumArgs) == 2 * 8 * kFakeChunkSumMaxSources + 8 + 8 + 4 * 4,
              "chunk_sum.cu's Args has no padding");

// The element type of each entry point (zc_chunk_sum_f32, _f16, _bf16).
enum class FakeChunkType { kF32, kF16, kBF16 };

FAKE_HIDDEN size_t fake_chunk_type_bytes(FakeChunkType type);

// args.dst = the sum chunk_sum.cu computes, element by element (a destination that is one of
// the sources is summed in place, as on the GPU). The caller has checked the arguments.
FAKE_HIDDEN void fake_chunk_sum(FakeChunkType type, const FakeChunkSumArgs& args);
