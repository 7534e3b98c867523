// Randomized all-gather soak for the shim's copy-engine route.
//
// Every iteration all ranks draw the same shape from a shared RNG: a byte count per rank
// (log-uniform so that the total output spans 1 B .. ZCTEST_SOAK_MAX_BYTES, 512 MiB by
// default, with many odd values), one of NCCL's 12 datatypes, and whether the iteration is a
// single call, a group of 2-3 all-gathers, or a CUDA graph capturing 1-3 all-gathers that is
// replayed 3 times with fresh input before each replay. Each rank then makes its own local
// choices from its own RNG — in-place or not, the stream (legacy default stream,
// cudaStreamPerThread, a blocking or a non-blocking user stream) and pointer offsets that
// misalign buffers by 1..255 bytes — which the shim's routing must not depend on.
//
// Inputs are hash patterns filled on the device; outputs are poisoned first. Each result is
// compared on the device with the known pattern, with the result of the same operation
// through pncclAllGather (NCCL's own path, the shim does not export it), and guard bytes
// around the output must keep their poison. Waits have a deadline, so a hang fails.
//
//   ZCTEST_SOAK_ITERS (200)  ZCTEST_SOAK_SEED (1)  ZCTEST_SOAK_NRANKS (all GPUs, max 8)
//   ZCTEST_SOAK_MAX_BYTES (512 MiB)  ZCTEST_SOAK_TIMEOUT_S  ZCTEST_OP_TIMEOUT_S (60)
//   ZCTEST_SOAK_EXPECT_CE=1: fail unless the shim counted all-gathers on a copy-engine route
//   ZCTEST_SOAK_DELAY_RANK=R: rank R delays each of its all-gathers by 0..2 ms (a spinning
//     one-thread kernel on the op's stream), so its peers wait on its flags and reuse slots
//     while it lags
//   ZCTEST_SOAK_VERBOSE=1: print every iteration's plan
//   ZCTEST_SOAK_ALLOC=cumem|cudamalloc|mixed|fabric (cumem): the all-gather buffers as PyTorch's
//     expandable segments hand them out (exportable cuMem in 20 MiB pieces, so a large op spans
//     several allocations; what zerocta's route reaches across processes), plain cudaMalloc
//     (unreachable from another process: every op goes to NCCL), or cudaMalloc on rank 0 only
//     (one rank without expandable segments: the op's route then depends on who arrives first),
//     or cumem exportable as FABRIC handles only (PyTorch's segments on an IMEX node; skipped
//     where this machine cannot make such memory)
//   ZCTEST_SOAK_REALLOC_EVERY=N (50): every N iterations the buffers are freed and allocated
//     anew, so they move and the peers' imports of the old ones must go (0: never)
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cumem_buffer.h"
#include "gpu_gtest.h"
#include "gpu_kernels.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "soak_common.h"
#include "test_data.h"

