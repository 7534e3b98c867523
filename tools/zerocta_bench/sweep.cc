// The bandwidth sweep of one NCCL rank. Per size and placement: a checked operation on fresh
// data (poisoned output, bitwise compare), warm-ups, then the timed loop, and the shim's route
// counters before/after so every row says which route its all-gathers really took.
#include "sweep.h"

#include <cuda_runtime_api.h>

#include "check.h"
#include "cuda_check.h"
#include "kernels.h"
#include "nccl_rank.h"
#include "shim_stats.h"
#include "timing.h"

namespace zcb {

SweepBuffers sweep_buffers(const Options& o, int nranks) {
  SweepBuffers b;
  for (uint64_t size : sweep_sizes(o)) {
    uint64_t chunk = per_rank_count(size, nranks, o.dtype.bytes) * o.dtype.bytes;
    if (chunk * nranks > b.max_total) b.max_total = chunk * nranks;
    if (chunk > b.max_chunk) b.max_chunk = chunk;
  }
  return b;
}

void run_nccl_sweep(const Options& o, PathId path, int rank, int nranks, Channel* ch) {
  NcclRank nr(path, rank, nranks, ch);
  const int elem = o.dtype.bytes;
  SweepBuffers sb = sweep_buffers(o, nranks);
  if (sb.max_total == 0) {
    send_shim_totals(ch, rank);
    return;
  }
  cudaStream_t stream;
  ZCB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Allocated once at the largest size (collective on nccl-ce: same order on every rank).
  char* recv = static_cast<char*>(nr.alloc(sb.max_total));
  char* send = static_cast<char*>(nr.alloc(sb.max_chunk));
  IterTimer timer(o.iters);
  WrongCounter wrong;

  std::vector<uint64_t> sizes = sweep_sizes(o);
  for (size_t si = 0; si < sizes.size(); ++si) {
    const uint64_t count = per_rank_count(sizes[si], nranks, elem);
    if (count == 0) continue;
    const uint64_t chunk = count * elem;
    const uint64_t total = chunk * nranks;
    RowMsg row{};
    row.rank = rank;
    row.size_index = static_cast<int32_t>(si);
    row.bytes = total;
    row.count = count;
    for (int in_place = 0; in_place < 2; ++in_place) {
      PlaceResult& pr = in_place ? row.ip : row.oop;
      char* sendbuf = in_place ? recv + rank * chunk : send;
      const uint64_t seed = pattern_seed(o.seed, static_cast<int>(si), in_place);
      RouteCounts before = shim_allgather_routes();
      pr.wrong = -1;
      if (o.check) {
        // Every rank has finished the previous loop before anyone overwrites a buffer: a rank's
        // own op can complete while a peer still reads its buffers, depending on the protocol.
        ch->agree_max(0);
        // Poison first: for in-place the fill then overwrites this rank's own chunk.
        ZCB_CUDA(cudaMemsetAsync(recv, kPoisonByte, total, stream));
        launch_fill_pattern(sendbuf, chunk, elem, seed, rank, stream);
        ZCB_CUDA(cudaGetLastError());
        nr.allgather(sendbuf, recv, count, o.dtype.nccl, stream);
        pr.wrong = wrong.count(recv, chunk, nranks, elem, seed, -1, stream);
      }
      for (int i = 0; i < o.warmups; ++i) nr.allgather(sendbuf, recv, count, o.dtype.nccl, stream);
      timer.record(0, stream);
      for (int i = 0; i < o.iters; ++i) {
        nr.allgather(sendbuf, recv, count, o.dtype.nccl, stream);
        timer.record(i + 1, stream);
      }
      ZCB_CUDA(cudaStreamSynchronize(stream));
      nr.check_async_error();
      pr.mean_us = timer.mean_us(o.iters);
      pr.median_us = timer.median_us(o.iters);
      RouteCounts d = shim_allgather_routes() - before;
      for (int i = 0; i < zerocta_route_count; ++i) pr.route_calls[i] = d.calls[i];
    }
    ch->send(kMsgRow, &row, sizeof(row));
  }
  ZCB_CUDA(cudaStreamDestroy(stream));
  send_shim_totals(ch, rank);
}

}  // namespace zcb
