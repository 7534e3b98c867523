#include "contention.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cuda_check.h"
#include "kernels.h"
#include "nccl_ranks.h"
#include "peer_push.h"
#include "push_steps.h"
#include "rs_kernels.h"
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

// What the study keeps per GPU: its two streams and its GEMM.
struct GpuWork {
  int device = 0;
  cudaStream_t gs = nullptr;  // GEMM stream
  cudaStream_t cs = nullptr;  // communication stream
  std::unique_ptr<Gemm> gemm;
};

// One event timer per GPU for a phase of n operations, each on its GPU's device, timing each
// one: the overlapped phase needs each all-gather's end, and its time alone is timed alike.
std::vector<std::unique_ptr<IterTimer>> make_timers(const std::vector<GpuWork>& gpus, int n) {
  std::vector<std::unique_ptr<IterTimer>> t;
  for (const GpuWork& g : gpus) {
    ZCB_CUDA(cudaSetDevice(g.device));
    t.push_back(std::make_unique<IterTimer>(n));
  }
  return t;
}

void record(const std::vector<GpuWork>& gpus, std::vector<std::unique_ptr<IterTimer>>& timers,
            int event, cudaStream_t GpuWork::*stream) {
  for (size_t i = 0; i < gpus.size(); ++i) {
    ZCB_CUDA(cudaSetDevice(gpus[i].device));
    timers[i]->record(event, gpus[i].*stream);
  }
}

void synchronize(const std::vector<GpuWork>& gpus) {
  for (const GpuWork& g : gpus) {
    ZCB_CUDA(cudaSetDevice(g.device));
    ZCB_CUDA(cudaStreamSynchronize(g.gs));
    ZCB_CUDA(cudaStreamSynchronize(g.cs));
  }
}

void run_gemms(const std::vector<GpuWork>& gpus) {
  for (const GpuWork& g : gpus) {
    ZCB_CUDA(cudaSetDevice(g.device));
    g.gemm->run();
  }
}

