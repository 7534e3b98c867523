// Proof that zerocta's own zero-copy all-gather (ZEROCTA_ALLGATHER=zerocta) runs on copy
// engines only: across processes, on cuMem buffers exportable as file descriptors (as PyTorch's
// expandable segments are), all-gathers out of place and in place, on a non-blocking stream
// and on the legacy default stream, must launch no kernel at all, do copies, give NCCL's bits
// and be counted under the copy-engine route. Where the route does not apply the op must go to
// NCCL on every rank alike (kernels, counted as pass-through): cudaMalloc buffers (not
// reachable from another process) and ops captured into a CUDA graph. CUPTI activity records
// are the evidence; graph node types alone would not say which engine ran. All-gathers grouped
// with ops NCCL runs keep NCCL's order among the communicator's ops: data and sums checked.
//
// With ZCTEST_CE_TRACE=FILE the test also writes every copy of a few large all-gathers
// (ZCTEST_CE_TRACE_BYTES per rank, default 256 MiB) as CSV lines, FILE.rank<N>: the timeline
// that shows where an op's time goes (copy-in, pulls, flags, gaps).
//
// Without the shim the test skips: there is no zerocta route to check.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cumem_buffer.h"
#include "cupti_counter.h"
#include "gpu_gtest.h"
#include "gpu_kernels.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

uint64_t ce_route_calls() {
  GetStatsFn get = shim_get_stats();
  zerocta_stats_t s{};
  if (get == nullptr || get(&s) != 0) return 0;
  return s.counters[zerocta_op_allgather][zerocta_route_ce].calls;
}

struct Buffers {
  size_t count = 0, chunk = 0;
  void* send = nullptr;
  void* recv = nullptr;
  bool cumem = true;
  std::vector<std::vector<uint8_t>> inputs;  // every rank's input, for the expected result
};

// cumem: exportable cuMem memory (the route reaches it across processes); else cudaMalloc.
Buffers make_buffers(size_t bytes, int rank, int nranks, uint64_t salt, bool cumem = true) {
  Buffers b;
  b.count = bytes / sizeof(float);
  b.chunk = b.count * sizeof(float);
  b.cumem = cumem;
  if (cumem) {
    b.send = cumem_alloc(b.chunk);
    b.recv = cumem_alloc(b.chunk * nranks);
  } else {
    ZG_CUDA(cudaMalloc(&b.send, b.chunk));
    ZG_CUDA(cudaMalloc(&b.recv, b.chunk * nranks));
  }
  for (int q = 0; q < nranks; ++q)
    b.inputs.push_back(make_input(ncclFloat32, b.count, seed_of({salt, static_cast<uint64_t>(q)})));
  ZG_CUDA(cudaMemcpy(b.send, b.inputs[rank].data(), b.chunk, cudaMemcpyHostToDevice));
  return b;
}

void free_buffers(Buffers* b) {
  if (b->cumem) {
    cumem_free(b->send);
    cumem_free(b->recv);
    return;
  }
  ZG_CUDA(cudaFree(b->send));
  ZG_CUDA(cudaFree(b->recv));
}

// Fails the rank unless recv holds every rank's input in rank order.
void expect_gathered(const Buffers& b, int nranks, const std::string& what) {
  std::vector<uint8_t> got(b.chunk * nranks);
  ZG_CUDA(cudaMemcpy(got.data(), b.recv, got.size(), cudaMemcpyDeviceToHost));
  for (int q = 0; q < nranks; ++q) {
    const size_t diff = first_difference(got.data() + q * b.chunk, b.inputs[q].data(), b.chunk);
    if (diff != SIZE_MAX)
      fail(what + ": wrong data from rank " + std::to_string(q) + " at byte " +
           std::to_string(diff));
  }
}

