// Faults on the GPU: nothing hangs and nothing is corrupted when a peer dies, when the
// application aborts a communicator with zerocta's operations queued, or when ranks disagree on
// what an op is (captured on one rank, eager on the other). Two ranks, run with the multi-process
// harness; the ranks set ZEROCTA_ALLGATHER themselves (ZCTEST_FAULT_ALLGATHER, default zerocta),
// so with LD_PRELOAD=libzerocta.so every all-gather takes zerocta's copy-engine route, and without
// it the same test measures NCCL alone (a baseline).
//
//   FaultKill.PeerKilledMidStream   rank 1 SIGKILLs itself after issuing op N of a stream of
//       all-gathers; rank 0's watchdog thread aborts the communicator when no op completed
//       for ZCTEST_FAULT_STALL_S or ncclCommGetAsyncError reports an error. Rank 0's stream
//       must drain, and rank 0 exit, within ZCTEST_FAULT_BOUND_S of the kill.
//   FaultAbort.AbortReleasesQueuedOps   rank 1 sleeps while rank 0's all-gathers wait for
//       it; a second thread on rank 0 calls ncclCommAbort. Rank 0's stream must drain within
//       ZCTEST_FAULT_ABORT_BOUND_S; then rank 1 issues its side, aborts too, and drains. Guard
//       bytes around every output must keep their poison (no stray copy), and both exit 0.
//   FaultAbort.AbortReleasesWaitingGraphReplays   the same with the all-gathers queued as
//       replays of a graph captured in global mode (captured on the route: the abort releases
//       the replays' waits and keeps what they address mapped until the graph goes).
//   Capture.DiscardedAndRetriedOnOneRank   rank 0 discards a capture and captures again, rank 1
//       captures once; both replay, then run eager all-gathers. Rank 1's captured op can never
//       pair: an error on every rank (ncclRemoteError or ncclInvalidUsage), never a hang and
//       never a wrong result passed off as right.
//   Capture.EagerOnOneRankCapturedOnTheOther   the same kind of error when rank 0 runs an
//       all-gather eagerly where rank 1 captures it.
//   Channel.*   ranks that cannot meet: rank 1 without the shim's work (ZEROCTA_ENABLE=0), or
//       in another channel directory (as if on another host): pass-through, no hang.
//   ConfigMismatch.*   ZEROCTA_ALLGATHER differing across ranks (zerocta vs nccl, off vs
//       auto): no hang, every rank passes through, a WARN from the rank that asked for the
//       route; nccl on every rank: no WARN.
//
// Every test prints one "RELIABILITY <test> ... verdict=PASS|FAIL" line for the summary of
// run_reliability.sh. Knobs: ZCTEST_FAULT_BYTES (64M total output per all-gather),
// ZCTEST_FAULT_OPS (200), ZCTEST_FAULT_KILL_AFTER (20), ZCTEST_FAULT_STALL_S (5),
// ZCTEST_FAULT_BOUND_S (30), ZCTEST_FAULT_ABORT_BOUND_S (10).
#include <cuda_runtime.h>
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cumem_buffer.h"
#include "gpu_gtest.h"
#include "gpu_kernels.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

constexpr int kRanks = 2;
constexpr int kWindow = 4;          // all-gathers in flight per rank
constexpr size_t kGuard = 1 << 16;  // poisoned bytes before and after each output

// steady_clock is CLOCK_MONOTONIC: its readings compare across the ranks' processes.
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
double seconds_between(int64_t from_ns, int64_t to_ns) {
  return from_ns > 0 && to_ns > 0 ? static_cast<double>(to_ns - from_ns) / 1e9 : -1.0;
}
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

struct Knobs {
  size_t op_bytes = static_cast<size_t>(env_long("ZCTEST_FAULT_BYTES", 64L << 20));
  long ops = env_long("ZCTEST_FAULT_OPS", 200);
  long kill_after = env_long("ZCTEST_FAULT_KILL_AFTER", 20);
  long stall_s = env_long("ZCTEST_FAULT_STALL_S", 5);
  long bound_s = env_long("ZCTEST_FAULT_BOUND_S", 30);
  long abort_bound_s = env_long("ZCTEST_FAULT_ABORT_BOUND_S", 10);
  std::string allgather =
      getenv("ZCTEST_FAULT_ALLGATHER") ? getenv("ZCTEST_FAULT_ALLGATHER") : "zerocta";
};

// What a rank leaves in its shared block (times are now_ns() readings, 0 = never). The fields
// another rank polls while this one runs are atomics (the block is shared memory).
struct Report {
  std::atomic<int64_t> death_ns;  // rank 1 of FaultKill: just before SIGKILL
  int64_t last_progress_ns;       // last time an all-gather was seen complete
  int64_t abort_start_ns, abort_end_ns, drained_ns;
  int64_t completed, issued;  // all-gathers
  int32_t abort_result;       // ncclResult_t of ncclCommAbort
  int32_t stream_status;      // cudaError_t once drained
  char stream_status_name[48];  // its name, taken in the rank: a CUDA call in the parent would
                                // initialize CUDA there and break the next test's forked ranks
  int32_t abort_reason;       // 1 = no progress, 2 = asynchronous error
  int32_t shim;               // libzerocta.so is loaded
  uint64_t ce_calls, passthrough_calls;
  uint64_t bad_guard, bad_data;
  std::atomic<int32_t> peer_may_go;  // FaultAbort: rank 0 aborted (rank 1 may go); rank 1 done
  int32_t off_lines;                 // agreement tests: "copy-engine all-gather off" WARN lines
  int32_t reason_ok;                 // agreement tests: the line names the expected reason
  uint64_t comms_ce_ready;
  int32_t error_seen;  // Capture: the error this rank saw (0 = none)
};
static_assert(sizeof(Report) <= kRankSharedBlockBytes, "report must fit the shared block");
Report* report_of(int rank) { return static_cast<Report*>(rank_shared_block(rank)); }