namespace zgpu {
namespace {

constexpr size_t kGuard = 256;
constexpr size_t kAlign = 256;
constexpr size_t kMaxOffset = 255;
constexpr int kMaxOps = 3;
constexpr int kReplays = 3;
constexpr int kMaxReports = 20;

enum class IterKind { kSingle, kGroup, kGraph };
const char* iter_name(IterKind k) {
  return k == IterKind::kSingle ? "single" : k == IterKind::kGroup ? "group" : "graph";
}

struct OpPlan {
  // Shared by all ranks.
  ncclDataType_t dt = ncclInt8;
  size_t count = 0;     // elements per rank
  size_t per_rank = 0;  // bytes per rank
  // Local to this rank.
  bool in_place = false;
  StreamKind stream = StreamKind::kNonBlocking;
  size_t out_offset = 0;   // misalignment of the output inside its region
  size_t send_offset = 0;  // misalignment of the out-of-place input
  // Layout: byte offsets of this op's region in the recv/ref buffers and in the send buffer.
  size_t region = 0;
  size_t send_region = 0;
  int nranks = 0;
  size_t total() const { return per_rank * static_cast<size_t>(nranks); }
};

struct IterPlan {
  IterKind kind = IterKind::kSingle;
  bool graph_grouped = false;  // the captured all-gathers sit in one ncclGroup
  std::vector<OpPlan> ops;
};

// Counters a rank leaves for the parent in its shared block.
struct SoakResult {
  uint64_t iterations;
  uint64_t ops;
  uint64_t mismatches;
  uint64_t route_calls[zerocta_route_count];
  int shim_loaded;
  char skipped[256];  // why this rank did not run (FABRIC memory unavailable), "" when it ran
};

enum class SoakAlloc { kCumem, kCudaMalloc, kMixed, kFabric };

struct Config {
  long iters;
  uint64_t seed;
  size_t max_total;
  int nranks;
  SoakAlloc alloc;
  long realloc_every;
};

SoakAlloc read_alloc() {
  const char* v = getenv("ZCTEST_SOAK_ALLOC");
  const std::string s = v ? v : "cumem";
  if (s == "cudamalloc") return SoakAlloc::kCudaMalloc;
  if (s == "mixed") return SoakAlloc::kMixed;
  if (s == "fabric") return SoakAlloc::kFabric;
  if (s != "cumem") fprintf(stderr, "soak: ZCTEST_SOAK_ALLOC=%s unknown, using cumem\n", s.c_str());
  return SoakAlloc::kCumem;
}

Config read_config() {
  Config c;
  c.iters = env_long("ZCTEST_SOAK_ITERS", 200);
  c.seed = static_cast<uint64_t>(env_long("ZCTEST_SOAK_SEED", 1));
  c.max_total = static_cast<size_t>(env_long("ZCTEST_SOAK_MAX_BYTES", 512L << 20));
  c.nranks = static_cast<int>(
      env_long("ZCTEST_SOAK_NRANKS", std::min(8, std::max(2, visible_gpu_count()))));
  c.alloc = read_alloc();
  c.realloc_every = env_long("ZCTEST_SOAK_REALLOC_EVERY", 50);
  return c;
}

class Soak {
 public:
  Soak(const RankContext& ctx, const Config& cfg)
      : ctx_(ctx),
        cfg_(cfg),
        shared_rng_(seed_of({cfg.seed, 0x5AA5})),
        local_rng_(seed_of({cfg.seed, 0x10CA1, static_cast<uint64_t>(ctx.rank)})) {
    comm_ = init_comm(ctx, InitKind::kInitRankConfig);
    ZG_CUDA(cudaStreamCreateWithFlags(&verify_stream_, cudaStreamNonBlocking));
    // Whatever the split into ops, the regions fit: sum of totals <= max_total plus per-op
    // offsets, guards and alignment.
    const size_t slack = kMaxOps * (kMaxOffset + kGuard + 2 * kAlign);
    out_capacity_ = cfg.max_total + slack;
    send_capacity_ = cfg.max_total / static_cast<size_t>(ctx.nranks) + slack;
    allocate_user_buffers();
    ZG_CUDA(cudaMalloc(&ref_, out_capacity_));
    ZG_CUDA(cudaMalloc(&counts_, sizeof(VerifyCounts) * kMaxOps));
  }

  ~Soak() {
    if (std::uncaught_exceptions() > 0) return;  // possibly hung GPU: leave it to _exit
    free_user_buffers();
    cudaFree(ref_);
    cudaFree(counts_);
    cudaStreamDestroy(verify_stream_);
    if (comm_) ncclCommDestroy(comm_);
  }

