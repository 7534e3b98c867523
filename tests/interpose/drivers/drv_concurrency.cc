// Many threads using NCCL at once through the shim, the way a multi-threaded trainer does:
//
//   workers   W threads, each owning M communicators (ncclCommInitRank / InitRankConfig),
//             issuing all-gathers, all-reduces, broadcasts, ncclBcast (an inner call inside
//             NCCL) and nested groups of send/recv; the first communicator's all-gathers run
//             in a symmetric window the worker registered (the nccl-ce route; the fake
//             registers it with an inner call from a thread of its own);
//   churners  C threads that create and tear down communicators all the time, by every path:
//             InitRank, InitRankConfig (blocking and non-blocking, inside a group too), Split
//             (with a colour and with NCCL_SPLIT_NOCOLOR), Shrink, Destroy, Finalize+Destroy,
//             Revoke+Destroy, Abort;
//   watchdog  one thread polling ncclCommGetAsyncError on every live communicator (as
//             PyTorch's watchdog does) and reading zerocta_get_stats, checking that no
//             counter ever goes backwards.
//
// The schedule is deterministic (only the interleaving varies), so the test can compute the
// exact number of calls of each kind from the parameters. The driver also counts every NCCL
// call it makes and prints the tallies ("api.<function>=N", "calls.<op>=N", "created=N") and
// the shim's counters after every thread has joined ("stats.final.*").
//
//   drv_concurrency WORKERS COMMS_PER_WORKER ITERATIONS CHURNERS CYCLES DEADLINE_S
//
// Like PyTorch, the application guarantees that no thread uses a communicator while another
// destroys it: a communicator leaves the watchdog's list (under its lock) before it is torn
// down. Everything else runs concurrently. If the run has not finished by DEADLINE_S the
// driver prints every thread's last step and exits with 70, so a deadlock is diagnosable.
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "driver_util.h"

namespace {

// Every NCCL function this driver calls, for the per-function tallies.
enum Api {
  kGetUniqueId,
  kInitRank,
  kInitRankConfig,
  kSplit,
  kShrink,
  kRevoke,
  kWindowRegister,
  kWindowDeregister,
  kFinalize,
  kDestroy,
  kAbort,
  kGetAsyncError,
  kAllGather,
  kAllReduce,
  kBroadcast,
  kBcast,
  kSend,
  kRecv,
  kGroupStart,
  kGroupEnd,
  kApiCount
};
const char* const kApiNames[kApiCount] = {
    "ncclGetUniqueId",  "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit",
    "ncclCommShrink",   "ncclCommRevoke",   "ncclCommWindowRegister", "ncclCommWindowDeregister",
    "ncclCommFinalize", "ncclCommDestroy",  "ncclCommAbort",          "ncclCommGetAsyncError",
    "ncclAllGather",    "ncclAllReduce",    "ncclBroadcast",          "ncclBcast",
    "ncclSend",         "ncclRecv",         "ncclGroupStart",         "ncclGroupEnd"};

std::atomic<long long> g_api[kApiCount];
// Bytes each collective moves as the shim counts them (all-gather: the whole output).
std::atomic<long long> g_bytes[zerocta_op_count];
constexpr int kRanks = 2;             // every communicator here has two ranks (this process is one)
std::atomic<long long> g_created{0};  // communicators the application received
std::atomic<long long> g_failures{0};  // calls that did not return ncclSuccess
std::atomic<bool> g_go{false};         // start line: every thread begins together
std::atomic<bool> g_stop_watchdog{false};
std::atomic<long long> g_watchdog_rounds{0};  // completed polls of the whole list

// What each thread is doing, for the deadlock report.
constexpr int kMaxThreads = 64;
std::atomic<const char*> g_step[kMaxThreads];

// Communicators the watchdog may poll. Holding g_live_mu while polling is what keeps the
// watchdog from racing a destroy (the application's job, not NCCL's).
std::mutex g_live_mu;
std::set<ncclComm_t> g_live;

void check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  g_failures.fetch_add(1);
  fprintf(stderr, "driver: %s returned %d\n", what, static_cast<int>(r));
}

// One NCCL call: tallied, and its result checked.
#define CALL(api, expr)            \
  do {                             \
    g_api[api].fetch_add(1);       \
    check((expr), kApiNames[api]); \
  } while (0)

void publish(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live.insert(c);
}

void retire(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live.erase(c);
}

cudaStream_t stream_of(int thread) {
  return static_cast<cudaStream_t>(drv::fake_stream(static_cast<uintptr_t>(thread + 1)));
}

// Made-up device buffers, 16 per thread, kBufStride apart (drv::fake_buffer's spacing).
constexpr size_t kBufStride = 0x100000;
void* buf(int thread, int n) { return drv::fake_buffer(static_cast<uintptr_t>(thread * 16 + n)); }