void note_stats(Report* r) {
  GetStatsFn get = shim_get_stats();
  zerocta_stats_t s{};
  r->shim = get != nullptr;
  if (get == nullptr || get(&s) != 0) return;
  r->ce_calls = s.counters[zerocta_op_allgather][zerocta_route_ce].calls;
  r->passthrough_calls = s.counters[zerocta_op_allgather][zerocta_route_passthrough].calls;
  r->comms_ce_ready = s.comms_ce_ready;
}

// A stream of all-gathers with at most kWindow in flight, one event per op to see progress,
// outputs surrounded by poisoned guards.
class Gathers {
 public:
  Gathers(ncclComm_t comm, const RankContext& ctx, size_t total_bytes)
      : comm_(comm), rank_(ctx.rank), nranks_(ctx.nranks) {
    per_rank_ = total_bytes / static_cast<size_t>(nranks_);
    ZG_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // Exportable cuMem memory, as PyTorch's expandable segments: the route reaches it from the
    // other process (cudaMalloc memory would send every all-gather to NCCL).
    send_ = cumem_alloc(per_rank_);
    recv_ = cumem_alloc(per_rank_ * nranks_ + 2 * kGuard);
    ZG_CUDA(cudaMalloc(&counts_, sizeof(VerifyCounts)));
    for (cudaEvent_t& e : events_) ZG_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ZG_CUDA(cudaMemsetAsync(recv_, kPoison, per_rank_ * nranks_ + 2 * kGuard, stream_));
    fill_pattern(send_, per_rank_, kSeed, rank_, stream_);
    ZG_CUDA(cudaStreamSynchronize(stream_));
  }
  // After an abort the device may be in any state: free nothing, the process exits anyway.
  ~Gathers() = default;

  // Issues all-gather number `issued()`; false (and the NCCL result in *res) when refused.
  bool issue(ncclResult_t* res) {
    *res = ncclAllGather(send_, out(), per_rank_, ncclUint8, comm_, stream_);
    if (*res != ncclSuccess) return false;
    ZG_CUDA(cudaEventRecord(events_[issued_ % kWindow], stream_));
    ++issued_;
    return true;
  }
  // Advances over completed all-gathers (in order) and returns how many completed.
  long completed() {
    while (done_ < issued_) {
      cudaError_t q = cudaEventQuery(events_[done_ % kWindow]);
      if (q == cudaErrorNotReady) break;
      if (q != cudaSuccess) {
        error_ = q;
        break;
      }
      ++done_;
    }
    return done_;
  }
  // Issues the same all-gather as a CUDA graph replay: captured once (global capture mode, as
  // PyTorch captures), then launched.
  bool issue_replay(ncclResult_t* res) {
    if (exec_ == nullptr) {
      cudaGraph_t graph = nullptr;
      ZG_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
      *res = ncclAllGather(send_, out(), per_rank_, ncclUint8, comm_, stream_);
      ZG_CUDA(cudaStreamEndCapture(stream_, &graph));
      if (*res != ncclSuccess) return false;
      ZG_CUDA(cudaGraphInstantiate(&exec_, graph, 0));
    }
    ZG_CUDA(cudaGraphLaunch(exec_, stream_));
    ZG_CUDA(cudaEventRecord(events_[issued_ % kWindow], stream_));
    ++issued_;
    return true;
  }
  // Captures one all-gather into a graph and throws the graph away, launching nothing; returns
  // what ncclAllGather returned.
  ncclResult_t capture_and_discard() {
    cudaGraph_t graph = nullptr;
    ZG_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
    const ncclResult_t res = ncclAllGather(send_, out(), per_rank_, ncclUint8, comm_, stream_);
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (graph) ZG_CUDA(cudaGraphDestroy(graph));
    if (res == ncclSuccess) ZG_CUDA(end);
    cudaGetLastError();
    return res;
  }
  long issued() const { return issued_; }
  bool window_open() { return completed() > issued_ - kWindow; }
  cudaError_t event_error() const { return error_; }

  // cudaSuccess/an error once everything queued on the stream finished; NotReady before.
  cudaError_t query() { return cudaStreamQuery(stream_); }

