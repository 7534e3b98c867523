// The sum-kernel floor of the reduce-scatter sweep: the route's reduction kernel alone, built
// into the bench from the repository's src/route/chunk_sum.cu (tools/zerocta-bench.cmake) and
// launched with the runtime API (cudaLaunchKernel on its host stub) with --rs-ctas CTAs of
// zc::kChunkSumThreads threads, on GPU 0: nranks chunks of the op's output size (its per-rank
// recv bytes) summed into one (avg: the pre-multiplied sum with the scale 1/nranks rounded to
// the type, this GPU's chunk fused last). What the route's reduction costs when nothing else
// runs; rows in the op's conventions (size = the reduce-scatter's input, n x output), so that its
// time sits beside the paths'. Its HBM traffic per op is (nranks + 1) x the output bytes.
#include <chrono>
#include <vector>

#include "check.h"
#include "chunk_sum.h"  // src/route/chunk_sum.h: the kernels' argument and launch shape
#include "cuda_check.h"
#include "gpu_hello.h"
#include "kernels.h"
#include "rs_kernels.h"
#include "sweep.h"
#include "timing.h"

// src/route/chunk_sum.cu's entry points: nvcc made each a host stub of this name (C linkage),
// the address cudaLaunchKernel takes; their one argument is zc::ChunkSumArgs' bytes.
extern "C" void zc_chunk_sum_f32(zc::ChunkSumArgs);
extern "C" void zc_chunk_sum_f16(zc::ChunkSumArgs);
extern "C" void zc_chunk_sum_bf16(zc::ChunkSumArgs);

namespace zcb {

namespace {

const void* kernel_for(ncclDataType_t type) {
  switch (type) {
    case ncclFloat32:
      return reinterpret_cast<const void*>(&zc_chunk_sum_f32);
    case ncclFloat16:
      return reinterpret_cast<const void*>(&zc_chunk_sum_f16);
    case ncclBfloat16:
      return reinterpret_cast<const void*>(&zc_chunk_sum_bf16);
    default:
      return nullptr;
  }
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

void run_sum_kernel_sweep(const Options& o, int nranks, Channel* ch) {
  if (nranks < 2 || nranks > zc::kChunkSumMaxSources)
    fatal("sum-kernel sums 2..%d chunks, not %d", zc::kChunkSumMaxSources, nranks);
  const void* fn = kernel_for(o.dtype.nccl);
  if (!fn) fatal("sum-kernel: no reduction kernel for %s", o.dtype.name);
  // parse_options keeps sum-kernel out of the pre-multiplied sums: it launches with one scale for
  // every chunk.
  if (redop_is_premul(o.redop)) fatal("sum-kernel: no --redop %s", redop_name(o.redop));
  ZCB_CUDA(cudaSetDevice(0));
  for (int r = 0; r < nranks; ++r) {  // the row speaks for every rank (see below)
    HelloMsg h = gpu_hello(r, 0);
    ch->send(kMsgHello, &h, sizeof(h));
  }
  cudaStream_t stream;
  ZCB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  IterTimer timer(o.iters, events_every(o, o.iters));
  WrongCounter wrong;
  const bool avg = o.redop == RedOp::kAvg;
  const unsigned scale = avg ? avg_scale_bits(o.dtype.nccl, nranks) : 0;
  char* src = nullptr;  // nranks chunks of the output's bytes, back to back
  char* dst = nullptr;

  std::vector<uint64_t> sizes = sweep_sizes(o);
  for (size_t si = 0; si < sizes.size(); ++si) {
    const CollShape s = sweep_shape(o, sizes[si], nranks);
    if (s.count == 0) continue;
    ZCB_CUDA(cudaFree(src));
    ZCB_CUDA(cudaFree(dst));
    ZCB_CUDA(cudaMalloc(&src, s.send_bytes));
    ZCB_CUDA(cudaMalloc(&dst, s.recv_bytes));
    ZCB_CUDA(cudaMemset(src, 0, s.send_bytes));
    ZCB_CUDA(cudaMemset(dst, 0, s.recv_bytes));
    ZCB_CUDA(cudaDeviceSynchronize());

    zc::ChunkSumArgs args;
    for (int k = 0; k < nranks; ++k) args.src[k] = src + k * s.recv_bytes;
    args.count = s.count;
    args.nsrc = nranks;
    args.premul = avg ? 1 : 0;
    args.scale_bits = scale;
    // In place the output overwrites chunk 0, this GPU's own (each element is read before the
    // same thread writes it), as an in-place reduce-scatter's lands in its own input piece.
    auto launch = [&](bool in_place) {
      args.dst = in_place ? src : dst;
      void* params[] = {&args};
      ZCB_CUDA(cudaLaunchKernel(fn, dim3(static_cast<unsigned>(o.rs_ctas)),
                                dim3(zc::kChunkSumThreads), params, 0, stream));
    };

    RowMsg row{};
    row.size_index = static_cast<int32_t>(si);
    row.bytes = s.bytes;
    row.count = s.count;
    const auto start = std::chrono::steady_clock::now();
    launch(false);
    row.first.call_ms = ms_since(start);
    ZCB_CUDA(cudaStreamSynchronize(stream));
    row.first.ms = ms_since(start);

    for (int in_place = 0; in_place < 2; ++in_place) {
      PlaceResult& pr = in_place ? row.ip : row.oop;
      const uint64_t seed = pattern_seed(o.seed, static_cast<int>(si), in_place);
      pr.wrong = -1;
      pr.maxdiff = -1;
      if (o.check) {
        // Chunk k holds "rank" k's input: the check regenerates every one of them.
        ZCB_CUDA(cudaMemsetAsync(in_place ? src : dst, 0xA5, s.recv_bytes, stream));
        for (int k = 0; k < nranks; ++k)
          launch_fill_random(src + k * s.recv_bytes, s.count, o.dtype.nccl, seed, k, stream);
        ZCB_CUDA(cudaGetLastError());
        launch(in_place != 0);
        ZCB_CUDA(cudaGetLastError());
        RsCheck c;
        c.out = in_place ? src : dst;
        c.count = s.count;
        c.nranks = nranks;
        c.type = o.dtype.nccl;
        c.seed = seed;
        c.avg = avg;
        c.in_order = true;
        c.scale_bits = scale;
        pr.wrong = wrong.count_rs(c, &pr.maxdiff, stream);
      }
      for (int i = 0; i < o.warmups; ++i) launch(in_place != 0);
      timer.record(0, stream);
      for (int i = 0; i < o.iters; ++i) {
        launch(in_place != 0);
        timer.record(i + 1, stream);
      }
      ZCB_CUDA(cudaStreamSynchronize(stream));
      pr.mean_us = timer.mean_us();
      pr.median_us = timer.median_us();
      if (o.iter_times) print_iter_times(0, s.bytes, in_place != 0, "sweep", timer);
    }
    // One GPU's numbers stand for every rank's row (the parent wants nranks of them): the
    // times as they are (max over ranks), #wrong once.
    for (int r = 0; r < nranks; ++r) {
      RowMsg m = row;
      m.rank = r;
      if (r > 0) m.oop.wrong = m.ip.wrong = o.check ? 0 : -1;
      ch->send(kMsgRow, &m, sizeof(m));
    }
  }
  ZCB_CUDA(cudaStreamSynchronize(stream));
  cudaFree(src);
  cudaFree(dst);
  ZCB_CUDA(cudaStreamDestroy(stream));
}

}  // namespace zcb