// Runs `issue` (all-gathers on `stream`) inside a CUPTI window and checks the evidence:
// `expected_ops` routed and no kernel, or (expected_ops == 0) none routed and NCCL's kernels.
bool check_window(const char* name, int rank, uint64_t expected_ops, cudaStream_t stream,
                  const std::function<void()>& issue) {
  const uint64_t before = ce_route_calls();
  cupti_begin_window();
  issue();
  wait_stream(stream, name);
  ActivityCounts a = cupti_end_window();
  heartbeat();
  const uint64_t routed = ce_route_calls() - before;
  printf("ce-route case=%s rank=%d kernels=%d copies=%d routed=%llu/%llu\n", name, rank, a.kernels,
         a.memcpys, static_cast<unsigned long long>(routed),
         static_cast<unsigned long long>(expected_ops));
  bool ok = true;
  if (expected_ops == 0) {
    if (routed != 0 || a.kernels == 0) {
      report(std::string(name) + ": expected NCCL's kernel path on every rank, got " +
             std::to_string(routed) + " routed and " + std::to_string(a.kernels) + " kernels");
      ok = false;
    }
    return ok;
  }
  if (a.kernels != 0) {
    std::string names;
    for (const auto& n : a.kernel_names) names += " " + n;
    report(std::string(name) + ": the copy-engine route launched " + std::to_string(a.kernels) +
           " kernels:" + names);
    ok = false;
  }
  // A rank may issue no copy of its own: of a pair, the rank that arrived later may move both
  // chunks (op_exchange.h). The data check and the control kernel below keep this honest.
  if (a.memcpys == 0)
    printf("ce-route case=%s rank=%d: no copy of its own (the peer moved both chunks)\n", name,
           rank);
  if (routed != expected_ops) {
    report(std::string(name) + ": " + std::to_string(routed) + " of " +
           std::to_string(expected_ops) + " all-gathers took the copy-engine route");
    ok = false;
  }
  return ok;
}

void write_trace(const ActivityCounts& a, int rank, uint64_t bytes, int ops) {
  const char* path = getenv("ZCTEST_CE_TRACE");
  const std::string file = std::string(path) + ".rank" + std::to_string(rank);
  FILE* f = fopen(file.c_str(), "w");
  if (f == nullptr) fail("cannot write " + file);
  fprintf(f, "# rank=%d bytes_per_rank=%llu ops=%d\n", rank, static_cast<unsigned long long>(bytes),
          ops);
  fprintf(f, "start_ns,end_ns,bytes,stream,channel,channel_type,copy_kind,src_dev,dst_dev\n");
  const uint64_t t0 = a.copies.empty() ? 0 : a.copies.front().start;
  for (const CopyRecord& c : a.copies)
    fprintf(f, "%llu,%llu,%llu,%u,%u,%u,%u,%d,%d\n", static_cast<unsigned long long>(c.start - t0),
            static_cast<unsigned long long>(c.end - t0), static_cast<unsigned long long>(c.bytes),
            c.stream, c.channel, c.channel_type, c.copy_kind, c.src_device, c.dst_device);
  fclose(f);
}