  // Checks the output against every rank's pattern and the guards; returns bad bytes.
  uint64_t verify(uint64_t* bad_guard) {
    reset_verify_counts(counts_, stream_);
    verify_allgather(out(), nullptr, per_rank_, nranks_, kSeed, counts_, stream_);
    verify_guard(recv_, kGuard, kPoison, 0, counts_, stream_);
    verify_guard(static_cast<char*>(out()) + per_rank_ * nranks_, kGuard, kPoison, 0, counts_,
                 stream_);
    VerifyCounts c{};
    ZG_CUDA(cudaMemcpyAsync(&c, counts_, sizeof c, cudaMemcpyDeviceToHost, stream_));
    ZG_CUDA(cudaStreamSynchronize(stream_));
    *bad_guard = c.bad_guard;
    return c.bad_expected;
  }
  // Only the guards (after an abort the output itself is undefined).
  uint64_t verify_guards_only() {
    reset_verify_counts(counts_, stream_);
    verify_guard(recv_, kGuard, kPoison, 0, counts_, stream_);
    verify_guard(static_cast<char*>(out()) + per_rank_ * nranks_, kGuard, kPoison, 0, counts_,
                 stream_);
    VerifyCounts c{};
    if (cudaMemcpyAsync(&c, counts_, sizeof c, cudaMemcpyDeviceToHost, stream_) != cudaSuccess ||
        cudaStreamSynchronize(stream_) != cudaSuccess)
      return UINT64_MAX;  // the context is unusable; the caller reports it
    return c.bad_guard;
  }

 private:
  static constexpr uint64_t kSeed = 0xFA17;
  void* out() const { return static_cast<char*>(recv_) + kGuard; }

  ncclComm_t comm_;
  int rank_, nranks_;
  size_t per_rank_ = 0;
  cudaStream_t stream_ = nullptr;
  void* send_ = nullptr;
  void* recv_ = nullptr;
  VerifyCounts* counts_ = nullptr;
  cudaEvent_t events_[kWindow] = {};
  long issued_ = 0, done_ = 0;
  cudaError_t error_ = cudaSuccess;
  cudaGraphExec_t exec_ = nullptr;
};

// One all-gather, waited for and checked: the route works before any fault is injected.
void warm_up(Gathers& g, const std::string& what) {
  ncclResult_t res = ncclSuccess;
  if (!g.issue(&res)) fail(what + ": warm-up ncclAllGather returned " + ncclGetErrorString(res));
  const int64_t deadline = now_ns() + static_cast<int64_t>(op_timeout_s() * 1e9);
  while (g.completed() < g.issued()) {
    if (g.event_error() != cudaSuccess) fail(what + ": warm-up all-gather failed on the device");
    if (now_ns() > deadline) fail(what + ": warm-up all-gather did not complete (hang)");
    sleep_ms(1);
  }
  uint64_t bad_guard = 0;
  if (uint64_t bad = g.verify(&bad_guard); bad != 0 || bad_guard != 0)
    fail(what + ": warm-up all-gather wrong: " + std::to_string(bad) + " bad bytes, " +
         std::to_string(bad_guard) + " guard bytes changed");
}

// Waits until the stream has drained or `deadline_ns` passed; records the time and status.
bool wait_drained(Gathers& g, int64_t deadline_ns, Report* r) {
  for (;;) {
    cudaError_t q = g.query();
    if (q != cudaErrorNotReady) {
      r->drained_ns = now_ns();
      r->stream_status = q;
      snprintf(r->stream_status_name, sizeof(r->stream_status_name), "%s", cudaGetErrorName(q));
      return true;
    }
    if (now_ns() > deadline_ns) return false;
    heartbeat();
    sleep_ms(1);
  }
}

void set_rank_env(const Knobs& k) { setenv("ZEROCTA_ALLGATHER", k.allgather.c_str(), 1); }

RunOptions fault_options(const Knobs& k, int total_s) {
  RunOptions o = default_run_options(total_s);
  o.idle_timeout_s = 0;  // the ranks keep their own deadlines; a killed peer is expected
  o.kill_grace_s = static_cast<int>(k.bound_s + 15);
  o.before_cuda = [k](int) { set_rank_env(k); };
  return o;
}

std::string route_name(const Report& r) {
  if (!r.shim) return "nccl(no shim)";
  return r.ce_calls > 0 ? "zerocta-ce" : "passthrough";
}

// ------------------------------------------------------------------------ FaultKill

