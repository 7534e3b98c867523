// Communicator churn: cycles of ncclCommInitRankConfig / one all-gather / ncclCommDestroy on
// two ranks must not leak. With the shim and ZEROCTA_ALLGATHER=zerocta (set by the test;
// ZCTEST_CYCLES_ALLGATHER overrides) every cycle joins a channel in /dev/shm, allocates and
// exports an arena, maps the peer's at its all-gather and frees all of it in ncclCommDestroy
// (src/comms/route_setup.h). Without the shim the same test measures NCCL alone.
//
// Host RSS (/proc/self/statm, after malloc_trim), GPU memory in use (cudaMemGetInfo: total -
// free), open file descriptors, threads and zerocta entries in /dev/shm are sampled on every rank
// after cycle 10 (warm-up: first-use caches, the fd service's thread) and after the last one; the
// test fails if memory grew by more than ZCTEST_CYCLES_MAX_GROWTH_MIB (64) on any rank, if
// descriptors, threads or /dev/shm entries grew at all, if any all-gather was wrong, or (with the
// shim) if a cycle went without its route or the route memory gauge does not return to 0.
//
//   ZCTEST_CYCLES             cycles (default 1000; unset, the count is lowered to what fits
//                             ZCTEST_CYCLES_BUDGET_S (150), but not below 100, once the
//                             first 10 cycles have been timed)
//   ZCTEST_CYCLES_BYTES       all-gather bytes per rank (32M)
//   ZCTEST_CYCLES_DESTROY_LAG  0 (default): each cycle destroys its communicator before the
//                             next starts. N > 0: a second thread destroys them, up to N behind
//                             the cycle that creates the next one (how a program that tears
//                             process groups down in the background churns; NCCL's destroy is
//                             most of a cycle). Memory is sampled with nothing pending.
#include <cuda_runtime.h>
#include <dirent.h>
#include <malloc.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>

#include "cumem_buffer.h"
#include "gpu_gtest.h"
#include "gpu_kernels.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

constexpr int kRanks = 2;
constexpr long kWarmupCycles = 10;
constexpr long kDefaultCycles = 1000;
constexpr long kMinAdaptedCycles = 100;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Knobs {
  long cycles = env_long("ZCTEST_CYCLES", -1);  // -1: default, adapted to the budget
  long budget_s = env_long("ZCTEST_CYCLES_BUDGET_S", 150);
  size_t per_rank = static_cast<size_t>(env_long("ZCTEST_CYCLES_BYTES", 32L << 20));
  long max_growth_mib = env_long("ZCTEST_CYCLES_MAX_GROWTH_MIB", 64);
  long destroy_lag = env_long("ZCTEST_CYCLES_DESTROY_LAG", 0);
  std::string allgather =
      getenv("ZCTEST_CYCLES_ALLGATHER") ? getenv("ZCTEST_CYCLES_ALLGATHER") : "zerocta";
};

// Per rank, in its shared block. Rank 0's block also carries the id of the next cycle's
// communicator and the agreed cycle count.
struct CycleReport {
  ncclUniqueId next_id;  // rank 0 only
  int64_t target;        // rank 0 only: cycles to run (agreed after the warm-up)
  int64_t cycles_done;
  int64_t rss_warm, rss_end, gpu_warm, gpu_end;  // bytes
  int64_t fds_warm, fds_end, threads_warm, threads_end, shm_warm, shm_end;
  int64_t init_ns, allgather_ns, destroy_ns;  // sums over the cycles
  int64_t wall_ns;                            // the whole loop
  uint64_t bad_bytes;
  int32_t shim;
  uint64_t ce_calls, passthrough_calls, comms_ce_ready, pool_bytes_end;
};
static_assert(sizeof(CycleReport) <= kRankSharedBlockBytes, "report must fit the shared block");
CycleReport* report_of(int rank) { return static_cast<CycleReport*>(rank_shared_block(rank)); }

