// The reduce-scatter's summing kernels (src/route/chunk_sum.h) on GPU 0, as the one-GPU programs
// that time or check them set them up (chunk_sum_test.cc, probes/chunk_sum_probe.cc,
// probes/sum_beside_gemm_probe.cc): the driver's entry points, GPU 0's primary context current,
// and the kernels loaded into it from the library's embedded fatbin, as the route loads them.
#pragma once

#include "chunk_sum.h"
#include "cuda_driver.h"

namespace zc {

enum class ChunkSumGpuState { kReady, kNoGpu, kFailed };

struct ChunkSumGpu {
  const CudaDriver* cu = nullptr;  // set by open() whatever it returns
  ChunkSumKernels kernels;
  // kNoGpu: no GPU, or a driver without the module functions (the callers skip, no failure);
  // kFailed: *why says which step failed.
  ChunkSumGpuState open(const char** why);
};

// A probe's start: opens `gpu`; else prints why not ("no GPU", or what failed), sets *exit_code
// and returns false. No GPU exits 0: a probe started on a machine without one has nothing to
// measure, which is no failure.
bool open_for_probe(ChunkSumGpu* gpu, int* exit_code);

}  // namespace zc