// Rank 0 of FaultKill: issue until the peer is gone, abort from a watchdog, drain.
int kill_survivor(ncclComm_t comm, Gathers& g, const Knobs& k) {
  Report* r = report_of(0);
  std::timed_mutex use_mu;  // held while the main thread is inside ncclAllGather
  std::atomic<bool> aborted{false}, stop{false};
  std::atomic<int64_t> last_progress{now_ns()};
  std::thread watchdog([&] {
    while (!stop.load()) {
      sleep_ms(50);
      ncclResult_t async = ncclSuccess;
      const bool error = ncclCommGetAsyncError(comm, &async) == ncclSuccess &&
                         async != ncclSuccess && async != ncclInProgress;
      const bool stalled = now_ns() - last_progress.load() > k.stall_s * 1000000000LL;
      if (!error && !stalled) continue;
      r->abort_reason = error ? 2 : 1;
      // Never abort in the middle of an issue; but never wait on it for long either.
      std::unique_lock<std::timed_mutex> lock(use_mu, std::defer_lock);
      (void)lock.try_lock_for(std::chrono::seconds(2));
      aborted.store(true);
      r->abort_start_ns = now_ns();
      r->abort_result = ncclCommAbort(comm);
      r->abort_end_ns = now_ns();
      return;
    }
  });
  // Whatever throws below, the watchdog is left behind, not destroyed joinable (terminate).
  struct LeaveBehind {
    std::thread& t;
    std::atomic<bool>& stop;
    ~LeaveBehind() {
      stop.store(true);
      if (t.joinable()) t.detach();
    }
  } leave_behind{watchdog, stop};
  const int64_t hard_deadline = now_ns() + (k.bound_s + 60) * 1000000000LL;
  auto note_progress = [&] {
    if (g.completed() <= r->completed) return;
    r->completed = g.completed();
    r->last_progress_ns = now_ns();
    last_progress.store(r->last_progress_ns);
  };
  bool refused = false;
  while (!aborted.load() && !refused && g.issued() < k.ops) {
    note_progress();  // also when the window never closes: completions are progress
    while (!aborted.load() && !g.window_open()) {
      note_progress();
      if (now_ns() > hard_deadline) break;
      heartbeat();
      sleep_ms(1);
    }
    if (now_ns() > hard_deadline) break;
    std::lock_guard<std::timed_mutex> lock(use_mu);
    if (aborted.load()) break;
    ncclResult_t res = ncclSuccess;
    refused = !g.issue(&res);  // a poisoned communicator refuses: stop issuing
    r->issued = g.issued();
  }
  // The drain deadline counts from the kill (rank 1 wrote the time before dying).
  const int64_t death = report_of(1)->death_ns;
  const int64_t deadline = (death > 0 ? death : now_ns()) + k.bound_s * 1000000000LL + 1000000000LL;
  while (!aborted.load() && now_ns() < deadline) sleep_ms(10);
  const bool drained = wait_drained(g, deadline, r);
  stop.store(true);
  if (!aborted.load() || !drained) {
    r->completed = g.completed();
    note_stats(r);
    printf(
        "RELIABILITY kill verdict=FAIL rank=0 %s completed=%lld: no %s within %ld s of the "
        "kill (hang)\n",
        route_name(*r).c_str(), static_cast<long long>(r->completed),
        aborted.load() ? "drained stream" : "abort", k.bound_s);
    fflush(stdout);
    fail("rank 0 hung after its peer was killed");  // _exit: the device may be stuck
  }
  watchdog.join();
  r->completed = g.completed();
  note_stats(r);
  return 0;
}

int kill_rank(const RankContext& ctx, const Knobs& k) {
  ncclComm_t comm = init_comm(ctx, InitKind::kInitRankConfig);
  Gathers g(comm, ctx, k.op_bytes);
  warm_up(g, "FaultKill");
  barrier();
  if (ctx.rank == 0) return kill_survivor(comm, g, k);
  // Rank 1: the same stream, then SIGKILL right after issuing op kill_after (mid-stream: that
  // op and the ones rank 0 issued after it are in flight).
  const int64_t deadline = now_ns() + static_cast<int64_t>(op_timeout_s() * 1e9);
  while (g.issued() <= k.kill_after) {
    while (!g.window_open()) {
      if (now_ns() > deadline) fail("rank 1: all-gathers stopped completing before the kill");
      sleep_ms(1);
    }
    ncclResult_t res = ncclSuccess;
    if (!g.issue(&res))
      fail(std::string("rank 1: ncclAllGather returned ") + ncclGetErrorString(res));
    heartbeat();
  }
  fflush(stdout);
  report_of(1)->death_ns = now_ns();
  raise(SIGKILL);
  return 99;  // not reached
}

TEST(FaultKill, PeerKilledMidStream) {
  ZG_REQUIRE_GPUS(kRanks);
  const Knobs k;
  RunResult result = run_ranks(
      kRanks, [&k](const RankContext& ctx) { return kill_rank(ctx, k); },
      fault_options(k, static_cast<int>(k.bound_s + 180)));
  const int64_t ended = now_ns();
  const Report& r0 = *report_of(0);
  const Report& r1 = *report_of(1);
  const double stall_to_abort = seconds_between(r0.last_progress_ns, r0.abort_start_ns);
  const double abort_call = seconds_between(r0.abort_start_ns, r0.abort_end_ns);
  const double abort_to_drained = seconds_between(r0.abort_end_ns, r0.drained_ns);
  const double kill_to_drained = seconds_between(r1.death_ns, r0.drained_ns);
  const double kill_to_exit = seconds_between(r1.death_ns, ended);
  const bool rank1_killed = !result.ranks[1].exited && result.ranks[1].signal == SIGKILL &&
                            result.ranks[1].killed_because.empty();
  const bool pass = rank1_killed && result.ranks[0].ok() && r0.abort_end_ns > 0 &&
                    r0.drained_ns > 0 && kill_to_drained >= 0 && kill_to_drained <= k.bound_s &&
                    kill_to_exit <= k.bound_s + 5;
  printf(
      "RELIABILITY kill route=%s bytes=%zu completed=%lld issued=%lld kill_after=%ld "
      "abort_reason=%s no_progress_to_abort=%.2fs abort_call=%.2fs abort_to_drained=%.2fs "
      "kill_to_drained=%.2fs kill_to_rank0_exit=%.2fs (bound %lds) abort_result=%d "
      "stream=%s verdict=%s\n",
      route_name(r0).c_str(), k.op_bytes, static_cast<long long>(r0.completed),
      static_cast<long long>(r0.issued), k.kill_after,
      r0.abort_reason == 2   ? "async-error"
      : r0.abort_reason == 1 ? "no-progress"
                             : "none",
      stall_to_abort, abort_call, abort_to_drained, kill_to_drained, kill_to_exit, k.bound_s,
      r0.abort_result, r0.stream_status_name,
      pass ? "PASS" : "FAIL");
  fflush(stdout);
  EXPECT_TRUE(rank1_killed) << "rank 1 should have died by its own SIGKILL\n" << result.summary();
  EXPECT_TRUE(result.ranks[0].ok()) << result.summary();
  EXPECT_GT(r0.abort_end_ns, 0) << "ncclCommAbort never returned";
  EXPECT_GE(kill_to_drained, 0.0);
  EXPECT_LE(kill_to_drained, static_cast<double>(k.bound_s));
  EXPECT_LE(kill_to_exit, static_cast<double>(k.bound_s + 5)) << "rank 0 exited late";
  EXPECT_GE(r0.completed, k.kill_after - kWindow) << "the stream was not running before the kill";
  if (r0.shim && k.allgather == "zerocta") {
    EXPECT_GT(r0.ce_calls, 0u) << "the copy-engine route was not taken: nothing was tested";
  }
}

