#include "chunk_sum.h"

#include <cstddef>

namespace zc {

// cmake/EmbedBinary.cmake's array (empty without nvcc).
extern const unsigned char kChunkSumFatbin[];
extern const size_t kChunkSumFatbin_size;

namespace {
// chunk_sum.cu's entry points, in ChunkType's order.
constexpr const char* kEntryPoints[kChunkTypes] = {"zc_chunk_sum_f32", "zc_chunk_sum_f16",
                                                   "zc_chunk_sum_bf16"};
}  // namespace

bool chunk_sum_built() { return kChunkSumFatbin_size > 0; }

bool ChunkSumKernels::load(const CudaDriver& cu, const char** why) {
  if (module_) return true;
  if (!chunk_sum_built()) {
    *why = "this build of the library carries no reduction kernel (it was built without nvcc)";
    return false;
  }
  if (!cu.kernel_ok) {
    *why = "the CUDA driver lacks the module functions";
    return false;
  }
  CUmodule m = nullptr;
  if (cu.cuModuleLoadData(&m, kChunkSumFatbin) != CUDA_SUCCESS) {
    *why = "the driver could not load the reduction kernels (no code for this GPU?)";
    return false;
  }
  for (int t = 0; t < kChunkTypes; ++t)
    if (cu.cuModuleGetFunction(&fn_[t], m, kEntryPoints[t]) != CUDA_SUCCESS) {
      cu.cuModuleUnload(m);
      *why = "the reduction kernels' module lacks an entry point";
      return false;
    }
  module_ = m;
  return true;
}

void ChunkSumKernels::unload(const CudaDriver& cu) {
  if (module_) cu.cuModuleUnload(module_);
  module_ = nullptr;
}

CUresult ChunkSumKernels::launch(const CudaDriver& cu, ChunkType type, const ChunkSumArgs& args,
                                 unsigned ctas, CUstream stream) const {
  if (!module_ || args.nsrc < 1 + (args.premul != 0) || args.nsrc > kChunkSumMaxSources ||
      ctas == 0)
    return CUDA_ERROR_INVALID_VALUE;
  ChunkSumArgs copy = args;  // cuLaunchKernel copies the argument's bytes at the call
  void* params[] = {&copy};
  return cu.cuLaunchKernel(fn_[static_cast<int>(type)], ctas, 1, 1, kChunkSumThreads, 1, 1, 0,
                           stream, params, nullptr);
}

}  // namespace zc
