// The reduce-scatter's reduction on one GPU: dst = the sum of chunks already in its memory
// (chunk_sum.cu says how each type is combined). The kernels are built by nvcc with the library
// and carried in it as a fatbin (cmake/EmbedBinary.cmake); they are loaded into a context with
// cuModuleLoadData, so the library still links no CUDA library. A build without nvcc carries
// none (chunk_sum_built() is false) and the route then leaves every reduce-scatter to NCCL.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda_driver.h"

namespace zc {

enum class ChunkType { kF32, kF16, kBF16 };
constexpr int kChunkTypes = 3;
constexpr int kChunkSumMaxSources = 8;
// Threads per CTA; the CTAs are the caller's choice (few: the kernel runs beside compute).
constexpr unsigned kChunkSumThreads = 512;

// The kernels' one argument, passed by value (chunk_sum.cu's Args, field for field).
struct ChunkSumArgs {
  const void* src[kChunkSumMaxSources] = {};
  void* dst = nullptr;
  unsigned long long count = 0;  // elements
  int nsrc = 0;
  // Nonzero: a pre-multiplied sum (chunk_sum.cu: NCCL's fused form), src[0] this rank's own
  // chunk; needs two sources at least.
  int premul = 0;
  unsigned scale_bits = 0;  // the scale in the element type (fp16/bf16: the low 16 bits)
  unsigned pad = 0;
  // A pre-multiplied sum whose sources have scales of their own (each rank's scalar,
  // ncclRedOpCreatePreMulSum): source k's, one element in device memory read at the launch's
  // start, where scale_at[k] is set; scale_bits where it is null.
  const void* scale_at[kChunkSumMaxSources] = {};
};
static_assert(sizeof(ChunkSumArgs) == 2 * 8 * kChunkSumMaxSources + 8 + 8 + 4 * 4,
              "ChunkSumArgs is the kernels' Args, without padding");

// ncclAvg's scale for `nranks` ranks in the element type's bits, as NCCL makes it: 1/n in
// double, rounded to float, then to half or bfloat16 (rounding to nearest even each time).
unsigned chunk_avg_scale_bits(ChunkType type, int nranks);

// Whether this build carries the kernels.
bool chunk_sum_built();

// The kernels loaded into one context.
class ChunkSumKernels {
 public:
  // Loads them into the calling thread's current context; false with *why.
  bool load(const CudaDriver& cu, const char** why);
  // Unloads them (from the context current when loaded, which must be current again).
  void unload(const CudaDriver& cu);
  bool loaded() const { return module_ != nullptr; }
  // Sums `args.nsrc` chunks of `type` into args.dst on `stream`, with `ctas` CTAs;
  // CUDA_ERROR_INVALID_VALUE for arguments the kernel cannot take.
  CUresult launch(const CudaDriver& cu, ChunkType type, const ChunkSumArgs& args, unsigned ctas,
                  CUstream stream) const;

 private:
  CUmodule module_ = nullptr;
  CUfunction fn_[kChunkTypes] = {};
};

// The kernels loaded into `device`'s primary context (current when called), once per device for
// the process's life, shared by its communicators: a launch still queued on a torn-down
// route's stream must find its module, and the module is small. Null with *why.
const ChunkSumKernels* chunk_sum_on_device(const CudaDriver& cu, int device, const char** why);

}  // namespace zc