// ------------------------------------------------------------------------ FaultAbort

// Runs ncclCommAbort on a thread of its own; false when it did not return by `deadline_ns`.
bool abort_from_thread(ncclComm_t comm, Report* r, int64_t deadline_ns) {
  // Shared with the thread: it may outlive this function when abort hangs.
  auto returned = std::make_shared<std::atomic<bool>>(false);
  r->abort_start_ns = now_ns();
  std::thread t([comm, r, returned] {
    r->abort_result = ncclCommAbort(comm);
    r->abort_end_ns = now_ns();
    returned->store(true);
  });
  while (!returned->load() && now_ns() < deadline_ns) sleep_ms(1);
  if (!returned->load()) {
    t.detach();  // the rank fails and _exits; the thread goes with it
    return false;
  }
  t.join();
  return true;
}

// `graph`: the queued all-gathers are replays of a captured graph rather than eager ops.
int abort_rank(const RankContext& ctx, const Knobs& k, bool graph) {
  ncclComm_t comm = init_comm(ctx, InitKind::kInitRankConfig);
  Gathers g(comm, ctx, k.op_bytes);
  warm_up(g, "FaultAbort");
  barrier();
  Report* r = report_of(ctx.rank);
  const int64_t bound = k.abort_bound_s * 1000000000LL;
  if (ctx.rank == 1) {
    // Delay the matching ops until rank 0 has aborted (or a minute passed).
    const int64_t give_up = now_ns() + 60 * 1000000000LL;
    while (!report_of(0)->peer_may_go && now_ns() < give_up) {
      heartbeat();
      sleep_ms(10);
    }
  }
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < kWindow; ++i) {
    if (graph ? g.issue_replay(&res) : g.issue(&res)) continue;
    // Rank 1 issues after its peer aborted: NCCL may already refuse (asynchronous error).
    if (ctx.rank == 0) fail(std::string("ncclAllGather returned ") + ncclGetErrorString(res));
    break;
  }
  r->issued = g.issued();
  if (ctx.rank == 0) {
    sleep_ms(1000);
    if (g.query() != cudaErrorNotReady)
      fail("rank 0's all-gathers completed without rank 1: nothing was blocked, nothing tested");
  } else {
    // Rank 0's released copies may or may not have satisfied these; either way, abort.
    const int64_t until = now_ns() + 2 * 1000000000LL;
    while (g.query() == cudaErrorNotReady && now_ns() < until) sleep_ms(1);
  }
  if (!abort_from_thread(comm, r, now_ns() + bound))
    fail("ncclCommAbort did not return within " + std::to_string(k.abort_bound_s) + " s");
  const bool drained = wait_drained(g, r->abort_start_ns + bound, r);
  r->completed = g.completed();
  note_stats(r);
  if (!drained) {
    printf("RELIABILITY abort verdict=FAIL rank=%d stream not drained %ld s after ncclCommAbort\n",
           ctx.rank, k.abort_bound_s);
    fflush(stdout);
    fail("the stream did not drain after ncclCommAbort (hang)");
  }
  r->bad_guard = r->stream_status == cudaSuccess ? g.verify_guards_only() : UINT64_MAX;
  r->peer_may_go = 1;  // rank 0: rank 1 may issue now; rank 1: finished
  if (ctx.rank == 0) {
    // Stay alive (communicator aborted) until rank 1 is done: the test is about the aborts,
    // not about a peer process exiting under rank 1's feet.
    const int64_t give_up = now_ns() + 60 * 1000000000LL;
    while (!report_of(1)->peer_may_go && now_ns() < give_up) {
      heartbeat();
      sleep_ms(10);
    }
  }
  return r->bad_guard == 0 ? 0 : 1;
}