  int run() {
    const auto start = std::chrono::steady_clock::now();
    if (ctx_.rank == 0) {
      printf("soak: seed=%llu iterations=%ld nranks=%d max_total_bytes=%zu nccl=%d zerocta=%s\n",
             static_cast<unsigned long long>(cfg_.seed), cfg_.iters, ctx_.nranks, cfg_.max_total,
             real_nccl_version(), shim_get_stats() ? "yes" : "no");
      fflush(stdout);
    }
    for (long it = 0; it < cfg_.iters; ++it) {
      IterPlan plan = make_plan();
      if (env_long("ZCTEST_SOAK_VERBOSE", 0) != 0) {
        for (size_t j = 0; j < plan.ops.size(); ++j) {
          printf("[rank %d] %s\n", ctx_.rank, describe(it, plan, j, -1).c_str());
        }
        fflush(stdout);
      }
      if (plan.kind == IterKind::kGraph) {
        run_graph(it, plan);
      } else {
        run_eager(it, plan);
      }
      ++iterations_;
      if (cfg_.realloc_every > 0 && (it + 1) % cfg_.realloc_every == 0) {
        // Every op of the iteration has been checked, so nothing of it still runs.
        free_user_buffers();
        allocate_user_buffers();
      }
      publish_counts();  // so the parent has them even if a later iteration kills the rank
      heartbeat();
      if (ctx_.rank == 0 && (it + 1) % 1000 == 0) {
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        printf("soak: progress iteration=%ld ops=%llu mismatches=%llu elapsed=%.0fs\n", it + 1,
               static_cast<unsigned long long>(ops_), static_cast<unsigned long long>(mismatches_),
               secs);
        fflush(stdout);
      }
    }
    check_comm_async(comm_, "end of soak");
    ZG_NCCL(ncclCommDestroy(comm_));
    comm_ = nullptr;
    publish();
    printf("[rank %d] soak: iterations=%llu ops=%llu mismatches=%llu\n", ctx_.rank,
           static_cast<unsigned long long>(iterations_), static_cast<unsigned long long>(ops_),
           static_cast<unsigned long long>(mismatches_));
    const std::string stats = shim_allgather_stats_line();
    if (!stats.empty()) printf("[rank %d] zerocta stats: %s\n", ctx_.rank, stats.c_str());
    fflush(stdout);
    return mismatches_ == 0 ? 0 : 1;
  }

 private:
  // The buffers the all-gathers read and write (ref_, NCCL's reference output, stays put).
  SoakMemory user_memory() const {
    if (cfg_.alloc == SoakAlloc::kFabric) return SoakMemory::kCumemFabric;
    if (cfg_.alloc == SoakAlloc::kCudaMalloc || (cfg_.alloc == SoakAlloc::kMixed && ctx_.rank == 0))
      return SoakMemory::kCudaMalloc;
    return SoakMemory::kCumem;
  }
  void allocate_user_buffers() {
    recv_ = soak_alloc(user_memory(), out_capacity_);
    send_ = soak_alloc(user_memory(), send_capacity_);
  }
  void free_user_buffers() {
    soak_free(user_memory(), recv_);
    soak_free(user_memory(), send_);
    recv_ = send_ = nullptr;
  }

  // One op whose total output may not exceed `cap`.
  void draw_size(OpPlan& op, size_t cap) {
    op.count = draw_soak_count(shared_rng_, cap, dtype_size(op.dt), ctx_.nranks);
    op.per_rank = op.count * dtype_size(op.dt);
    op.nranks = ctx_.nranks;
  }