ncclComm_t init_rank(int id) {
  g_step[id] = "init_rank";
  ncclUniqueId uid;
  CALL(kGetUniqueId, ncclGetUniqueId(&uid));
  ncclComm_t c = nullptr;
  CALL(kInitRank, ncclCommInitRank(&c, kRanks, uid, 0));
  if (c) g_created.fetch_add(1);
  return c;
}

ncclComm_t init_rank_config(int id, bool nonblocking) {
  g_step[id] = "init_rank_config";
  ncclUniqueId uid;
  CALL(kGetUniqueId, ncclGetUniqueId(&uid));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  if (nonblocking) cfg.blocking = 0;
  ncclComm_t c = nullptr;
  CALL(kInitRankConfig, ncclCommInitRankConfig(&c, kRanks, uid, 1, &cfg));
  if (c) g_created.fetch_add(1);
  return c;
}

void all_gather(int id, ncclComm_t c) {
  g_step[id] = "allgather";
  CALL(kAllGather, ncclAllGather(buf(id, 0), buf(id, 1), 256, ncclFloat32, c, stream_of(id)));
  g_bytes[zerocta_op_allgather].fetch_add(256 * 4 * kRanks);
}

void all_reduce(int id, ncclComm_t c) {
  g_step[id] = "allreduce";
  CALL(kAllReduce,
       ncclAllReduce(buf(id, 2), buf(id, 2), 512, ncclFloat32, ncclSum, c, stream_of(id)));
  g_bytes[zerocta_op_allreduce].fetch_add(512 * 4);
}

void broadcast(int id, ncclComm_t c) {
  g_step[id] = "broadcast";
  CALL(kBroadcast, ncclBroadcast(buf(id, 3), buf(id, 4), 128, ncclInt8, 0, c, stream_of(id)));
  g_bytes[zerocta_op_broadcast].fetch_add(128);
}

// The fake implements ncclBcast by calling ncclBroadcast: one inner call per ncclBcast.
void bcast(int id, ncclComm_t c) {
  g_step[id] = "bcast";
  CALL(kBcast, ncclBcast(buf(id, 5), 64, ncclInt8, 0, c, stream_of(id)));
  g_bytes[zerocta_op_broadcast].fetch_add(64);
}

void send_recv(int id, ncclComm_t c) {
  g_step[id] = "send/recv";
  CALL(kSend, ncclSend(buf(id, 6), 32, ncclFloat32, 1, c, stream_of(id)));
  CALL(kRecv, ncclRecv(buf(id, 7), 32, ncclFloat32, 1, c, stream_of(id)));
  g_bytes[zerocta_op_send].fetch_add(32 * 4);
  g_bytes[zerocta_op_recv].fetch_add(32 * 4);
}

void group_start(int id) {
  g_step[id] = "group_start";
  CALL(kGroupStart, ncclGroupStart());
}

void group_end(int id) {
  g_step[id] = "group_end";
  CALL(kGroupEnd, ncclGroupEnd());
}

void wait_for_start() {
  while (!g_go.load()) std::this_thread::yield();
}

// Per iteration: M all-gathers, M+1 all-reduces, M broadcasts + 1 ncclBcast, M sends and M
// receives in a group nested two deep. The order of the five blocks rotates with the thread
// and the iteration so that threads do different things at the same moment.
void worker(int id, int ncomms, int iterations) {
  wait_for_start();
  std::vector<ncclComm_t> comms;
  for (int j = 0; j < ncomms; ++j) {
    ncclComm_t c = j % 2 == 0 ? init_rank(id) : init_rank_config(id, false);
    if (c == nullptr) return;
    publish(c);
    comms.push_back(c);
  }
  // The all-gather buffers of the first communicator, as an application-registered window.
  g_step[id] = "window register";
  ncclWindow_t win = nullptr;
  CALL(kWindowRegister,
       ncclCommWindowRegister(comms[0], buf(id, 0), 2 * kBufStride, &win, NCCL_WIN_COLL_SYMMETRIC));
  for (int i = 0; i < iterations; ++i) {
    ncclComm_t one = comms[static_cast<size_t>(i % ncomms)];
    for (int b = 0; b < 5; ++b) {
      switch ((b + id + i) % 5) {
        case 0:
          for (ncclComm_t c : comms) all_gather(id, c);
          break;
        case 1:
          for (ncclComm_t c : comms) all_reduce(id, c);
          break;
        case 2:
          for (ncclComm_t c : comms) broadcast(id, c);
          break;
        case 3:
          bcast(id, one);
          break;
        case 4:
          group_start(id);
          group_start(id);
          for (ncclComm_t c : comms) send_recv(id, c);
          group_end(id);
          all_reduce(id, one);
          group_end(id);
          break;
      }
    }
  }
  // Whatever the scheduling, the watchdog polls (and reads the counters) at least once while
  // these communicators are alive.
  g_step[id] = "waiting for the watchdog";
  while (g_watchdog_rounds.load() == 0) std::this_thread::yield();
  g_step[id] = "window deregister";
  CALL(kWindowDeregister, ncclCommWindowDeregister(comms[0], win));
  for (int j = 0; j < ncomms; ++j) {
    ncclComm_t c = comms[static_cast<size_t>(j)];
    retire(c);
    g_step[id] = "teardown";
    if (j % 2 == 1) CALL(kFinalize, ncclCommFinalize(c));
    CALL(kDestroy, ncclCommDestroy(c));
  }
  g_step[id] = "done";
}