// Which engine runs a same-GPU copy: timed alone, and again while spinning blocks fill every
// SM. A copy that needs SMs waits for the spin to end; a copy engine does not. Tried: plain
// cudaMemcpyAsync, cudaMemcpyBatchAsync with "prefer overlap with compute", and that batch
// with a 4-byte copy to a peer GPU added (as NCCL batches its own chunk with its peer copies).
void probe_local_copy_engine(int rank) {
  const size_t bytes = size_t{256} << 20;
  int dev = 0, ndev = 0;
  ZG_CUDA(cudaGetDevice(&dev));
  ZG_CUDA(cudaGetDeviceCount(&ndev));
  const int peer = (dev + 1) % ndev;
  void *a = nullptr, *b = nullptr, *remote = nullptr, *tiny = nullptr;
  ZG_CUDA(cudaMalloc(&a, bytes));
  ZG_CUDA(cudaMalloc(&b, bytes));
  ZG_CUDA(cudaMalloc(&tiny, 4096));
  ZG_CUDA(cudaSetDevice(peer));
  ZG_CUDA(cudaMalloc(&remote, 4096));
  ZG_CUDA(cudaSetDevice(dev));
  const cudaError_t pe = cudaDeviceEnablePeerAccess(peer, 0);
  if (pe != cudaSuccess && pe != cudaErrorPeerAccessAlreadyEnabled) ZG_CUDA(pe);
  cudaGetLastError();
  cudaStream_t cs, ks;
  ZG_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  ZG_CUDA(cudaStreamCreateWithFlags(&ks, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  ZG_CUDA(cudaEventCreate(&e0));
  ZG_CUDA(cudaEventCreate(&e1));
  enum Kind { kPlain, kBatch, kBatchWithPeer, kBatchWithLocalTiny };
  const char* names[] = {"cudaMemcpyAsync", "cudaMemcpyBatchAsync(prefer-overlap)",
                         "batch(prefer-overlap) + 4 B to a peer",
                         "batch(prefer-overlap) + 4 B local"};
  auto copy = [&](Kind k) {
    if (k == kPlain) {
      ZG_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cs));
      return;
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t idx = 0;
    size_t sizes[2] = {bytes, 4};
    void* dsts[2] = {b, k == kBatchWithPeer ? remote : tiny};
    const void* srcs[2] = {a, static_cast<const char*>(tiny) + 64};
    ZG_CUDA(cudaMemcpyBatchAsync(dsts, srcs, sizes, k == kBatch ? 1 : 2, &attr, &idx, 1, cs));
  };
  for (Kind k : {kPlain, kBatch, kBatchWithPeer, kBatchWithLocalTiny}) {
    float alone = 0, spun = 0;
    for (bool spin : {false, true}) {
      copy(k);  // warm
      ZG_CUDA(cudaDeviceSynchronize());
      if (spin) launch_all_sm_spin(5.0, ks);
      ZG_CUDA(cudaEventRecord(e0, cs));
      copy(k);
      ZG_CUDA(cudaEventRecord(e1, cs));
      ZG_CUDA(cudaDeviceSynchronize());
      ZG_CUDA(cudaEventElapsedTime(spin ? &spun : &alone, e0, e1));
    }
    printf(
        "engine-probe rank=%d local 256 MiB by %s: alone %.3f ms, while every SM spins 5 ms: "
        "%.3f ms -> %s\n",
        rank, names[k], alone, spun, spun > 2.5 ? "needs SMs" : "copy engine");
  }
  ZG_CUDA(cudaEventDestroy(e0));
  ZG_CUDA(cudaEventDestroy(e1));
  ZG_CUDA(cudaStreamDestroy(cs));
  ZG_CUDA(cudaStreamDestroy(ks));
  ZG_CUDA(cudaFree(a));
  ZG_CUDA(cudaFree(b));
  ZG_CUDA(cudaFree(tiny));
  ZG_CUDA(cudaSetDevice(peer));
  ZG_CUDA(cudaFree(remote));
  ZG_CUDA(cudaSetDevice(dev));
}

// An all-gather grouped with an op NCCL runs (an all-reduce on another stream, as a framework's
// bucketed reduce-scatters), then an all-reduce in a group of its own: NCCL launches the
// grouped all-reduce at the group's end, the routed all-gather waits for it, and the next
// all-reduce for the all-gather (comm_order.h). The all-gathers' data and the sums checked,
// every all-gather routed, no hang.
bool grouped_with_nccl_ops(ncclComm_t comm, int rank, int n, cudaStream_t stream,
                           const Buffers& b) {
  constexpr int kRounds = 4;
  constexpr size_t kSum = 1024;
  cudaStream_t other;
  ZG_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  float* sum = nullptr;
  ZG_CUDA(cudaMalloc(&sum, kSum * sizeof(float)));
  const uint64_t before = ce_route_calls();
  bool ok = true;
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (int i = 0; i < kRounds; ++i) {
    ZG_CUDA(cudaMemset(b.recv, kPoison, b.chunk * n));
    const std::vector<float> mine(kSum, static_cast<float>(rank + 1));
    ZG_CUDA(cudaMemcpy(sum, mine.data(), kSum * sizeof(float), cudaMemcpyHostToDevice));
    ZG_NCCL(ncclGroupStart());
    ZG_NCCL(ncclAllGather(b.send, b.recv, b.count, ncclFloat32, comm, stream));
    ZG_NCCL(ncclAllReduce(sum, sum, kSum, ncclFloat32, ncclSum, comm, other));
    ZG_NCCL(ncclGroupEnd());
    ZG_NCCL(ncclGroupStart());
    ZG_NCCL(ncclAllReduce(sum, sum, kSum, ncclFloat32, ncclSum, comm, other));
    ZG_NCCL(ncclGroupEnd());
    wait_stream(stream, "grouped all-gather");
    wait_stream(other, "grouped all-reduces");
    heartbeat();
    expect_gathered(b, n, "grouped-with-nccl-op");
    std::vector<float> got(kSum);
    ZG_CUDA(cudaMemcpy(got.data(), sum, kSum * sizeof(float), cudaMemcpyDeviceToHost));
    for (float v : got)
      if (v != ranks_sum * static_cast<float>(n)) {
        report("grouped-with-nccl-op: all-reduces gave " + std::to_string(v) + ", not " +
               std::to_string(ranks_sum * static_cast<float>(n)));
        ok = false;
        break;
      }
  }
  const uint64_t routed = ce_route_calls() - before;
  printf("ce-route case=grouped-with-nccl-op rank=%d routed=%llu/%d\n", rank,
         static_cast<unsigned long long>(routed), kRounds);
  if (routed != kRounds) {
    report("grouped-with-nccl-op: " + std::to_string(routed) + " of " + std::to_string(kRounds) +
           " grouped all-gathers took the copy-engine route");
    ok = false;
  }
  ZG_CUDA(cudaFree(sum));
  ZG_CUDA(cudaStreamDestroy(other));
  return ok;
}

int ce_route_rank(const RankContext& ctx) {
  const int rank = ctx.rank, n = ctx.nranks;
  ncclComm_t comm = init_comm(ctx, InitKind::kInitRankConfig, 0);
  cudaStream_t stream;
  ZG_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const size_t bytes = static_cast<size_t>(env_long("ZCTEST_CE_ROUTE_BYTES", 24 << 20)) + 4;
  Buffers b = make_buffers(bytes, rank, n, 0xce01);
  bool ok = true;

  // Warm-up: prepares the route and imports the peers' buffers (outside the measured windows).
  ZG_NCCL(ncclAllGather(b.send, b.recv, b.count, ncclFloat32, comm, stream));
  wait_stream(stream, "warm-up");
  expect_gathered(b, n, "warm-up");

  ZG_CUDA(cudaMemset(b.recv, kPoison, b.chunk * n));
  ok &= check_window("out-of-place", rank, 3, stream, [&] {
    for (int i = 0; i < 3; ++i)
      ZG_NCCL(ncclAllGather(b.send, b.recv, b.count, ncclFloat32, comm, stream));
  });
  expect_gathered(b, n, "out-of-place");

  // In place: my chunk already sits at its slot of recv.
  ZG_CUDA(cudaMemset(b.recv, kPoison, b.chunk * n));
  char* own = static_cast<char*>(b.recv) + rank * b.chunk;
  ZG_CUDA(cudaMemcpy(own, b.inputs[rank].data(), b.chunk, cudaMemcpyHostToDevice));
  ok &= check_window("in-place", rank, 1, stream, [&] {
    ZG_NCCL(ncclAllGather(own, b.recv, b.count, ncclFloat32, comm, stream));
  });
  expect_gathered(b, n, "in-place");

  // The legacy default stream (NCCL 2.28's own CE path fails there).
  ZG_CUDA(cudaMemset(b.recv, kPoison, b.chunk * n));
  ok &= check_window("legacy-stream", rank, 1, cudaStreamLegacy, [&] {
    ZG_NCCL(ncclAllGather(b.send, b.recv, b.count, ncclFloat32, comm, cudaStreamLegacy));
  });
  expect_gathered(b, n, "legacy-stream");

  // Captured into a graph (global mode, as PyTorch captures): the capture is the one routed op,
  // and its three replays launch no kernel either.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ZG_CUDA(cudaMemset(b.recv, kPoison, b.chunk * n));
  ok &= check_window("graph-replay", rank, 1, stream, [&] {
    ZG_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    ZG_NCCL(ncclAllGather(b.send, b.recv, b.count, ncclFloat32, comm, stream));
    ZG_CUDA(cudaStreamEndCapture(stream, &graph));
    ZG_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) ZG_CUDA(cudaGraphLaunch(exec, stream));
  });
  expect_gathered(b, n, "graph-replay");
  ZG_CUDA(cudaGraphExecDestroy(exec));
  ZG_CUDA(cudaGraphDestroy(graph));
  ok &= grouped_with_nccl_ops(comm, rank, n, stream, b);
  free_buffers(&b);

  // cudaMalloc buffers cannot be reached from another process: NCCL runs the op on every rank.
  Buffers plain = make_buffers(bytes, rank, n, 0xce03, /*cumem=*/false);
  ZG_CUDA(cudaMemset(plain.recv, kPoison, plain.chunk * n));
  ok &= check_window("cudaMalloc", rank, 0, stream, [&] {
    ZG_NCCL(ncclAllGather(plain.send, plain.recv, plain.count, ncclFloat32, comm, stream));
  });
  expect_gathered(plain, n, "cudaMalloc");
  free_buffers(&plain);

  // Positive control: CUPTI must see a kernel we launch ourselves.
  cupti_begin_window();
  launch_noop_kernel(stream);
  ZG_CUDA(cudaGetLastError());
  wait_stream(stream, "control kernel");
  if (cupti_end_window().kernels < 1) {
    report("CUPTI did not record the control kernel: kernel counts cannot be trusted");
    ok = false;
  }

  if (getenv("ZCTEST_CE_TRACE") != nullptr) {
    probe_local_copy_engine(rank);
    const size_t tb = static_cast<size_t>(env_long("ZCTEST_CE_TRACE_BYTES", 256 << 20));
    const int ops = static_cast<int>(env_long("ZCTEST_CE_TRACE_OPS", 4));
    Buffers t = make_buffers(tb, rank, n, 0xce02);
    ZG_NCCL(ncclAllGather(t.send, t.recv, t.count, ncclFloat32, comm, stream));
    wait_stream(stream, "trace warm-up");
    barrier();
    cupti_begin_window();
    for (int i = 0; i < ops; ++i)
      ZG_NCCL(ncclAllGather(t.send, t.recv, t.count, ncclFloat32, comm, stream));
    wait_stream(stream, "traced all-gathers");
    write_trace(cupti_end_window(), rank, t.chunk, ops);
    expect_gathered(t, n, "traced all-gathers");
    free_buffers(&t);
  }

  ZG_CUDA(cudaStreamDestroy(stream));
  ZG_NCCL(ncclCommDestroy(comm));
  printf("[rank %d] zerocta stats: %s\n", rank, shim_allgather_stats_line().c_str());
  return ok ? 0 : 1;
}

TEST(CeRoute, LaunchesNoKernels) {
  ZG_REQUIRE_GPUS(2);
  // The parent never loads NCCL, so ask the shim through the environment the ranks inherit.
  if (getenv("LD_PRELOAD") == nullptr || strstr(getenv("LD_PRELOAD"), "libzerocta") == nullptr)
    GTEST_SKIP() << "libzerocta.so is not in LD_PRELOAD: no copy-engine route to check";
  // Set before any rank calls NCCL; the library reads its configuration once.
  setenv("ZEROCTA_ALLGATHER", "zerocta", 1);
  RunOptions options = default_run_options(300);
  options.before_cuda = [](int) { cupti_start(); };
  const int nranks = static_cast<int>(env_long("ZCTEST_CE_ROUTE_RANKS", 2));
  RunResult result = run_ranks(nranks, ce_route_rank, options);
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace zgpu