  IterPlan make_plan() {
    IterPlan plan;
    // Shared choices first, all from shared_rng_ in the same order on every rank.
    const double kind = shared_rng_.uniform();
    plan.kind = kind < 0.06 ? IterKind::kGraph : kind < 0.18 ? IterKind::kGroup : IterKind::kSingle;
    int nops = 1;
    if (plan.kind == IterKind::kGroup) nops = 2 + static_cast<int>(shared_rng_.below(2));
    if (plan.kind == IterKind::kGraph) {
      nops = 1 + static_cast<int>(shared_rng_.below(3));
      plan.graph_grouped = nops > 1 && shared_rng_.chance(0.5);
    }
    plan.ops.resize(static_cast<size_t>(nops));
    for (auto& op : plan.ops) {
      op.dt = static_cast<ncclDataType_t>(shared_rng_.below(ncclNumTypes));
      draw_size(op, cfg_.max_total / static_cast<size_t>(nops));
    }
    // Local choices.
    const bool graph = plan.kind == IterKind::kGraph;
    const StreamKind graph_stream =
        local_rng_.chance(0.5) ? StreamKind::kNonBlocking : StreamKind::kBlocking;
    size_t region = 0, send_region = 0;
    for (auto& op : plan.ops) {
      op.in_place = local_rng_.chance(0.5);
      op.stream = graph ? graph_stream : static_cast<StreamKind>(local_rng_.below(4));
      op.out_offset = local_rng_.chance(0.25) ? 1 + local_rng_.below(kMaxOffset) : 0;
      op.send_offset = local_rng_.chance(0.25) ? 1 + local_rng_.below(kMaxOffset) : 0;
      op.region = region;
      region = align_up(region + op.out_offset + op.total() + kGuard, kAlign);
      op.send_region = send_region;
      send_region = align_up(send_region + op.send_offset + op.per_rank, kAlign);
    }
    if (region > out_capacity_ || send_region > send_capacity_) {
      fail("soak plan does not fit its buffers (test bug)");
    }
    return plan;
  }

  cudaStream_t stream_of(StreamKind k) const { return streams_.get(k); }

  uint8_t* out_ptr(const OpPlan& op, bool ref) const {
    return static_cast<uint8_t*>(ref ? ref_ : recv_) + op.region + op.out_offset;
  }
  const uint8_t* send_ptr(const OpPlan& op, bool ref) const {
    if (op.in_place) return out_ptr(op, ref) + static_cast<size_t>(ctx_.rank) * op.per_rank;
    return static_cast<uint8_t*>(send_) + op.send_region + op.send_offset;
  }

  // Poisons the output regions (with guards) and writes this rank's fresh input.
  void prepare(const OpPlan& op, uint64_t seed) {
    cudaStream_t s = stream_of(op.stream);
    const size_t region_bytes = op.out_offset + op.total() + kGuard;
    for (int ref = 0; ref < 2; ++ref) {
      uint8_t* base = static_cast<uint8_t*>(ref ? ref_ : recv_) + op.region;
      ZG_CUDA(cudaMemsetAsync(base, kPoison, region_bytes, s));
    }
    if (op.in_place) {
      for (int ref = 0; ref < 2; ++ref) {
        fill_pattern(const_cast<uint8_t*>(send_ptr(op, ref != 0)), op.per_rank, seed, ctx_.rank, s);
      }
    } else {
      fill_pattern(const_cast<uint8_t*>(send_ptr(op, false)), op.per_rank, seed, ctx_.rank, s);
    }
    ZG_CUDA(cudaGetLastError());
  }

  // Issues the ops through the public symbols (ref=false) or pnccl (ref=true), grouped when
  // asked. In a group, results are returned by the group end.
  void issue(const IterPlan& plan, bool ref, bool grouped, const std::string& what) {
    if (grouped) ZG_NCCL(ref ? pncclGroupStart() : ncclGroupStart());
    for (const auto& op : plan.ops) {
      if (!ref && delay_rank_ == ctx_.rank)
        launch_delay(static_cast<unsigned>(mix64(++delays_) % 2000), stream_of(op.stream));
      const ncclResult_t res = ref ? pncclAllGather(send_ptr(op, true), out_ptr(op, true), op.count,
                                                    op.dt, comm_, stream_of(op.stream))
                                   : ncclAllGather(send_ptr(op, false), out_ptr(op, false),
                                                   op.count, op.dt, comm_, stream_of(op.stream));
      if (res != ncclSuccess) {
        fail(what + (ref ? ": pncclAllGather" : ": ncclAllGather") + " returned " +
             ncclGetErrorString(res) + "; last error: " + ncclGetLastError(comm_));
      }
    }
    if (grouped) {
      const ncclResult_t res = ref ? pncclGroupEnd() : ncclGroupEnd();
      if (res != ncclSuccess) {
        fail(what + (ref ? ": pncclGroupEnd" : ": ncclGroupEnd") + " returned " +
             ncclGetErrorString(res) + "; last error: " + ncclGetLastError(comm_));
      }
    }
  }