// One communicator created and torn down per cycle; cycle k uses variant k % 6:
//   0: InitRank, all-reduce, Destroy
//   1: InitRankConfig (non-blocking), broadcast, Finalize + Destroy
//   2: Split of the parent, all-gather, Abort
//   3: Split with NCCL_SPLIT_NOCOLOR (no communicator), InitRankConfig inside a group,
//      send/recv in a group, Destroy
//   4: InitRankConfig, Abort
//   5: Shrink of the parent (rank 1 excluded), all-reduce, Revoke + Destroy
// plus the parent (InitRank at the start, Destroy at the end).
void churner(int id, int cycles) {
  wait_for_start();
  ncclComm_t parent = init_rank(id);
  if (parent == nullptr) return;
  publish(parent);
  for (int k = 0; k < cycles; ++k) {
    ncclComm_t c = nullptr;
    switch (k % 6) {
      case 0:
        c = init_rank(id);
        if (!c) return;
        publish(c);
        all_reduce(id, c);
        retire(c);
        CALL(kDestroy, ncclCommDestroy(c));
        break;
      case 1:
        c = init_rank_config(id, true);
        if (!c) return;
        publish(c);
        broadcast(id, c);
        retire(c);
        CALL(kFinalize, ncclCommFinalize(c));
        CALL(kDestroy, ncclCommDestroy(c));
        break;
      case 2:
        g_step[id] = "split";
        CALL(kSplit, ncclCommSplit(parent, 1 + k, id, &c, nullptr));
        if (!c) return;
        g_created.fetch_add(1);
        publish(c);
        all_gather(id, c);
        retire(c);
        g_step[id] = "abort";
        CALL(kAbort, ncclCommAbort(c));
        break;
      case 3: {
        g_step[id] = "split nocolor";
        ncclComm_t none = reinterpret_cast<ncclComm_t>(&c);  // must be overwritten with NULL
        CALL(kSplit, ncclCommSplit(parent, NCCL_SPLIT_NOCOLOR, id, &none, nullptr));
        if (none != nullptr) {
          fprintf(stderr, "driver: NOCOLOR split returned a communicator\n");
          g_failures.fetch_add(1);
        }
        group_start(id);
        c = init_rank_config(id, false);
        group_end(id);
        if (!c) return;
        publish(c);
        group_start(id);
        send_recv(id, c);
        group_end(id);
        retire(c);
        g_step[id] = "destroy";
        CALL(kDestroy, ncclCommDestroy(c));
        break;
      }
      case 4:
        c = init_rank_config(id, false);
        if (!c) return;
        publish(c);
        retire(c);
        g_step[id] = "abort";
        CALL(kAbort, ncclCommAbort(c));
        break;
      case 5: {
        g_step[id] = "shrink";
        int excluded[1] = {1};
        CALL(kShrink, ncclCommShrink(parent, excluded, 1, &c, nullptr, NCCL_SHRINK_DEFAULT));
        if (!c) return;
        g_created.fetch_add(1);
        publish(c);
        all_reduce(id, c);
        retire(c);
        g_step[id] = "revoke";
        CALL(kRevoke, ncclCommRevoke(c, 0));
        CALL(kDestroy, ncclCommDestroy(c));
        break;
      }
    }
  }
  retire(parent);
  g_step[id] = "destroy parent";
  CALL(kDestroy, ncclCommDestroy(parent));
  g_step[id] = "done";
}

using GetStats = int (*)(zerocta_stats_t*);

// The shim's name for an op (found like print_stats does), nullptr without the shim.
const char* op_name(zerocta_op_t op) {
  using OpName = const char* (*)(zerocta_op_t);
  auto fn = reinterpret_cast<OpName>(dlsym(RTLD_DEFAULT, "zerocta_op_name"));
  return fn ? fn(op) : nullptr;
}