// Resident memory after glibc gave back what its arenas hold free: memory freed but kept for
// reuse is not a leak, and with destroys on a second thread (its own arena) it varied run to run
// by tens of MiB, with or without the library (docs/RELIABILITY.md).
int64_t rss_bytes() {
  malloc_trim(0);
  std::ifstream statm("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(statm >> size >> resident)) fail("cannot read /proc/self/statm");
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// Entries of a /proc directory (fds, tasks) or zerocta entries of /dev/shm.
int64_t count_entries(const char* dir, const char* prefix = "") {
  int64_t n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.' && strncmp(e->d_name, prefix, strlen(prefix)) == 0) ++n;
    closedir(d);
  }
  return n;
}

int64_t gpu_used_bytes() {
  ZG_CUDA(cudaDeviceSynchronize());
  size_t free_b = 0, total_b = 0;
  ZG_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(total_b - free_b);
}

// Destroys communicators: at once (lag 0) or on its own thread, at most `lag` behind.
class Destroyer {
 public:
  explicit Destroyer(long lag) : lag_(lag) {
    if (lag_ > 0) thread_ = std::thread([this] { loop(); });
  }
  ~Destroyer() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void destroy(ncclComm_t comm) {
    if (lag_ <= 0) return timed_destroy(comm);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return static_cast<long>(queue_.size()) < lag_; });
    queue_.push_back(comm);
    cv_.notify_all();
  }
  // Waits until every handed-over communicator is destroyed.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }
  int64_t destroy_ns() const { return destroy_ns_.load(); }

 private:
  void timed_destroy(ncclComm_t comm) {
    const int64_t t0 = now_ns();
    ZG_NCCL(ncclCommDestroy(comm));
    destroy_ns_ += now_ns() - t0;
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      ncclComm_t comm = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      timed_destroy(comm);
      heartbeat();
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }
  const long lag_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ncclComm_t> queue_;
  bool busy_ = false, stop_ = false;
  std::atomic<int64_t> destroy_ns_{0};
  std::thread thread_;
};

// Rank 0 lowers the default count to what fits the budget once it knows a cycle's cost.
int64_t adapted_target(const Knobs& k, int64_t warm_ns) {
  const double per_cycle_s = static_cast<double>(warm_ns) / 1e9 / kWarmupCycles;
  const long fits = kWarmupCycles + static_cast<long>(k.budget_s / std::max(per_cycle_s, 1e-3));
  const long target = std::max(kMinAdaptedCycles, std::min(kDefaultCycles, fits));
  printf(
      "cycles: %.0f ms per cycle over the first %ld; running %ld cycles (default %ld, "
      "ZCTEST_CYCLES_BUDGET_S=%ld, at least %ld)\n",
      per_cycle_s * 1e3, kWarmupCycles, target, kDefaultCycles, k.budget_s, kMinAdaptedCycles);
  fflush(stdout);
  return target;
}