  void wait_ops(const IterPlan& plan, const std::string& what) {
    bool waited[kStreamKinds] = {};
    for (const auto& op : plan.ops) {
      const int k = static_cast<int>(op.stream);
      if (waited[k]) continue;
      waited[k] = true;
      wait_stream(stream_of(op.stream), what + " (stream " + stream_name(op.stream) + ")");
    }
  }

  void run_eager(long it, const IterPlan& plan) {
    const std::string what = describe(it, plan, 0, -1);
    std::vector<uint64_t> seeds;
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      seeds.push_back(seed_of({cfg_.seed, static_cast<uint64_t>(it), j, 0}));
      prepare(plan.ops[j], seeds[j]);
    }
    const bool grouped = plan.kind == IterKind::kGroup;
    issue(plan, false, grouped, what);
    issue(plan, true, grouped, what);
    ops_ += plan.ops.size();
    wait_ops(plan, what);
    verify(it, plan, seeds, -1);
  }

  void run_graph(long it, const IterPlan& plan) {
    const std::string what = describe(it, plan, 0, -1);
    cudaStream_t s = stream_of(plan.ops[0].stream);
    // Captured work must not start before earlier work on other streams is done.
    ZG_CUDA(cudaDeviceSynchronize());
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ZG_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      issue(plan, false, plan.graph_grouped, what + " (capture)");
    } catch (...) {
      cudaStreamEndCapture(s, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    ZG_CUDA(cudaStreamEndCapture(s, &graph));
    ZG_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < kReplays; ++replay) {
      std::vector<uint64_t> seeds;
      for (size_t j = 0; j < plan.ops.size(); ++j) {
        seeds.push_back(
            seed_of({cfg_.seed, static_cast<uint64_t>(it), j, static_cast<uint64_t>(replay + 1)}));
        prepare(plan.ops[j], seeds[j]);
      }
      ZG_CUDA(cudaGraphLaunch(exec, s));
      issue(plan, true, plan.graph_grouped, what + " (reference)");
      ops_ += plan.ops.size();
      wait_ops(plan, what + " replay " + std::to_string(replay));
      verify(it, plan, seeds, replay);
    }
    ZG_CUDA(cudaGraphExecDestroy(exec));
    ZG_CUDA(cudaGraphDestroy(graph));
  }

