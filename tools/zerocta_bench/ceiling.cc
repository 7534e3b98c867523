// The ceiling path of the sweep: bare peer writes (peer_push.h) timed exactly like the NCCL
// paths, with the same check, so its busbw is directly comparable.
#include <chrono>
#include <thread>
#include <vector>

#include "check.h"
#include "cuda_check.h"
#include "host_barrier.h"
#include "kernels.h"
#include "peer_push.h"
#include "sweep.h"
#include "timing.h"

namespace zcb {

namespace {

// GPU g's buffers for one size: fresh, zeroed, after every GPU is done with the previous
// size's (peers write into this GPU's recv buffer).
void fresh_buffers(int g, uint64_t chunk, uint64_t total, HostBarrier* barrier,
                   std::vector<PeerBuffers>* bufs) {
  PeerBuffers& b = (*bufs)[g];
  barrier->wait();  // nobody writes the previous buffers any more
  ZCB_CUDA(cudaFree(b.recv));
  ZCB_CUDA(cudaFree(b.send));
  ZCB_CUDA(cudaMalloc(&b.recv, total));
  ZCB_CUDA(cudaMalloc(&b.send, chunk));
  ZCB_CUDA(cudaMemset(b.recv, 0, total));
  ZCB_CUDA(cudaMemset(b.send, 0, chunk));
  ZCB_CUDA(cudaDeviceSynchronize());
  barrier->wait();  // every GPU's buffers exist before anyone writes a peer's
}

// The first pushes on this size's fresh buffers, out of place, every GPU starting together:
// steady_clock from the call to the end of the stream's synchronize.
FirstOpResult first_pushes(int g, const std::vector<PeerBuffers>& bufs, uint64_t chunk,
                           HostBarrier* barrier, cudaStream_t stream) {
  barrier->wait();
  const auto start = std::chrono::steady_clock::now();
  enqueue_pushes(g, bufs, chunk, false, stream);
  const auto called = std::chrono::steady_clock::now();
  ZCB_CUDA(cudaStreamSynchronize(stream));
  const auto done = std::chrono::steady_clock::now();
  barrier->wait();  // every GPU's first writes are done before anyone poisons its recv
  FirstOpResult r{};
  r.call_ms = std::chrono::duration<double, std::milli>(called - start).count();
  r.ms = std::chrono::duration<double, std::milli>(done - start).count();
  return r;
}

void ceiling_gpu(const Options& o, int g, int n, Channel* ch, HostBarrier* barrier,
                 std::vector<PeerBuffers>* bufs) {
  setup_peer_gpu(g, n, ch);
  const int elem = o.dtype.bytes;
  cudaStream_t stream;
  ZCB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  IterTimer timer(o.iters, events_every(o, o.iters));
  WrongCounter wrong;

  std::vector<uint64_t> sizes = sweep_sizes(o);
  for (size_t si = 0; si < sizes.size(); ++si) {
    const uint64_t count = per_rank_count(sizes[si], n, elem);
    if (count == 0) continue;
    const uint64_t chunk = count * elem;
    const uint64_t total = chunk * n;
    fresh_buffers(g, chunk, total, barrier, bufs);
    RowMsg row{};
    row.rank = g;
    row.size_index = static_cast<int32_t>(si);
    row.bytes = total;
    row.count = count;
    row.first = first_pushes(g, *bufs, chunk, barrier, stream);
    for (int in_place = 0; in_place < 2; ++in_place) {
      PlaceResult& pr = in_place ? row.ip : row.oop;
      const uint64_t seed = pattern_seed(o.seed, static_cast<int>(si), in_place);
      char* own_src = in_place ? (*bufs)[g].recv + g * chunk : (*bufs)[g].send;
      pr.wrong = -1;
      if (o.check) {
        ZCB_CUDA(cudaMemsetAsync((*bufs)[g].recv, kPoisonByte, total, stream));
        launch_fill_pattern(own_src, chunk, elem, seed, g, stream);
        ZCB_CUDA(cudaGetLastError());
        ZCB_CUDA(cudaStreamSynchronize(stream));
        barrier->wait();  // every source is filled
        enqueue_pushes(g, *bufs, chunk, in_place, stream);
        ZCB_CUDA(cudaStreamSynchronize(stream));
        barrier->wait();  // every GPU's writes into this GPU's recv are done
        // Out-of-place, nobody writes this GPU's own chunk of recv: do not count it.
        pr.wrong = wrong.count((*bufs)[g].recv, chunk, n, elem, seed, in_place ? -1 : g, stream);
      }
      for (int i = 0; i < o.warmups; ++i) enqueue_pushes(g, *bufs, chunk, in_place, stream);
      ZCB_CUDA(cudaStreamSynchronize(stream));
      barrier->wait();  // start the timed loops together
      timer.record(0, stream);
      for (int i = 0; i < o.iters; ++i) {
        enqueue_pushes(g, *bufs, chunk, in_place, stream);
        timer.record(i + 1, stream);
      }
      ZCB_CUDA(cudaStreamSynchronize(stream));
      pr.mean_us = timer.mean_us();
      pr.median_us = timer.median_us();
      barrier->wait();  // nobody poisons a buffer a peer may still be writing
    }
    ch->send(kMsgRow, &row, sizeof(row));
  }
  ZCB_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

void run_ceiling_sweep(const Options& o, int nranks, Channel* ch) {
  if (nranks < 2) fatal("the ceiling needs at least 2 GPUs");
  HostBarrier barrier(nranks);
  std::vector<PeerBuffers> bufs(static_cast<size_t>(nranks));
  std::vector<std::thread> threads;
  for (int g = 0; g < nranks; ++g)
    threads.emplace_back(ceiling_gpu, std::cref(o), g, nranks, ch, &barrier, &bufs);
  for (std::thread& t : threads) t.join();
  for (int g = 0; g < nranks; ++g) {
    cudaSetDevice(g);
    cudaFree(bufs[g].recv);
    cudaFree(bufs[g].send);
  }
}

}  // namespace zcb