// The three phases of one placement on every GPU of the process; one message per GPU.
std::vector<ContentionMsg> measure_placement(const ContentionGpus& c,
                                             const std::vector<GpuWork>& gpus, bool in_place) {
  const Options& o = *c.o;
  const int m_gemm = o.gemm_iters;
  const bool fixed = o.contention_mode == ContentionMode::kFixed;
  std::vector<cudaStream_t> comm_streams;
  for (const GpuWork& g : gpus) comm_streams.push_back(g.cs);
  auto all_gather = [&] { c.enqueue_op(in_place, comm_streams); };

  for (int i = 0; i < kWarmups; ++i) all_gather();
  synchronize(gpus);
  std::vector<ContentionMsg> out(gpus.size());
  for (size_t i = 0; i < gpus.size(); ++i) {
    out[i].rank = gpus[i].device;
    out[i].in_place = in_place ? 1 : 0;
    out[i].gemm_iters = m_gemm;
    out[i].ag_bytes = c.ag_bytes;
  }

  // 1. GEMMs alone, on every GPU at once.
  c.ch->agree_max(0);
  auto tg = make_timers(gpus, m_gemm);
  record(gpus, tg, 0, &GpuWork::gs);
  for (int i = 0; i < m_gemm; ++i) {
    run_gemms(gpus);
    record(gpus, tg, i + 1, &GpuWork::gs);
  }
  synchronize(gpus);

  // 2. All-gathers alone: the fixed count, or (saturate) a sample to size the overlapped run.
  const int n_alone = fixed ? o.contention_ops : std::max(5, std::min(o.iters, 20));
  c.ch->agree_max(0);
  auto ta = make_timers(gpus, n_alone);
  record(gpus, ta, 0, &GpuWork::cs);
  for (int i = 0; i < n_alone; ++i) {
    all_gather();
    record(gpus, ta, i + 1, &GpuWork::cs);
  }
  synchronize(gpus);
  uint64_t want = 0;
  for (size_t i = 0; i < gpus.size(); ++i) {
    ZCB_CUDA(cudaSetDevice(gpus[i].device));
    out[i].gemm_alone_ms = tg[i]->mean_us() / 1000.0;
    out[i].ag_alone_ms = ta[i]->mean_us() / 1000.0;
    if (o.iter_times) print_iter_times(out[i].rank, c.ag_bytes, in_place, "alone", *ta[i]);
    want = std::max(want, overlap_op_count(m_gemm, out[i].gemm_alone_ms, out[i].ag_alone_ms));
  }

  // 3. Overlapped. Every rank issues the same number of collectives (saturate: the max).
  const int n_ag = fixed ? o.contention_ops : static_cast<int>(c.ch->agree_max(want));
  if (fixed) c.ch->agree_max(0);
  auto og = make_timers(gpus, m_gemm);
  auto oc = make_timers(gpus, n_ag);
  record(gpus, og, 0, &GpuWork::gs);
  record(gpus, oc, 0, &GpuWork::cs);
  // Interleave the enqueues so both streams have work from the first microsecond on.
  int issued = 0;
  for (int i = 0; i < m_gemm; ++i) {
    run_gemms(gpus);
    record(gpus, og, i + 1, &GpuWork::gs);
    const int target = static_cast<int>(static_cast<int64_t>(i + 1) * n_ag / m_gemm);
    while (issued < target) {
      all_gather();
      record(gpus, oc, ++issued, &GpuWork::cs);
    }
  }
  while (issued < n_ag) {
    all_gather();
    record(gpus, oc, ++issued, &GpuWork::cs);
  }
  synchronize(gpus);

  for (size_t g = 0; g < gpus.size(); ++g) {
    ContentionMsg& m = out[g];
    ZCB_CUDA(cudaSetDevice(gpus[g].device));
    const cudaEvent_t g0 = og[g]->event(0);
    const double window = elapsed_ms(g0, og[g]->event(m_gemm));
    m.ag_ops = n_ag;
    m.gemm_overlap_ms = window / m_gemm;
    // The all-gathers that ended inside the GEMM window are the contended ones.
    double in_sum = 0;
    int in_count = 0;
    for (int j = 0; j < n_ag; ++j) {
      if (elapsed_ms(g0, oc[g]->event(j + 1)) > window) continue;
      in_sum += elapsed_ms(oc[g]->event(j), oc[g]->event(j + 1));
      ++in_count;
    }
    m.ag_in_window = in_count;
    const double ag_all = oc[g]->mean_us() / 1000.0;
    if (o.iter_times) print_iter_times(m.rank, c.ag_bytes, in_place, "overlapped", *oc[g]);
    m.ag_overlap_ms = fixed || in_count == 0 ? ag_all : in_sum / in_count;
    const double ag_start = elapsed_ms(g0, oc[g]->event(0));
    const double ag_end = elapsed_ms(g0, oc[g]->event(n_ag));
    m.covered = ag_end >= window;
    m.makespan_ms = std::max(window, ag_end) - std::min(0.0, ag_start);
  }
  return out;
}

}  // namespace

uint64_t overlap_op_count(int gemm_iters, double gemm_ms, double ag_ms) {
  if (ag_ms <= 0) return kMaxOverlapOps;
  double want = std::ceil(2.0 * gemm_iters * gemm_ms / ag_ms) + 2;
  return static_cast<uint64_t>(std::min<double>(std::max(want, 4.0), kMaxOverlapOps));
}

void run_contention(const ContentionGpus& c) {
  const Options& o = *c.o;
  std::vector<GpuWork> gpus(c.devices.size());
  for (size_t i = 0; i < gpus.size(); ++i) {
    GpuWork& g = gpus[i];
    g.device = c.devices[i];
    ZCB_CUDA(cudaSetDevice(g.device));
    ZCB_CUDA(cudaStreamCreateWithFlags(&g.gs, cudaStreamNonBlocking));
    ZCB_CUDA(cudaStreamCreateWithFlags(&g.cs, cudaStreamNonBlocking));
    g.gemm = std::make_unique<Gemm>(o, o.seed + 7919 * static_cast<uint64_t>(g.device), g.gs);
    for (int k = 0; k < kWarmups; ++k) g.gemm->run();
  }
  synchronize(gpus);
  const zerocta_op_t counter = op_shim_counter(o.contention_op());
  for (bool in_place : contention_placements(o.contention_placement)) {
    const RouteCounts before = shim_routes(counter);
    std::vector<ContentionMsg> msgs = measure_placement(c, gpus, in_place);
    // The shim's counters are the process's: they go with its first GPU's message.
    const RouteCounts d = shim_routes(counter) - before;
    for (int i = 0; i < zerocta_route_count; ++i) msgs.front().route_calls[i] = d.calls[i];
    for (const ContentionMsg& m : msgs) c.ch->send(kMsgContention, &m, sizeof(m));
  }
  for (GpuWork& g : gpus) {
    ZCB_CUDA(cudaSetDevice(g.device));
    g.gemm.reset();
    ZCB_CUDA(cudaStreamDestroy(g.gs));
    ZCB_CUDA(cudaStreamDestroy(g.cs));
  }
}