  void verify(long it, const IterPlan& plan, const std::vector<uint64_t>& seeds, int replay) {
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      const OpPlan& op = plan.ops[j];
      VerifyCounts* c = counts_ + j;
      reset_verify_counts(c, verify_stream_);
      verify_allgather(out_ptr(op, false), out_ptr(op, true), op.per_rank, ctx_.nranks, seeds[j], c,
                       verify_stream_);
      uint8_t* base = static_cast<uint8_t*>(recv_) + op.region;
      verify_guard(base, op.out_offset, kPoison, 0, c, verify_stream_);
      verify_guard(base + op.out_offset + op.total(), kGuard, kPoison, op.out_offset + op.total(),
                   c, verify_stream_);
      ZG_CUDA(cudaGetLastError());
    }
    std::vector<VerifyCounts> host(plan.ops.size());
    ZG_CUDA(cudaMemcpyAsync(host.data(), counts_, sizeof(VerifyCounts) * host.size(),
                            cudaMemcpyDeviceToHost, verify_stream_));
    wait_stream(verify_stream_, describe(it, plan, 0, replay) + " (verification)");
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      const VerifyCounts& c = host[j];
      const OpPlan& op = plan.ops[j];
      if (c.bad_expected || c.bad_ref) {
        ++mismatches_;
        const size_t at = c.bad_expected ? c.first_bad_expected : c.first_bad_ref;
        mismatch(it, plan, j, replay, seeds[j], at,
                 std::to_string(c.bad_expected) + " bytes differ from the expected input, " +
                     std::to_string(c.bad_ref) + " from pncclAllGather's result");
      }
      if (c.bad_guard) {
        ++mismatches_;
        report_limited("MISMATCH " + describe(it, plan, j, replay) + ": " +
                       std::to_string(c.bad_guard) +
                       " guard bytes around the output were overwritten, first at region offset " +
                       std::to_string(c.first_bad_guard) + " (output starts at " +
                       std::to_string(op.out_offset) + ")");
      }
      if (c.bad_ref_expected) {
        // NCCL's own path was wrong: not the shim's fault, but the run cannot be trusted.
        ++mismatches_;
        report_limited("REFERENCE WRONG " + describe(it, plan, j, replay) +
                       ": pncclAllGather result differs from the expected input in " +
                       std::to_string(c.bad_ref_expected) + " bytes, first at " +
                       std::to_string(c.first_bad_ref_expected));
      }
    }
  }

  void mismatch(long it, const IterPlan& plan, size_t j, int replay, uint64_t seed, size_t at,
                const std::string& what) {
    const OpPlan& op = plan.ops[j];
    uint8_t got[8] = {}, ref[8] = {}, want[8] = {};
    const size_t n = std::min<size_t>(8, op.total() - at);
    cudaMemcpy(got, out_ptr(op, false) + at, n, cudaMemcpyDeviceToHost);
    cudaMemcpy(ref, out_ptr(op, true) + at, n, cudaMemcpyDeviceToHost);
    const int src = static_cast<int>(at / op.per_rank);
    for (size_t i = 0; i < n; ++i) {
      const size_t pos = at + i;
      want[i] = pattern_byte(seed, static_cast<int>(pos / op.per_rank), pos % op.per_rank);
    }
    report_limited("MISMATCH " + describe(it, plan, j, replay) + ": " + what +
                   "; first differing offset " + std::to_string(at) + " (from rank " +
                   std::to_string(src) + ", byte " + std::to_string(at % op.per_rank) + ") got " +
                   bytes_at(got, n, 0) + " pnccl " + bytes_at(ref, n, 0) + " want " +
                   bytes_at(want, n, 0));
  }

  void report_limited(const std::string& msg) {
    if (++reports_ <= kMaxReports) report(msg);
  }

  std::string describe(long it, const IterPlan& plan, size_t j, int replay) const {
    const OpPlan& op = plan.ops[j];
    char buf[512];
    snprintf(buf, sizeof(buf),
             "iteration=%ld kind=%s%s op=%zu/%zu replay=%d rank=%d bytes_per_rank=%zu "
             "dtype=%s count=%zu in_place=%d stream=%s out_offset=%zu send_offset=%zu",
             it, iter_name(plan.kind), plan.graph_grouped ? "(grouped)" : "", j + 1,
             plan.ops.size(), replay, ctx_.rank, op.per_rank, dtype_name(op.dt), op.count,
             op.in_place ? 1 : 0, stream_name(op.stream), op.out_offset, op.send_offset);
    return buf;
  }

  void publish_counts() {
    auto* out = static_cast<SoakResult*>(rank_shared_block(ctx_.rank));
    out->iterations = iterations_;
    out->ops = ops_;
    out->mismatches = mismatches_;
  }

  void publish() {
    publish_counts();
    auto* out = static_cast<SoakResult*>(rank_shared_block(ctx_.rank));
    GetStatsFn get = shim_get_stats();
    out->shim_loaded = get != nullptr;
    zerocta_stats_t stats{};
    if (get != nullptr && get(&stats) == 0) {
      for (int r = 0; r < zerocta_route_count; ++r) {
        out->route_calls[r] = stats.counters[zerocta_op_allgather][r].calls;
      }
    }
  }

  RankContext ctx_;
  Config cfg_;
  SoakRng shared_rng_;
  SoakRng local_rng_;
  ncclComm_t comm_ = nullptr;
  SoakStreams streams_;
  const long delay_rank_ = env_long("ZCTEST_SOAK_DELAY_RANK", -1);
  uint64_t delays_ = 0;
  cudaStream_t verify_stream_ = nullptr;
  void* recv_ = nullptr;
  void* ref_ = nullptr;
  void* send_ = nullptr;
  VerifyCounts* counts_ = nullptr;
  size_t out_capacity_ = 0;
  size_t send_capacity_ = 0;
  uint64_t iterations_ = 0;
  uint64_t ops_ = 0;
  uint64_t mismatches_ = 0;
  int reports_ = 0;
};

