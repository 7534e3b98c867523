// What does the reduce-scatter's summing kernel (chunk_sum.h) take from compute beside it, by
// its CTAs? One GPU: a fixed batch of bf16 GEMMs (cuBLAS, 8192^3, random inputs) timed alone,
// then with the kernel summing 2 fp32 sources of 64 MiB over and over on a second stream for as
// long as the GEMMs run, with 2 to 64 CTAs. Prints, per CTA count, the GEMMs' time
// against alone (median of 11 interleaved runs, with its spread) and how fast the kernel summed
// meanwhile (HBM traffic) — what the route's default CTAs (ZEROCTA_RS_CTAS) is chosen from,
// together with the 2-GPU fixed-work run of zerocta-bench --contention --op reducescatter.
//
//   build/tests/gpu/zerocta_gpu_probe_sum_beside_gemm
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <vector>

#include "chunk_sum_gpu.h"

namespace {

constexpr int kDim = 8192;
constexpr int kGemms = 20;
constexpr size_t kSumBytes = size_t{64} << 20;
constexpr int kRuns = 11;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  using namespace zc;
  ChunkSumGpu gpu;
  if (int exit_code = 0; !open_for_probe(&gpu, &exit_code)) return exit_code;
  const CudaDriver* cu = gpu.cu;
  const ChunkSumKernels& k = gpu.kernels;
  // The GEMMs' inputs: random bf16 (constant inputs would let the hardware idle).
  const size_t elems = size_t{kDim} * kDim;
  std::vector<__nv_bfloat16> host(elems);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : host) x = __float2bfloat16(u(rng));
  __nv_bfloat16 *a, *b, *c;
  cudaMalloc(&a, elems * 2);
  cudaMalloc(&b, elems * 2);
  cudaMalloc(&c, elems * 2);
  cudaMemcpy(a, host.data(), elems * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(b, host.data(), elems * 2, cudaMemcpyHostToDevice);
  void* sum_bufs[3];
  for (void*& p : sum_bufs) {
    cudaMalloc(&p, kSumBytes);
    cudaMemset(p, 0, kSumBytes);
  }
  cudaStream_t gemm_stream, sum_stream;
  cudaStreamCreateWithFlags(&gemm_stream, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&sum_stream, cudaStreamNonBlocking);
  cublasHandle_t h;
  cublasCreate(&h);
  cublasSetStream(h, gemm_stream);
  const float one = 1.f, zero = 0.f;
  auto gemms = [&] {
    for (int i = 0; i < kGemms; ++i)
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, kDim, kDim, kDim, &one, a, CUDA_R_16BF, kDim, b,
                   CUDA_R_16BF, kDim, &zero, c, CUDA_R_16BF, kDim, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT);
  };
  ChunkSumArgs args;
  args.src[0] = sum_bufs[0];
  args.src[1] = sum_bufs[1];
  args.dst = sum_bufs[2];
  args.count = kSumBytes / 4;
  args.nsrc = 2;
  cudaEvent_t g0, g1, s0, s1;
  for (cudaEvent_t* e : {&g0, &g1, &s0, &s1}) cudaEventCreate(e);
  // GEMMs timed alone (ctas 0) or beside sums with `ctas` CTAs: the sum stream gets enough
  // launches to outlast the GEMMs (the alone time says how many), timed on its own events.
  auto run = [&](unsigned ctas, double gemm_alone_ms, double* gemm_ms, double* sum_gbs) {
    cudaDeviceSynchronize();
    int launches = 0;
    if (ctas) {
      const double one_sum_ms = 3.0 * kSumBytes / (ctas * 60e6);  // ~60 GB/s a CTA (probe)
      launches = static_cast<int>(gemm_alone_ms * 1.3 / one_sum_ms) + 1;
      cudaEventRecord(s0, sum_stream);
      for (int i = 0; i < launches; ++i) k.launch(*cu, ChunkType::kF32, args, ctas, sum_stream);
      cudaEventRecord(s1, sum_stream);
    }
    cudaEventRecord(g0, gemm_stream);
    gemms();
    cudaEventRecord(g1, gemm_stream);
    cudaDeviceSynchronize();
    float g = 0, s = 0;
    cudaEventElapsedTime(&g, g0, g1);
    *gemm_ms = g;
    *sum_gbs = 0;
    if (ctas) {
      cudaEventElapsedTime(&s, s0, s1);
      *sum_gbs = 3.0 * kSumBytes * launches / (s * 1e6);
    }
  };
  double alone = 0, ignored = 0;
  run(0, 0, &alone, &ignored);  // warm-up
  const unsigned kCtas[] = {2, 4, 8, 16, 24, 32, 64};
  std::vector<std::vector<double>> slow(std::size(kCtas)), rate(std::size(kCtas));
  std::vector<double> alone_runs;
  for (int r = 0; r < kRuns; ++r) {
    double ms = 0;
    run(0, 0, &ms, &ignored);
    alone_runs.push_back(ms);
    for (size_t i = 0; i < std::size(kCtas); ++i) {
      double beside = 0, gbs = 0;
      run(kCtas[i], ms, &beside, &gbs);
      slow[i].push_back(beside / ms);
      rate[i].push_back(gbs);
    }
  }
  printf("RESULT gemms alone: %.2f ms (%d bf16 GEMMs of %d^3), median of %d\n", median(alone_runs),
         kGemms, kDim, kRuns);
  for (size_t i = 0; i < std::size(kCtas); ++i) {
    auto [lo, hi] = std::minmax_element(slow[i].begin(), slow[i].end());
    printf("RESULT sum ctas %2u: gemms %.3fx alone (%.3f..%.3f), sum %.0f GB/s moved meanwhile\n",
           kCtas[i], median(slow[i]), *lo, *hi, median(rate[i]));
  }
  cublasDestroy(h);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
