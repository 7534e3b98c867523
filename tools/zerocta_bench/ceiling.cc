// The ceiling path of the sweep (all-gathers) and bare-ce's (reduce-scatters): bare peer writes
// (peer_push.h) timed exactly like the NCCL paths, with a check of the bytes moved, so that
// their busbw is directly comparable.
#include <chrono>
#include <thread>
#include <vector>

#include "check.h"
#include "cuda_check.h"
#include "host_barrier.h"
#include "kernels.h"
#include "peer_push.h"
#include "push_steps.h"
#include "sweep.h"
#include "timing.h"

namespace zcb {

namespace {

// The pattern seed of the input chunk destined for GPU q (bare-ce's reduce-scatter check).
uint64_t rs_chunk_seed(uint64_t seed, int q) {
  return seed * 0xff51afd7ed558ccdull + 0x9E37u * static_cast<uint64_t>(q + 1);
}

// What the GPUs' threads share.
struct CeilingGpus {
  CeilingGpus(int n, bool rs) : rs(rs), barrier(n), step_barrier(n), steps(n), bufs(n) {}
  bool rs;                   // reduce-scatter pushes (bare-ce), else the all-gather's (ceiling)
  HostBarrier barrier;       // between the phases of a size
  SpinBarrier step_barrier;  // after every op, where the GPUs keep in step
  PushSteps steps;
  std::vector<PeerBuffers> bufs;
};

// GPU g's pushes of its next op (*op, counted alike on every GPU), in step with the other GPUs
// where they need it (push_steps.h).
void push_op(int g, CeilingGpus* c, uint64_t chunk, bool in_place, uint64_t* op,
             cudaStream_t stream) {
  c->steps.before(g, *op, stream);
  if (c->rs)
    enqueue_rs_pushes(g, c->bufs, chunk, stream);
  else
    enqueue_pushes(g, c->bufs, chunk, in_place, stream);
  c->steps.after(g, *op, stream);
  ++*op;
  if (c->steps.in_step()) c->step_barrier.wait();
}

// GPU g's buffers for one size: fresh, zeroed, after every GPU is done with the previous
// size's (peers write into this GPU's recv buffer).
void fresh_buffers(int g, uint64_t send, uint64_t total, CeilingGpus* c) {
  PeerBuffers& b = c->bufs[g];
  c->barrier.wait();  // nobody writes the previous buffers any more
  ZCB_CUDA(cudaFree(b.recv));
  ZCB_CUDA(cudaFree(b.send));
  ZCB_CUDA(cudaMalloc(&b.recv, total));
  ZCB_CUDA(cudaMalloc(&b.send, send));
  ZCB_CUDA(cudaMemset(b.recv, 0, total));
  ZCB_CUDA(cudaMemset(b.send, 0, send));
  ZCB_CUDA(cudaDeviceSynchronize());
  c->barrier.wait();  // every GPU's buffers exist before anyone writes a peer's
}

// The first pushes on this size's fresh buffers, out of place, every GPU starting together:
// steady_clock from the call to the end of the stream's synchronize.
FirstOpResult first_pushes(int g, CeilingGpus* c, uint64_t chunk, uint64_t* op,
                           cudaStream_t stream) {
  c->barrier.wait();
  const auto start = std::chrono::steady_clock::now();
  push_op(g, c, chunk, false, op, stream);
  const auto called = std::chrono::steady_clock::now();
  ZCB_CUDA(cudaStreamSynchronize(stream));
  const auto done = std::chrono::steady_clock::now();
  c->barrier.wait();  // every GPU's first writes are done before anyone poisons its recv
  FirstOpResult r{};
  r.call_ms = std::chrono::duration<double, std::milli>(called - start).count();
  r.ms = std::chrono::duration<double, std::milli>(done - start).count();
  return r;
}

void ceiling_gpu(const Options& o, int g, int n, Channel* ch, CeilingGpus* c) {
  setup_peer_gpu(g, n, ch);
  const int elem = o.dtype.bytes;
  cudaStream_t stream;
  ZCB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  IterTimer timer(o.iters, events_every(o, o.iters));
  WrongCounter wrong;
  uint64_t op = 0;

  std::vector<uint64_t> sizes = sweep_sizes(o);
  for (size_t si = 0; si < sizes.size(); ++si) {
    const uint64_t count = per_rank_count(sizes[si], n, elem);
    if (count == 0) continue;
    const uint64_t chunk = count * elem;
    const uint64_t total = chunk * n;
    fresh_buffers(g, c->rs ? total : chunk, total, c);
    PeerBuffers& mine = c->bufs[g];
    RowMsg row{};
    row.rank = g;
    row.size_index = static_cast<int32_t>(si);
    row.bytes = total;
    row.count = count;
    row.first = first_pushes(g, c, chunk, &op, stream);
    for (int in_place = 0; in_place < 2; ++in_place) {
      PlaceResult& pr = in_place ? row.ip : row.oop;
      const uint64_t seed = pattern_seed(o.seed, static_cast<int>(si), in_place);
      char* own_src = in_place ? mine.recv + g * chunk : mine.send;
      pr.wrong = -1;
      pr.maxdiff = -1;
      if (o.check) {
        ZCB_CUDA(cudaMemsetAsync(mine.recv, kPoisonByte, total, stream));
        if (c->rs)  // input chunk q, for GPU q: GPU g's pattern under GPU q's seed
          for (int q = 0; q < n; ++q)
            launch_fill_pattern(mine.send + q * chunk, chunk, elem, rs_chunk_seed(seed, q), g,
                                stream);
        else
          launch_fill_pattern(own_src, chunk, elem, seed, g, stream);
        ZCB_CUDA(cudaGetLastError());
        ZCB_CUDA(cudaStreamSynchronize(stream));
        c->barrier.wait();  // every source is filled
        push_op(g, c, chunk, in_place, &op, stream);
        ZCB_CUDA(cudaStreamSynchronize(stream));
        c->barrier.wait();  // every GPU's writes into this GPU's recv are done
        // Out-of-place, nobody writes this GPU's own chunk of recv: do not count it (nor ever
        // for the reduce-scatter's pushes: slot q holds GPU q's chunk for this GPU).
        pr.wrong = c->rs ? wrong.count(mine.recv, chunk, n, elem, rs_chunk_seed(seed, g), g, stream)
                         : wrong.count(mine.recv, chunk, n, elem, seed, in_place ? -1 : g, stream);
      }
      for (int i = 0; i < o.warmups; ++i) push_op(g, c, chunk, in_place, &op, stream);
      ZCB_CUDA(cudaStreamSynchronize(stream));
      c->barrier.wait();  // start the timed loops together
      timer.record(0, stream);
      for (int i = 0; i < o.iters; ++i) {
        push_op(g, c, chunk, in_place, &op, stream);
        timer.record(i + 1, stream);
      }
      ZCB_CUDA(cudaStreamSynchronize(stream));
      pr.mean_us = timer.mean_us();
      pr.median_us = timer.median_us();
      c->barrier.wait();  // nobody poisons a buffer a peer may still be writing
    }
    ch->send(kMsgRow, &row, sizeof(row));
  }
  ZCB_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

void run_ceiling_sweep(const Options& o, int nranks, Channel* ch) {
  if (nranks < 2) fatal("the ceiling needs at least 2 GPUs");
  CeilingGpus c(nranks, o.op == CollOp::kReduceScatter);
  std::vector<std::thread> threads;
  for (int g = 0; g < nranks; ++g)
    threads.emplace_back(ceiling_gpu, std::cref(o), g, nranks, ch, &c);
  for (std::thread& t : threads) t.join();
  for (int g = 0; g < nranks; ++g) {
    cudaSetDevice(g);
    cudaFree(c.bufs[g].recv);
    cudaFree(c.bufs[g].send);
  }
}

}  // namespace zcb
