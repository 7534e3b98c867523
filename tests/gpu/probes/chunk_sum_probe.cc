// How fast is the reduce-scatter's reduction kernel (chunk_sum.h) with few CTAs? One GPU, the
// library's embedded kernels: 2 and 8 sources of 64 MiB each summed into a third buffer (HBM
// reads and writes only), fp32 and bf16, a sum and a pre-multiplied one (an average's, what
// FSDP2's reduce-scatters are), 1-132 CTAs; 20 launches timed with events after 3
// warm-ups, median of 5 such runs. Prints one RESULT line per case: time and the bytes the
// kernel moves (reads + write) per second.
//
//   build/tests/gpu/zerocta_gpu_probe_chunk_sum
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "chunk_sum_gpu.h"

int main() {
  using namespace zc;
  ChunkSumGpu gpu;
  if (int exit_code = 0; !open_for_probe(&gpu, &exit_code)) return exit_code;
  const CudaDriver* cu = gpu.cu;
  const ChunkSumKernels& k = gpu.kernels;
  constexpr size_t kBytes = size_t{64} << 20;
  std::vector<void*> bufs(9);
  for (void*& b : bufs) {
    cudaMalloc(&b, kBytes);
    cudaMemset(b, 0, kBytes);
  }
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  struct TypeCase {
    ChunkType type;
    const char* name;
    size_t bytes;
  };
  for (TypeCase t : {TypeCase{ChunkType::kF32, "fp32", 4}, TypeCase{ChunkType::kBF16, "bf16", 2}})
    for (int nsrc : {2, 8})
      for (bool premul : {false, true})
        for (unsigned ctas : {1u, 2u, 4u, 8u, 16u, 32u, 132u}) {
          ChunkSumArgs a;
          a.premul = premul;
          a.scale_bits = chunk_avg_scale_bits(t.type, nsrc);
          for (int i = 0; i < nsrc; ++i) a.src[i] = bufs[static_cast<size_t>(i)];
          a.dst = bufs[8];
          a.count = kBytes / t.bytes;
          a.nsrc = nsrc;
          std::vector<float> runs;
          for (int run = 0; run < 5; ++run) {
            for (int w = 0; w < 3; ++w) k.launch(*cu, t.type, a, ctas, s);
            cudaEventRecord(t0, s);
            for (int i = 0; i < 20; ++i) k.launch(*cu, t.type, a, ctas, s);
            cudaEventRecord(t1, s);
            cudaEventSynchronize(t1);
            float ms = 0;
            cudaEventElapsedTime(&ms, t0, t1);
            runs.push_back(ms / 20);
          }
          std::sort(runs.begin(), runs.end());
          const double ms = runs[2];
          printf("RESULT chunk_sum %s %s nsrc %d ctas %3u: %.3f ms (%.3f..%.3f), %.0f GB/s moved\n",
                 t.name, premul ? "avg" : "sum", nsrc, ctas, ms, runs[0], runs[4],
                 (nsrc + 1) * kBytes / ms / 1e6);
        }
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
