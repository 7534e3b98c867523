#include "contention.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "host_barrier.h"
#include "kernels.h"
#include "nccl_rank.h"
#include "peer_push.h"
#include "shim_stats.h"
#include "timing.h"

#define ZCB_CUBLAS(call)                                                                           \
  do {                                                                                             \
    cublasStatus_t s_ = (call);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                               \
      ::zcb::fatal("%s failed: %s (%s:%d)", #call, cublasGetStatusString(s_), __FILE__, __LINE__); \
  } while (0)

namespace zcb {

namespace {

constexpr int kWarmups = 3;
constexpr int kMaxOverlapOps = 4000;

struct Gemm {
  cublasHandle_t handle = nullptr;
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  int m, n, k;

  Gemm(const Options& o, uint64_t seed, cudaStream_t stream)
      : m(o.gemm_m), n(o.gemm_n), k(o.gemm_k) {
    ZCB_CUBLAS(cublasCreate(&handle));
    ZCB_CUBLAS(cublasSetStream(handle, stream));
    const size_t na = static_cast<size_t>(m) * k, nb = static_cast<size_t>(k) * n;
    ZCB_CUDA(cudaMalloc(&a, na * 2));
    ZCB_CUDA(cudaMalloc(&b, nb * 2));
    ZCB_CUDA(cudaMalloc(&c, static_cast<size_t>(m) * n * 2));
    // Random inputs: constant ones would understate the GEMM's power and its sensitivity.
    launch_fill_bf16(a, na, seed, stream);
    launch_fill_bf16(b, nb, seed + 1, stream);
    ZCB_CUDA(cudaGetLastError());
  }
  ~Gemm() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    cublasDestroy(handle);
  }
  void run() {
    const float alpha = 1.0f, beta = 0.0f;
    ZCB_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16BF, m, b,
                            CUDA_R_16BF, k, &beta, c, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
  }
};

}  // namespace

uint64_t overlap_op_count(int gemm_iters, double gemm_ms, double ag_ms) {
  if (ag_ms <= 0) return kMaxOverlapOps;
  double want = std::ceil(2.0 * gemm_iters * gemm_ms / ag_ms) + 2;
  return static_cast<uint64_t>(std::min<double>(std::max(want, 4.0), kMaxOverlapOps));
}

ContentionMsg run_contention_rank(const ContentionRank& c) {
  const Options& o = *c.o;
  cudaStream_t gs, cs;  // GEMM stream, communication stream
  ZCB_CUDA(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
  ZCB_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  Gemm gemm(o, o.seed + 7919 * static_cast<uint64_t>(c.rank), gs);
  RouteCounts routes_before = shim_allgather_routes();

  for (int i = 0; i < kWarmups; ++i) gemm.run();
  for (int i = 0; i < kWarmups; ++i) c.enqueue_op(cs);
  ZCB_CUDA(cudaStreamSynchronize(gs));
  ZCB_CUDA(cudaStreamSynchronize(cs));

  ContentionMsg m{};
  m.rank = c.rank;
  m.gemm_iters = o.gemm_iters;
  m.ag_bytes = c.ag_bytes;

  // 1. GEMM alone.
  c.agree_max(0);
  IterTimer tg(o.gemm_iters);
  tg.record(0, gs);
  for (int i = 0; i < o.gemm_iters; ++i) {
    gemm.run();
    tg.record(i + 1, gs);
  }
  ZCB_CUDA(cudaStreamSynchronize(gs));
  m.gemm_alone_ms = tg.mean_us(o.gemm_iters) / 1000.0;

  // 2. All-gather alone.
  const int ag_iters = std::max(5, std::min(o.iters, 20));
  c.agree_max(0);
  IterTimer ta(ag_iters);
  ta.record(0, cs);
  for (int i = 0; i < ag_iters; ++i) {
    c.enqueue_op(cs);
    ta.record(i + 1, cs);
  }
  ZCB_CUDA(cudaStreamSynchronize(cs));
  m.ag_alone_ms = ta.mean_us(ag_iters) / 1000.0;

  // 3. Overlapped. Every rank must issue the same number of collectives: agree on the max.
  const int n_ag =
      static_cast<int>(c.agree_max(overlap_op_count(o.gemm_iters, m.gemm_alone_ms, m.ag_alone_ms)));
  m.ag_ops = n_ag;
  IterTimer og(o.gemm_iters), oc(n_ag);
  og.record(0, gs);
  oc.record(0, cs);
  // Interleave the enqueues so both streams have work from the first microsecond on.
  int issued = 0;
  for (int i = 0; i < o.gemm_iters; ++i) {
    gemm.run();
    og.record(i + 1, gs);
    const int target = static_cast<int>(static_cast<int64_t>(i + 1) * n_ag / o.gemm_iters);
    while (issued < target) {
      c.enqueue_op(cs);
      oc.record(++issued, cs);
    }
  }
  while (issued < n_ag) {
    c.enqueue_op(cs);
    oc.record(++issued, cs);
  }
  ZCB_CUDA(cudaStreamSynchronize(gs));
  ZCB_CUDA(cudaStreamSynchronize(cs));

  const cudaEvent_t g0 = og.event(0);
  const double window = elapsed_ms(g0, og.event(o.gemm_iters));
  m.gemm_overlap_ms = window / o.gemm_iters;
  // The all-gathers that ran entirely inside the GEMM window are the contended ones.
  double in_sum = 0, all_sum = 0;
  int in_count = 0;
  for (int j = 0; j < n_ag; ++j) {
    const double d = elapsed_ms(oc.event(j), oc.event(j + 1));
    all_sum += d;
    if (elapsed_ms(g0, oc.event(j + 1)) <= window) {
      in_sum += d;
      ++in_count;
    }
  }
  m.ag_in_window = in_count;
  m.ag_overlap_ms = in_count ? in_sum / in_count : all_sum / n_ag;
  const double ag_end = elapsed_ms(g0, oc.event(n_ag));
  const double ag_start = elapsed_ms(g0, oc.event(0));
  m.covered = ag_end >= window;
  m.makespan_ms = std::max(window, ag_end) - std::min(0.0, ag_start);
  m.sequential_ms = o.gemm_iters * m.gemm_alone_ms + n_ag * m.ag_alone_ms;

  RouteCounts d = shim_allgather_routes() - routes_before;
  for (int i = 0; i < zerocta_route_count; ++i) m.route_calls[i] = d.calls[i];
  ZCB_CUDA(cudaStreamDestroy(gs));
  ZCB_CUDA(cudaStreamDestroy(cs));
  return m;
}

void run_nccl_contention(const Options& o, PathId path, int rank, int nranks, Channel* ch) {
  NcclRank nr(path, rank, nranks, ch);
  const uint64_t count = per_rank_count(o.contention_total_bytes(nranks), nranks, o.dtype.bytes);
  if (count == 0) fatal("--contention-bytes is too small for %d ranks", nranks);
  const uint64_t chunk = count * o.dtype.bytes;
  char* recv = static_cast<char*>(nr.alloc(chunk * nranks));
  char* send = static_cast<char*>(nr.alloc(chunk));
  launch_fill_pattern(send, chunk, o.dtype.bytes, o.seed, rank, nullptr);
  ZCB_CUDA(cudaGetLastError());
  ZCB_CUDA(cudaDeviceSynchronize());

  ContentionRank c;
  c.o = &o;
  c.rank = rank;
  c.ag_bytes = chunk * nranks;
  c.enqueue_op = [&](cudaStream_t s) { nr.allgather(send, recv, count, o.dtype.nccl, s); };
  c.agree_max = [&](uint64_t v) { return ch->agree_max(v); };
  ContentionMsg m = run_contention_rank(c);
  nr.check_async_error();
  ch->send(kMsgContention, &m, sizeof(m));
  send_shim_totals(ch, rank, zerocta_op_allgather);
}

void run_bare_ce_contention(const Options& o, int nranks, Channel* ch) {
  if (nranks < 2) fatal("bare-ce needs at least 2 GPUs");
  const uint64_t count = per_rank_count(o.contention_total_bytes(nranks), nranks, o.dtype.bytes);
  if (count == 0) fatal("--contention-bytes is too small for %d ranks", nranks);
  const uint64_t chunk = count * o.dtype.bytes;
  HostBarrier barrier(nranks);
  std::vector<PeerBuffers> bufs(static_cast<size_t>(nranks));
  auto gpu = [&](int g) {
    setup_peer_gpu(g, nranks, ch);
    ZCB_CUDA(cudaMalloc(&bufs[g].recv, chunk * nranks));
    ZCB_CUDA(cudaMalloc(&bufs[g].send, chunk));
    barrier.wait();
    ContentionRank c;
    c.o = &o;
    c.rank = g;
    c.ag_bytes = chunk * nranks;
    c.enqueue_op = [&](cudaStream_t s) { enqueue_pushes(g, bufs, chunk, false, s); };
    c.agree_max = [&](uint64_t v) { return barrier.arrive_max(v); };
    ContentionMsg m = run_contention_rank(c);
    ch->send(kMsgContention, &m, sizeof(m));
    barrier.wait();  // no GPU frees its buffers while a peer may still pull from them
    cudaFree(bufs[g].recv);
    cudaFree(bufs[g].send);
  };
  std::vector<std::thread> threads;
  for (int g = 0; g < nranks; ++g) threads.emplace_back(gpu, g);
  for (std::thread& t : threads) t.join();
}

}  // namespace zcb
