#include "chunk_sum.h"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

namespace zc {

// cmake/EmbedBinary.cmake's array (empty without nvcc).
extern const unsigned char kChunkSumFatbin[];
extern const size_t kChunkSumFatbin_size;

namespace {
// chunk_sum.cu's entry points, in ChunkType's order.
constexpr const char* kEntryPoints[kChunkTypes] = {"zc_chunk_sum_f32", "zc_chunk_sum_f16",
                                                   "zc_chunk_sum_bf16"};
}  // namespace

namespace {
// Round to nearest even, from float.
unsigned float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return 0x7FC0 | ((x >> 16) & 0x8000);  // a quiet NaN
  return (x + 0x7FFF + ((x >> 16) & 1)) >> 16;
}

unsigned float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000, abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) return sign | 0x7E00;   // NaN
  if (abs >= 0x477FF000) return sign | 0x7C00;  // from 65520 up: infinity
  if (abs < 0x38800000) {                       // below 2^-14: a subnormal half, in 2^-24 units
    float a;
    memcpy(&a, &abs, 4);
    return sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));
  }
  const uint32_t m = abs & 0x7FFFFF;
  uint32_t h = (((abs >> 23) - 127 + 15) << 10) | (m >> 13);
  const uint32_t rest = m & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right
  return sign | h;
}
}  // namespace

unsigned chunk_avg_scale_bits(ChunkType type, int nranks) {
  const float f = static_cast<float>(1.0 / nranks);
  if (type == ChunkType::kF16) return float_to_half(f);
  if (type == ChunkType::kBF16) return float_to_bf16(f);
  unsigned bits;
  memcpy(&bits, &f, 4);
  return bits;
}

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

const ChunkSumKernels* chunk_sum_on_device(const CudaDriver& cu, int device, const char** why) {
  static std::mutex mu;
  static auto* loaded = new std::map<int, std::unique_ptr<ChunkSumKernels>>;  // never freed
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<ChunkSumKernels>& k = (*loaded)[device];
  if (!k) k.reset(new ChunkSumKernels);
  return k->load(cu, why) ? k.get() : nullptr;
}

}  // namespace zc
