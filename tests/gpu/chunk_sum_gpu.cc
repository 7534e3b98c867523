#include "chunk_sum_gpu.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace zc {

ChunkSumGpuState ChunkSumGpu::open(const char** why) {
  cu = cuda_driver();
  int n = 0;
  if (!cu || !cu->kernel_ok || cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    return ChunkSumGpuState::kNoGpu;
  if (cudaSetDevice(0) != cudaSuccess) {
    *why = "cudaSetDevice(0) failed";
    return ChunkSumGpuState::kFailed;
  }
  // The kernels load into the calling thread's current context: make it GPU 0's primary one,
  // the context the runtime's buffers and streams of these programs live in.
  if (cudaFree(nullptr) != cudaSuccess) {
    *why = "GPU 0's primary context could not be made current";
    return ChunkSumGpuState::kFailed;
  }
  return kernels.load(*cu, why) ? ChunkSumGpuState::kReady : ChunkSumGpuState::kFailed;
}

bool open_for_probe(ChunkSumGpu* gpu, int* exit_code) {
  const char* why = "";
  switch (gpu->open(&why)) {
    case ChunkSumGpuState::kReady:
      return true;
    case ChunkSumGpuState::kNoGpu:
      printf("no GPU\n");
      *exit_code = 0;
      return false;
    case ChunkSumGpuState::kFailed:
      break;
  }
  printf("set-up failed: %s\n", why);
  *exit_code = 1;
  return false;
}

}  // namespace zc