// True when every counter of `now` is at least its value in `before`.
bool never_decreased(const zerocta_stats_t& before, const zerocta_stats_t& now) {
  for (int o = 0; o < zerocta_op_count; ++o)
    for (int r = 0; r < zerocta_route_count; ++r)
      if (now.counters[o][r].calls < before.counters[o][r].calls ||
          now.counters[o][r].bytes < before.counters[o][r].bytes)
        return false;
  return now.comms_created >= before.comms_created && now.inner_calls >= before.inner_calls;
}

void watchdog(int id, long long* polls, long long* snapshots, bool* monotonic) {
  auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "zerocta_get_stats"));
  zerocta_stats_t prev{}, now{};
  wait_for_start();
  do {
    g_step[id] = "poll";
    bool polled = false;
    {
      std::lock_guard<std::mutex> lock(g_live_mu);
      for (ncclComm_t c : g_live) {
        ncclResult_t async = ncclInProgress;
        CALL(kGetAsyncError, ncclCommGetAsyncError(c, &async));
        // ncclInProgress is no error: a non-blocking comm reports it while work (here the
        // shim's pool set-up, run by another thread) is under way; PyTorch's watchdog
        // tolerates it the same way.
        if (async != ncclSuccess && async != ncclInProgress) {
          fprintf(stderr, "driver: async error %d on a healthy communicator\n",
                  static_cast<int>(async));
          g_failures.fetch_add(1);
        }
        ++*polls;
        polled = true;
      }
    }
    g_step[id] = "stats";
    if (get != nullptr && get(&now) == 0) {
      if (!never_decreased(prev, now)) *monotonic = false;
      prev = now;
      ++*snapshots;
      if (polled) g_watchdog_rounds.fetch_add(1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  } while (!g_stop_watchdog.load());
  g_step[id] = "done";
}

// Exits with 70 and every thread's last step when the run outlives its deadline.
class DeadlockGuard {
 public:
  DeadlockGuard(int deadline_s, int nthreads)
      : thread_([this, deadline_s, nthreads] {
          std::unique_lock<std::mutex> lock(mu_);
          if (cv_.wait_for(lock, std::chrono::seconds(deadline_s), [this] { return done_; }))
            return;
          for (int t = 0; t < nthreads; ++t) {
            const char* s = g_step[t].load();
            fprintf(stderr, "driver: DEADLINE thread %d at %s\n", t, s ? s : "(not started)");
          }
          fflush(stderr);
          _exit(70);
        }) {}
  ~DeadlockGuard() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

int arg(int argc, char** argv, int i, int fallback) { return i < argc ? atoi(argv[i]) : fallback; }

}  // namespace

int main(int argc, char** argv) {
  const int workers = arg(argc, argv, 1, 8);
  const int comms_per_worker = arg(argc, argv, 2, 4);
  const int iterations = arg(argc, argv, 3, 200);
  const int churners = arg(argc, argv, 4, 2);
  const int cycles = arg(argc, argv, 5, 100);
  const int deadline_s = arg(argc, argv, 6, 20);
  if (workers < 1 || comms_per_worker < 1 || iterations < 0 || churners < 0 || cycles < 0 ||
      workers + churners + 1 > kMaxThreads) {
    fprintf(stderr, "driver: bad arguments\n");
    return 64;
  }

  long long polls = 0, snapshots = 0;
  bool monotonic = true;
  const auto t0 = std::chrono::steady_clock::now();
  {
    DeadlockGuard guard(deadline_s, workers + churners + 1);
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w) threads.emplace_back(worker, w, comms_per_worker, iterations);
    for (int c = 0; c < churners; ++c) threads.emplace_back(churner, workers + c, cycles);
    std::thread dog(watchdog, workers + churners, &polls, &snapshots, &monotonic);
    g_go.store(true);
    for (std::thread& t : threads) t.join();
    g_stop_watchdog.store(true);
    dog.join();
  }
  const auto elapsed = std::chrono::steady_clock::now() - t0;

  for (int a = 0; a < kApiCount; ++a) drv::out(std::string("api.") + kApiNames[a], g_api[a].load());
  drv::out("calls.allgather", g_api[kAllGather].load());
  drv::out("calls.allreduce", g_api[kAllReduce].load());
  drv::out("calls.broadcast", g_api[kBroadcast].load() + g_api[kBcast].load());
  drv::out("calls.send", g_api[kSend].load());
  drv::out("calls.recv", g_api[kRecv].load());
  for (int o = 0; o < zerocta_op_count; ++o) {
    if (const char* name = op_name(static_cast<zerocta_op_t>(o)))
      drv::out(std::string("bytes.") + name, g_bytes[o].load());
  }
  drv::out("created", g_created.load());
  drv::out("failures", g_failures.load());
  drv::out("polls", polls);
  drv::out("snapshots", snapshots);
  drv::out("monotonic", monotonic ? 1 : 0);
  drv::out("elapsed_ms", std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count());
  drv::print_stats("final");
  return 0;
}