void run_nccl_contention(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch) {
  NcclRanks nr(o, path, worker_rank, nranks, ch);
  // All-gathers, or with --op reducescatter reduce-scatters (random inputs, --dtype, --redop).
  const CollOp op = o.contention_op();
  const CollShape shape = coll_shape(op, o.contention_total_bytes(nranks), nranks, o.dtype.bytes);
  if (shape.count == 0) fatal("--contention-bytes is too small for %d ranks", nranks);
  const std::vector<char*> recv = nr.alloc(shape.recv_bytes);
  const std::vector<char*> send = nr.alloc(shape.send_bytes);
  ContentionGpus c;
  c.o = &o;
  c.ag_bytes = shape.bytes;
  c.ch = ch;
  for (int i = 0; i < nr.size(); ++i) {
    nr.set_device(i);
    if (op == CollOp::kReduceScatter) {
      if (!launch_fill_random(send[i], shape.send_bytes / o.dtype.bytes, o.dtype.nccl, o.seed,
                              nr.rank(i), nullptr))
        fatal("no reduce-scatter test data for data type %s", o.dtype.name);
    } else {
      launch_fill_pattern(send[i], shape.send_bytes, o.dtype.bytes, o.seed, nr.rank(i), nullptr);
    }
    ZCB_CUDA(cudaGetLastError());
    ZCB_CUDA(cudaDeviceSynchronize());
    c.devices.push_back(nr.rank(i));
  }
  c.enqueue_op = [&](bool in_place, const std::vector<cudaStream_t>& streams) {
    std::vector<Placement> place;
    for (int i = 0; i < nr.size(); ++i)
      place.push_back(place_buffers(op, in_place, nr.rank(i), shape, send[i], recv[i]));
    nr.collective(op, place, shape.count, o.dtype.nccl, streams, o.reduction());
  };
  run_contention(c);
  nr.check_async_error();
  send_shim_totals(ch, nr.rank(0), op_shim_counter(op));
}

void run_bare_ce_contention(const Options& o, int nranks, Channel* ch) {
  if (nranks < 2) fatal("bare-ce needs at least 2 GPUs");
  const uint64_t count = per_rank_count(o.contention_total_bytes(nranks), nranks, o.dtype.bytes);
  if (count == 0) fatal("--contention-bytes is too small for %d ranks", nranks);
  const uint64_t chunk = count * o.dtype.bytes;
  // Reduce-scatters: every GPU pushes each peer's chunk of its input (n chunks), no reduction.
  const bool rs = o.contention_op() == CollOp::kReduceScatter;
  std::vector<PeerBuffers> bufs(static_cast<size_t>(nranks));
  ContentionGpus c;
  c.o = &o;
  c.ag_bytes = chunk * nranks;
  c.ch = ch;
  for (int g = 0; g < nranks; ++g) {
    setup_peer_gpu(g, nranks, ch);
    ZCB_CUDA(cudaMalloc(&bufs[g].recv, chunk * nranks));
    ZCB_CUDA(cudaMalloc(&bufs[g].send, rs ? chunk * nranks : chunk));
    c.devices.push_back(g);
  }
  // The floor: every GPU pushes its chunk (the op's per-peer size) into all n-1 peers at
  // once, one batch per GPU and all-gather, 3+ GPUs in step (push_steps.h).
  PushSteps steps(nranks);
  uint64_t op = 0;
  c.enqueue_op = [&](bool in_place, const std::vector<cudaStream_t>& streams) {
    for (int g = 0; g < nranks; ++g) {
      ZCB_CUDA(cudaSetDevice(g));
      steps.before(g, op, streams[g]);
      if (rs)
        enqueue_rs_pushes(g, bufs, chunk, streams[g]);
      else
        enqueue_pushes(g, bufs, chunk, in_place, streams[g]);
      steps.after(g, op, streams[g]);
    }
    ++op;
  };
  run_contention(c);
  for (int g = 0; g < nranks; ++g) {  // run_contention synchronized every stream
    ZCB_CUDA(cudaSetDevice(g));
    cudaFree(bufs[g].recv);
    cudaFree(bufs[g].send);
  }
}

}  // namespace zcb