void run_abort(bool graph) {
  ZG_REQUIRE_GPUS(kRanks);
  const Knobs k;
  RunResult result = run_ranks(
      kRanks, [&k, graph](const RankContext& ctx) { return abort_rank(ctx, k, graph); },
      fault_options(k, static_cast<int>(2 * k.abort_bound_s + 150)));
  bool pass = result.ok();
  for (int rank = 0; rank < kRanks; ++rank) {
    const Report& r = *report_of(rank);
    const double drain = seconds_between(r.abort_start_ns, r.drained_ns);
    pass = pass && drain >= 0 && drain <= k.abort_bound_s && r.bad_guard == 0;
    printf(
        "RELIABILITY abort rank=%d route=%s queued=%lld abort_call=%.2fs "
        "abort_to_drained=%.2fs (bound %lds) abort_result=%d stream=%s guard_bytes_changed=%s\n",
        rank, route_name(r).c_str(), static_cast<long long>(r.issued),
        seconds_between(r.abort_start_ns, r.abort_end_ns), drain, k.abort_bound_s, r.abort_result,
        r.stream_status_name,
        r.bad_guard == UINT64_MAX ? "unknown(context unusable)"
                                  : std::to_string(r.bad_guard).c_str());
    EXPECT_GE(drain, 0.0) << "rank " << rank << " never drained";
    EXPECT_LE(drain, static_cast<double>(k.abort_bound_s)) << "rank " << rank;
    EXPECT_EQ(r.bad_guard, 0u) << "rank " << rank << ": bytes outside the output were written";
  }
  printf("RELIABILITY abort%s verdict=%s\n", graph ? "-graph" : "", pass ? "PASS" : "FAIL");
  fflush(stdout);
  EXPECT_TRUE(result.ok()) << result.summary();
  if (report_of(0)->shim && k.allgather == "zerocta") {
    EXPECT_GT(report_of(0)->ce_calls, 0u) << "the copy-engine route was not taken";
  }
}

TEST(FaultAbort, AbortReleasesQueuedOps) { run_abort(false); }

// The same with the all-gathers queued as replays of a captured graph: the replay's waits are
// released too, and the memory it uses stays mapped (no fault after the abort).
TEST(FaultAbort, AbortReleasesWaitingGraphReplays) { run_abort(true); }

// ------------------------------------------------------------------------ Capture

// Waits for every issued all-gather (eager or replayed) unless an error is reported first (failed
// on the device, or by ncclCommGetAsyncError: r->error_seen); a success must be bitwise right.
// Never waits longer than the op timeout.
void settle_or_error(Gathers& g, ncclComm_t comm, Report* r, const std::string& what) {
  const int64_t deadline = now_ns() + static_cast<int64_t>(op_timeout_s() * 1e9);
  while (g.completed() < g.issued() && r->error_seen == 0) {
    if (g.event_error() != cudaSuccess) fail(what + ": failed on the device");
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress)
      r->error_seen = async;
    if (now_ns() > deadline) fail(what + ": did not complete and no error was reported (hang)");
    heartbeat();
    sleep_ms(1);
  }
  ncclResult_t async = ncclSuccess;
  if (r->error_seen == 0 && ncclCommGetAsyncError(comm, &async) == ncclSuccess &&
      async != ncclSuccess && async != ncclInProgress)
    r->error_seen = async;
  uint64_t bad_guard = 0;
  // Released waits may leave any bytes in the output; guards must hold either way.
  if (r->error_seen == 0) {
    if (uint64_t bad = g.verify(&bad_guard); bad != 0 || bad_guard != 0)
      fail(what + ": " + std::to_string(bad) + " bad bytes reported as success");
  } else if (g.verify_guards_only() != 0) {
    fail(what + ": bytes outside the output changed");
  }
}

// Issues eager all-gathers until one is refused or `ops` ran, then settles them.
void eager_until_error(Gathers& g, ncclComm_t comm, int ops, Report* r, const std::string& what) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < ops && r->error_seen == 0; ++i)
    if (!g.issue(&res)) r->error_seen = res;
  settle_or_error(g, comm, r, what);
}

// Rank 0 captures an all-gather, discards the graph and captures it again; rank 1 captures
// once. Both replay their graph twice, then run eager all-gathers. Rank 1's op can never pair
// with rank 0's discarded one: its replays are released and reported as an error (on the
// route; NCCL alone does not survive this), on every rank, never a hang and never a wrong
// result passed off as right.
int capture_retry_rank(const RankContext& ctx) {
  ncclComm_t comm = init_comm(ctx, InitKind::kInitRankConfig);
  Gathers g(comm, ctx, Knobs().op_bytes);
  warm_up(g, "Capture");
  if (ctx.rank == 0 && g.capture_and_discard() != ncclSuccess) fail("the first capture failed");
  Report* r = report_of(ctx.rank);
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < 2 && r->error_seen == 0; ++i)
    if (!g.issue_replay(&res)) r->error_seen = res;
  settle_or_error(g, comm, r, "graph replays");
  eager_until_error(g, comm, 3, r, "eager all-gathers after the replays");
  note_stats(r);
  ncclCommAbort(comm);
  return 0;
}

// Rank 1 captures an all-gather (and never replays it) where rank 0 runs it eagerly.
int eager_vs_captured_rank(const RankContext& ctx) {
  ncclComm_t comm = init_comm(ctx, InitKind::kInitRankConfig);
  Gathers g(comm, ctx, Knobs().op_bytes);
  warm_up(g, "EagerVsCaptured");
  Report* r = report_of(ctx.rank);
  if (ctx.rank == 1) {
    if (ncclResult_t e = g.capture_and_discard(); e != ncclSuccess) r->error_seen = e;
    eager_until_error(g, comm, 1, r, "eager all-gather after the capture");
  } else {
    eager_until_error(g, comm, 2, r, "eager all-gathers");
  }
  note_stats(r);
  ncclCommAbort(comm);
  return 0;
}