static_assert(sizeof(SoakResult) <= kRankSharedBlockBytes, "result must fit the shared block");

TEST(AllGatherSoak, Randomized) {
  const Config cfg = read_config();
  ZG_REQUIRE_GPUS(cfg.nranks);
  if (cfg.nranks < 2) GTEST_SKIP() << "needs at least 2 ranks";
  RunOptions options = default_run_options(static_cast<int>(600 + 2 * cfg.iters));
  options.total_timeout_s =
      static_cast<int>(env_long("ZCTEST_SOAK_TIMEOUT_S", options.total_timeout_s));
  RunResult result = run_ranks(
      cfg.nranks,
      [&cfg](const RankContext& ctx) {
        // Checked in the ranks: the parent must not start CUDA before it forks them.
        if (cfg.alloc == SoakAlloc::kFabric) {
          const std::string why = fabric_unavailable();
          auto* mine = static_cast<SoakResult*>(rank_shared_block(ctx.rank));
          snprintf(mine->skipped, sizeof mine->skipped, "%s", why.c_str());
          if (!why.empty()) return 0;
        }
        Soak soak(ctx, cfg);
        return soak.run();
      },
      options);
  if (const char* why = static_cast<const SoakResult*>(rank_shared_block(0))->skipped; why[0])
    GTEST_SKIP() << why;
  uint64_t mismatches = 0;
  const auto* r0 = static_cast<const SoakResult*>(rank_shared_block(0));
  for (int r = 0; r < cfg.nranks; ++r) {
    mismatches += static_cast<const SoakResult*>(rank_shared_block(r))->mismatches;
  }
  printf("soak: iterations=%llu ops=%llu mismatches=%llu\n",
         static_cast<unsigned long long>(r0->iterations), static_cast<unsigned long long>(r0->ops),
         static_cast<unsigned long long>(mismatches));
  uint64_t ce_calls = 0;
  if (r0->shim_loaded) {
    printf("soak: zerocta all-gather calls by route on rank 0:");
    for (int r = 0; r < zerocta_route_count; ++r) {
      printf(" %s=%llu", shim_route_name(r).c_str(),
             static_cast<unsigned long long>(r0->route_calls[r]));
      if (r != zerocta_route_passthrough) ce_calls += r0->route_calls[r];
    }
    printf("\n");
  }
  fflush(stdout);
  EXPECT_TRUE(result.ok()) << result.summary();
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(static_cast<long>(r0->iterations), cfg.iters);
  if (env_long("ZCTEST_SOAK_EXPECT_CE", 0) != 0) {
    EXPECT_TRUE(r0->shim_loaded) << "ZCTEST_SOAK_EXPECT_CE=1 but the shim is not loaded";
    EXPECT_GT(ce_calls, 0u) << "the shim routed no all-gather to a copy-engine route";
  }
}

}  // namespace
}  // namespace zgpu