int cycles_rank(const RankContext& ctx, const Knobs& k) {
  CycleReport* me = report_of(ctx.rank);
  CycleReport* r0 = report_of(0);
  if (ctx.rank == 0) r0->target = k.cycles > 0 ? k.cycles : kDefaultCycles;
  cudaStream_t stream = nullptr;
  void *send = nullptr, *recv = nullptr;
  VerifyCounts* counts = nullptr;
  ZG_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Exportable cuMem memory (as PyTorch's expandable segments): the route reaches it from the
  // other process, so every cycle imports the peer's buffers and drops them at the destroy.
  send = cumem_alloc(k.per_rank);
  recv = cumem_alloc(k.per_rank * ctx.nranks);
  ZG_CUDA(cudaMalloc(&counts, sizeof(VerifyCounts)));
  const int64_t start = now_ns();
  Destroyer destroyer(k.destroy_lag);
  for (long c = 0;; ++c) {
    if (ctx.rank == 0 && c < r0->target) ZG_NCCL(ncclGetUniqueId(&r0->next_id));
    barrier();  // publishes next_id and target
    if (c >= r0->target) break;
    const ncclUniqueId id = r0->next_id;
    const uint64_t seed = seed_of({0xC1C1E, static_cast<uint64_t>(c)});
    fill_pattern(send, k.per_rank, seed, ctx.rank, stream);
    ZG_CUDA(cudaMemsetAsync(recv, kPoison, k.per_rank * ctx.nranks, stream));
    ZG_CUDA(cudaStreamSynchronize(stream));

    const int64_t t0 = now_ns();
    ncclComm_t comm = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ZG_NCCL(ncclCommInitRankConfig(&comm, ctx.nranks, id, ctx.rank, &config));
    const int64_t t1 = now_ns();
    ZG_NCCL(ncclAllGather(send, recv, k.per_rank, ncclUint8, comm, stream));
    wait_stream(stream, "cycle " + std::to_string(c) + " all-gather");
    const int64_t t2 = now_ns();
    reset_verify_counts(counts, stream);
    verify_allgather(recv, nullptr, k.per_rank, ctx.nranks, seed, counts, stream);
    VerifyCounts v{};
    ZG_CUDA(cudaMemcpyAsync(&v, counts, sizeof v, cudaMemcpyDeviceToHost, stream));
    ZG_CUDA(cudaStreamSynchronize(stream));
    me->bad_bytes += v.bad_expected;
    check_comm_async(comm, "cycle " + std::to_string(c));
    destroyer.destroy(comm);
    me->init_ns += t1 - t0;
    me->allgather_ns += t2 - t1;
    me->cycles_done = c + 1;
    heartbeat();
    if (c + 1 == kWarmupCycles) {
      destroyer.drain();
      me->rss_warm = rss_bytes();
      me->gpu_warm = gpu_used_bytes();
      me->fds_warm = count_entries("/proc/self/fd");
      me->threads_warm = count_entries("/proc/self/task");
      me->shm_warm = count_entries("/dev/shm", "zerocta-");
      if (ctx.rank == 0 && k.cycles <= 0) r0->target = adapted_target(k, now_ns() - start);
    }
  }
  destroyer.drain();
  // Every rank's last communicator is gone before anyone samples: a peer's import of this
  // rank's route memory keeps it allocated until the peer destroys its communicator.
  barrier();
  me->destroy_ns = destroyer.destroy_ns();
  me->wall_ns = now_ns() - start;
  me->rss_end = rss_bytes();
  me->gpu_end = gpu_used_bytes();
  me->fds_end = count_entries("/proc/self/fd");
  me->threads_end = count_entries("/proc/self/task");
  me->shm_end = count_entries("/dev/shm", "zerocta-");
  GetStatsFn get = shim_get_stats();
  zerocta_stats_t s{};
  me->shim = get != nullptr;
  if (get != nullptr && get(&s) == 0) {
    me->ce_calls = s.counters[zerocta_op_allgather][zerocta_route_ce].calls;
    me->passthrough_calls = s.counters[zerocta_op_allgather][zerocta_route_passthrough].calls;
    me->comms_ce_ready = s.comms_ce_ready;
    me->pool_bytes_end = s.pool_bytes;
  }
  cumem_free(send);
  cumem_free(recv);
  cudaFree(counts);
  cudaStreamDestroy(stream);
  return me->bad_bytes == 0 ? 0 : 1;
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

TEST(CommCycles, InitAllGatherDestroyDoesNotLeak) {
  ZG_REQUIRE_GPUS(kRanks);
  const Knobs k;
  RunOptions o = default_run_options(static_cast<int>(k.budget_s + 240));
  if (k.cycles > 0) o.total_timeout_s = std::max<int>(o.total_timeout_s, 120 + 3 * k.cycles);
  o.idle_timeout_s = 45;  // one cycle never takes that long: a hung cycle fails in time
  o.before_cuda = [k](int) { setenv("ZEROCTA_ALLGATHER", k.allgather.c_str(), 1); };
  RunResult result = run_ranks(
      kRanks, [&k](const RankContext& ctx) { return cycles_rank(ctx, k); }, o);
  const int64_t limit = k.max_growth_mib << 20;
  bool pass = result.ok();
  for (int rank = 0; rank < kRanks; ++rank) {
    const CycleReport& r = *report_of(rank);
    const long n = static_cast<long>(r.cycles_done);
    const int64_t rss_growth = r.rss_end - r.rss_warm, gpu_growth = r.gpu_end - r.gpu_warm;
    const long measured = n - kWarmupCycles;
    const double per_cycle_kib =
        measured > 0 ? static_cast<double>(std::max(rss_growth, gpu_growth)) / 1024 / measured : 0;
    const bool route_ok = !r.shim || (k.allgather != "zerocta" && k.allgather != "auto") ||
                          (r.comms_ce_ready == static_cast<uint64_t>(n) &&
                           r.ce_calls == static_cast<uint64_t>(n) && r.pool_bytes_end == 0);
    const bool handles_flat =
        r.fds_end <= r.fds_warm && r.threads_end <= r.threads_warm && r.shm_end <= r.shm_warm;
    const bool ok = n > kWarmupCycles && rss_growth <= limit && gpu_growth <= limit &&
                    r.bad_bytes == 0 && route_ok && handles_flat;
    pass = pass && ok;
    printf(
        "RELIABILITY cycles rank=%d cycles=%ld route=%s destroy_lag=%ld ms_per_cycle=%.1f "
        "(init %.1f, all-gather %.1f, destroy %.1f) rss_MiB at_cycle_%ld=%.1f end=%.1f growth=%.1f "
        "gpu_used_MiB at_cycle_%ld=%.1f end=%.1f growth=%.1f (limit %ld) "
        "largest_growth_per_cycle=%.1fKiB comms_with_pool=%llu pool_bytes_at_end=%llu "
        "bad_bytes=%llu fds=%lld->%lld threads=%lld->%lld shm_entries=%lld->%lld\n",
        rank, n,
        !r.shim          ? "nccl(no shim)"
        : r.ce_calls > 0 ? "zerocta-ce"
                         : "passthrough",
        k.destroy_lag, n > 0 ? static_cast<double>(r.wall_ns) / 1e6 / n : 0,
        n > 0 ? static_cast<double>(r.init_ns) / 1e6 / n : 0,
        n > 0 ? static_cast<double>(r.allgather_ns) / 1e6 / n : 0,
        n > 0 ? static_cast<double>(r.destroy_ns) / 1e6 / n : 0, kWarmupCycles, mib(r.rss_warm),
        mib(r.rss_end), mib(rss_growth), kWarmupCycles, mib(r.gpu_warm), mib(r.gpu_end),
        mib(gpu_growth), k.max_growth_mib, per_cycle_kib,
        static_cast<unsigned long long>(r.comms_ce_ready),
        static_cast<unsigned long long>(r.pool_bytes_end),
        static_cast<unsigned long long>(r.bad_bytes), static_cast<long long>(r.fds_warm),
        static_cast<long long>(r.fds_end), static_cast<long long>(r.threads_warm),
        static_cast<long long>(r.threads_end), static_cast<long long>(r.shm_warm),
        static_cast<long long>(r.shm_end));
    EXPECT_TRUE(handles_flat) << "rank " << rank
                              << ": descriptors, threads or /dev/shm entries grew";
    EXPECT_GT(n, kWarmupCycles) << "rank " << rank << " did not get past the warm-up";
    EXPECT_LE(rss_growth, limit) << "rank " << rank << ": host memory grew";
    EXPECT_LE(gpu_growth, limit) << "rank " << rank << ": GPU memory grew";
    EXPECT_EQ(r.bad_bytes, 0u) << "rank " << rank << ": an all-gather was wrong";
    EXPECT_TRUE(route_ok) << "rank " << rank << ": with the shim every cycle needs its own pool "
                          << "(comms_with_pool=" << r.comms_ce_ready << ", ce_calls=" << r.ce_calls
                          << ", pool_bytes_at_end=" << r.pool_bytes_end << ")";
  }
  printf("RELIABILITY cycles verdict=%s\n", pass ? "PASS" : "FAIL");
  fflush(stdout);
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace zgpu