// An ncclResult_t's name, without calling NCCL: the parent must not (the shim would read its
// settings there, and every rank forked after would inherit them instead of its own).
const char* result_name(int r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    default: return "another error";
  }
}

void run_disagreement(const char* name, int (*rank_fn)(const RankContext&)) {
  ZG_REQUIRE_GPUS(kRanks);
  const Knobs k;
  RunResult result = run_ranks(kRanks, rank_fn, fault_options(k, 180));
  const Report& r0 = *report_of(0);
  const Report& r1 = *report_of(1);
  const bool routed = r0.shim && k.allgather == "zerocta";
  const bool both_errors = r0.error_seen != 0 && r1.error_seen != 0;
  const bool pass = result.ok() && (!routed || both_errors);
  printf("RELIABILITY %s route=%s error_rank0=%s error_rank1=%s verdict=%s\n", name,
         route_name(r0).c_str(), result_name(r0.error_seen), result_name(r1.error_seen),
         pass ? "PASS" : "FAIL");
  fflush(stdout);
  EXPECT_TRUE(result.ok()) << result.summary();
  if (routed) {
    EXPECT_TRUE(both_errors) << "the disagreement must be an error on every rank";
  }
}

TEST(Capture, DiscardedAndRetriedOnOneRank) {
  run_disagreement("capture-retry", capture_retry_rank);
}

TEST(Capture, EagerOnOneRankCapturedOnTheOther) {
  run_disagreement("eager-vs-captured", eager_vs_captured_rank);
}

// ------------------------------------------------------------------------ Agreement

// The rank's stderr goes to a file, so that zerocta's WARN lines can be counted; the file is
// copied back to the real stderr at the end.
std::string stderr_file(pid_t parent, int rank) {
  return "/tmp/zerocta-pool-oom-" + std::to_string(parent) + "-rank" + std::to_string(rank) +
         ".log";
}
int g_saved_stderr = -1;

void capture_stderr(int rank) {
  const int fd =
      open(stderr_file(getppid(), rank).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  g_saved_stderr = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  close(fd);
}

std::string release_stderr(int rank) {
  fflush(stderr);
  std::ifstream in(stderr_file(getppid(), rank));
  std::stringstream text;
  text << in.rdbuf();
  if (g_saved_stderr >= 0) {
    dup2(g_saved_stderr, STDERR_FILENO);
    close(g_saved_stderr);
    g_saved_stderr = -1;
  }
  unlink(stderr_file(getppid(), rank).c_str());
  fputs(text.str().c_str(), stderr);
  return text.str();
}

// A configuration under which every rank must agree on pass-through: the environment each
// rank sets for itself, the reason the WARN lines must give (nullptr: no WARN at all, the
// configuration simply asks for no route), and how many ranks say it (each rank that asked
// for the route, once per process for both communicators).
struct AgreementCase {
  const char* name;  // for the RELIABILITY line
  void (*set_env)(int rank);
  const char* reason;
  int warn_lines;
  int counting_ranks = kRanks;  // ranks whose shim counts their calls (not ZEROCTA_ENABLE=0)
};

int agreement_rank(const RankContext& ctx, const AgreementCase& c) {
  Report* r = report_of(ctx.rank);
  constexpr size_t kPerRank = 8 << 20;
  constexpr int kComms = 2, kOps = 3;
  uint64_t bad = 0, bad_guard = 0;
  for (int i = 0; i < kComms; ++i) {
    ncclComm_t comm = init_comm(ctx, InitKind::kInitRankConfig, i);
    Gathers g(comm, ctx, kPerRank * static_cast<size_t>(ctx.nranks));
    for (int op = 0; op < kOps; ++op) {
      ncclResult_t res = ncclSuccess;
      if (!g.issue(&res)) fail(std::string("ncclAllGather returned ") + ncclGetErrorString(res));
      const int64_t deadline = now_ns() + static_cast<int64_t>(op_timeout_s() * 1e9);
      while (g.query() == cudaErrorNotReady) {
        if (now_ns() > deadline) fail("all-gather did not complete (hang)");
        sleep_ms(1);
      }
      uint64_t guard = 0;
      bad += g.verify(&guard);
      bad_guard += guard;
    }
    check_comm_async(comm, c.name);
    ZG_NCCL(ncclCommDestroy(comm));
  }
  note_stats(r);
  r->bad_data = bad;
  r->bad_guard = bad_guard;
  const std::string log = release_stderr(ctx.rank);
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("zerocta WARN copy-engine all-gather off") == std::string::npos) continue;
    ++r->off_lines;
    if (c.reason && line.find(c.reason) != std::string::npos) r->reason_ok = 1;
  }
  return bad == 0 && bad_guard == 0 ? 0 : 1;
}

void run_agreement(const AgreementCase& c) {
  ZG_REQUIRE_GPUS(kRanks);
  // A rank that waits for a mismatched peer is a FAIL (ZCTEST_FAULT_AGREE_S, default 240 s).
  RunOptions o = default_run_options(static_cast<int>(env_long("ZCTEST_FAULT_AGREE_S", 240)));
  o.num_ids = 2;
  o.before_cuda = [c](int rank) {
    capture_stderr(rank);
    setenv("ZEROCTA_LOG", "warn", 1);
    c.set_env(rank);
  };
  RunResult result = run_ranks(
      kRanks, [&c](const RankContext& ctx) { return agreement_rank(ctx, c); }, o);
  for (int rank = 0; rank < kRanks; ++rank) {  // a rank that failed left its stderr behind
    const std::string left = stderr_file(getpid(), rank);
    std::ifstream in(left);
    if (in)
      printf("--- stderr of rank %d ---\n%s\n", rank,
             std::string(std::istreambuf_iterator<char>(in), {}).c_str());
    unlink(left.c_str());
  }
  int off_lines = 0;
  bool reason_ok = false;
  uint64_t ce = 0, pass_calls = 0, ready = 0, bad = 0;
  for (int rank = 0; rank < kRanks; ++rank) {
    const Report& r = *report_of(rank);
    off_lines += r.off_lines;
    reason_ok = reason_ok || r.reason_ok;
    ce += r.ce_calls;
    pass_calls += r.passthrough_calls;
    ready += r.comms_ce_ready;
    bad += r.bad_data + r.bad_guard;
  }
  const bool shim = report_of(0)->shim;
  const int want_lines = c.reason ? c.warn_lines : 0;
  const bool pass =
      result.ok() && bad == 0 &&
      (!shim || (off_lines == want_lines && (!c.reason || reason_ok) && ce == 0 && ready == 0));
  printf(
      "RELIABILITY %s shim=%d bad_bytes=%llu ce_calls=%llu passthrough_calls=%llu "
      "comms_ce_ready=%llu warn_lines=%d verdict=%s\n",
      c.name, shim ? 1 : 0, static_cast<unsigned long long>(bad),
      static_cast<unsigned long long>(ce), static_cast<unsigned long long>(pass_calls),
      static_cast<unsigned long long>(ready), off_lines, pass ? "PASS" : "FAIL");
  fflush(stdout);
  EXPECT_TRUE(result.ok()) << result.summary();
  EXPECT_EQ(bad, 0u) << "results differ from the inputs, or bytes outside the output changed";
  if (!shim) return;  // NCCL alone: only the results mean something
  EXPECT_EQ(ce, 0u) << "an all-gather took the copy-engine route without an agreed pool";
  EXPECT_EQ(ready, 0u) << "a route was committed";
  EXPECT_EQ(pass_calls, static_cast<uint64_t>(c.counting_ranks) * 2u * 3u)
      << "every all-gather passes through";
  EXPECT_EQ(off_lines, want_lines) << "the reason is logged once per rank that asked for the "
                                      "route (one line for 2 comms), nothing when none did";
  if (c.reason) {
    EXPECT_TRUE(reason_ok) << "the line should say: " << c.reason;
  }
}

// Rank 1 runs the library disabled (as good as without it): rank 0 finds a GPU here that did
// not join, passes through and says so; rank 1 says nothing.
TEST(Channel, RouteOnOneRankOnly) {
  run_agreement({"route-on-one-rank",
                 [](int rank) {
                   setenv("ZEROCTA_ALLGATHER", "zerocta", 1);
                   if (rank == 1) setenv("ZEROCTA_ENABLE", "0", 1);
                 },
                 "did not join", 1, /*counting_ranks=*/1});
}

// Rank 1 meets in another directory, as a rank on another host would: neither sees the other.
TEST(Channel, RanksThatCannotMeet) {
  run_agreement({"channel-apart",
                 [](int rank) {
                   setenv("ZEROCTA_ALLGATHER", "zerocta", 1);
                   if (rank == 1) {
                     const std::string dir = "/tmp/zerocta-apart-" + std::to_string(getppid());
                     mkdir(dir.c_str(), 0700);
                     setenv("ZEROCTA_CHANNEL_DIR", dir.c_str(), 1);
                   }
                 },
                 "did not join", 2});
}

// ZEROCTA_ALLGATHER differing across ranks (once known issue 6: creation hung). A rank whose
// mode asks for no route never joins the channel; the one that asked finds it missing.
TEST(ConfigMismatch, RouteOnOneRankNcclOnTheOther) {
  run_agreement({"mismatch-zerocta-vs-nccl",
                 [](int rank) { setenv("ZEROCTA_ALLGATHER", rank == 0 ? "zerocta" : "nccl", 1); },
                 "did not join", 1});
}

TEST(ConfigMismatch, AutoOnOneRankOffOnTheOther) {
  run_agreement({"mismatch-off-vs-auto",
                 [](int rank) {
                   setenv("ZEROCTA_ALLGATHER", rank == 0 ? "off" : "auto", 1);
                   setenv("ZEROCTA_MIN_BYTES", "0", 1);
                 },
                 "did not join", 1});
}

// Different settings on ranks that both asked for the route: the fingerprints differ.
TEST(ConfigMismatch, DifferentMinBytes) {
  run_agreement({"mismatch-min-bytes",
                 [](int rank) {
                   setenv("ZEROCTA_ALLGATHER", "auto", 1);
                   setenv("ZEROCTA_MIN_BYTES", rank == 0 ? "0" : "1M", 1);
                 },
                 "different ZEROCTA_* settings", 2});
}

// The default mode everywhere: nothing joins, nothing is said.
TEST(ConfigMismatch, NcclModeOnEveryRankIsQuiet) {
  run_agreement(
      {"agree-nccl-everywhere", [](int) { setenv("ZEROCTA_ALLGATHER", "nccl", 1); }, nullptr, 0});
}

}  // namespace
}  // namespace zgpu
