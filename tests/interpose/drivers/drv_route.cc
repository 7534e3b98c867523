// Scenarios of the copy-engine route's set-up (src/comms/route_setup.h), run under LD_PRELOAD of
// the shim with the fake NCCL and the fake CUDA driver (FAKE_CUDA_CE=1: memory really shared
// between processes, tests/fake_nccl/fake_cuda_mem.cc). Checked by test_route_setup.cc.
// Results are "key=value" lines on stdout; the verdict is the test's.
//
//   drv_route default-log              one process, every creation path of the default mode
//   drv_route grouped-init             one thread, one group: 2 inits on 2 devices, then a
//                                      grouped all-gather on both
//   drv_route initall-split            ncclCommInitAll(2), split (color 0, keys reversed) in a
//                                      group (DRV_SPLIT_THREADS=1: one thread per comm, no
//                                      group), a grouped all-gather on the children
//   drv_route ranks N grouped          N processes of DRV_LOCAL_RANKS (default 2) ranks each, as
//                                      grouped-init drives them (process K: ranks from K x that)
//   drv_route ranks N SCENARIO [rK:VAR=VALUE ...]
//                                      fork()s N ranks; rank K sets VAR=VALUE before anything
//                                      else (ZEROCTA_* included: the shim reads them at the
//                                      rank's first NCCL call). Each rank runs SCENARIO and
//                                      prints its keys as r<K>.<key>; the parent prints
//                                      r<K>.exit (128 + signal when killed).
//
// Rank scenarios (options from DRV_* variables, per rank with rK:):
//   basic     device DRV_DEVICE (default: the rank), a comm of DRV_NRANKS (default N) ranks,
//             ncclGetUniqueId (FAKE_NCCL_COMM_ID makes
//             the ranks agree), ncclCommInitRank (DRV_NB=1: InitRankConfig non-blocking;
//             DRV_INIT_GROUP_AG=1: the init and an all-gather in one group), DRV_POLL=main|
//             thread|none (non-blocking: who polls until ready), DRV_EARLY_DESTROY=1 (a
//             ncclCommDestroy before the first poll), an all-gather of DRV_AG_BYTES per rank
//             (default 4096; DRV_AG_GROUP=1 inside a group; DRV_AG=0: none), DRV_END=destroy|
//             finalize|abort|abort_busy|kill|none (abort_busy: the route's streams never drain,
//             and abort.* says how long the abort took and what stayed registered),
//             DRV_KILL_AFTER_INIT_MS (kill itself that long after
//             the init), DRV_SLEEP_BEFORE_INIT_MS / DRV_SLEEP_AFTER_INIT_MS, DRV_LIST_CHANNEL=1
//             (prints the channel directory's names just before its own init),
//             DRV_SLEEP_BEFORE_AG_MS, DRV_AG_REPEAT=N (N all-gathers on the same buffers;
//             DRV_AG_FRESH_EVERY=K: new buffers every K of them, the old ones freed first;
//             DRV_AG_GROW=1: new buffers for every op, op i of (i + 1) x DRV_AG_BYTES per rank;
//             DRV_AG_IN_PLACE=1: each rank sends its slot of the receive buffer;
//             DRV_SLEEP_EACH_AG_MS: a sleep before every one, which orders the ranks' arrivals;
//             DRV_AG_BARRIER=1: every rank first meets the others, its buffers ready, so that
//             the sleeps alone order them; DRV_AG_INTERLEAVE=1: after each one, an
//             ncclAllReduce on another stream of the rank, as FSDP2's reduce-scatters; =2: the
//             same all-reduce inside a group of its own; =3: inside the all-gather's group, a
//             group of both; DRV_AG_EXTRA_ALLREDUCE=1: after the first one only, one ncclAllReduce
//             on its stream, <tag>.extra_rc — set on one rank, the ranks' calls drift apart;
//             =2: the same all-reduce as a pre-multiplied sum made on the communicator just
//             before it and destroyed after it (NCCL numbers such ops per communicator);
//             DRV_AG_SIMULATE_ALLREDUCE=1: before the first one, a group of one ncclAllReduce
//             ended by ncclGroupSimulateEnd, which launches nothing, <tag>.simulate_rc),
//             DRV_AG_CHECK=1 (ncclCommGetAsyncError and one more all-gather after them),
//             DRV_SECOND_WORLD=1 (after DRV_END, another communicator: init, an all-gather as
//             again.*, destroy),
//             DRV_SUSPEND=1 (then ncclCommSuspend(NCCL_SUSPEND_MEM), ncclCommResume and an
//             all-gather "after": suspend_and_resume()), DRV_IDLE_WATCH_MS=N (then, every
//             buffer freed and with no NCCL call, up to N ms of watching the fake driver's
//             memory held here go: idle_watch()), DRV_NOFILE_HEADROOM=K (the soft
//             RLIMIT_NOFILE set to the descriptors open plus K once the all-gather's buffers
//             exist: limit_descriptors()).

//   split     basic's init, then ncclCommSplit(DRV_COLOR ("nocolor" = NCCL_SPLIT_NOCOLOR),
//             DRV_KEY) and an all-gather on the child.
//   shrink    basic's init, then (ranks not in DRV_EXCLUDE, a comma list) ncclCommShrink and an
//             all-gather on the child. DRV_SHRINK_ABORT=1: first an all-gather on the world,
//             then the excluded ranks abort it (excluded.abort) and the others shrink with
//             NCCL_SHRINK_ABORT and print the parent's ncclCommGetAsyncError (shrink.parent_async).
//   fork      basic's init and all-gather, then fork(): the child makes a world of its own
//             with the other ranks' children (FAKE_NCCL_COMM_ID + "-child"), all-gathers and
//             reports as r<K>.child.*; the parent all-gathers again.
//   hang      joins a 2-rank comm alone and kills itself (SIGKILL) DRV_KILL_MS into its init.
//   peerabort basic's init and all-gather (DRV_RS=1: and reduce-scatters), then rank 0 aborts
//             and rank 1 polls, all-reduces, all-gathers (and reduce-scatters: peer.rs_rc)
//             (peer.*: see rank_peer_abort); DRV_PEER_AHEAD: rank 0 runs ahead of
//             rank 1, which aborts (ahead.*: see rank_ahead_of_an_aborting_peer).
//   twocomms  basic's init twice (two instances of one unique id), then one group with an
//             all-gather on each communicator, both on one stream, each with a pattern of its
//             own: the first communicator's first, or with DRV_TWO_ORDER=reverse the second's
//             (rK: for one rank, as an application may name them in any order); prints two.rc,
//             two.data_ok, then destroys both.
//   cycles    DRV_CYCLES (default 100) times: basic's init (the same unique id every time, as
//             NCCL_COMM_ID gives), one all-gather, destroy. Prints the process's resources
//             (open fds, threads, resident KiB, the fake driver's live objects, pool_bytes)
//             after cycle DRV_CYCLES_WARM (default 5) as warm.* and after the last as last.*.
//             DRV_CYCLES_DESTROY_LAG=N: a second thread destroys them, up to N behind.
//
// Captured all-gathers, in the all-gather step of every rank scenario (instead of the eager
// ones; DRV_AG_REPEAT and its companions do not apply): DRV_AG_CAPTURE=1 captures ONE
// ncclAllGather (DRV_AG_GROUP=1: in a group) on the rank's stream (cuStreamBeginCapture in
// CU_STREAM_CAPTURE_MODE_GLOBAL), ends the capture and instantiates the graph: <tag>.capture_rc
// (the captured call's ncclResult_t, or ncclInvalidUsage when the capture could not begin),
// <tag>.begin_capture, <tag>.end_capture and <tag>.instantiate (CUresults). It then launches the
// graph DRV_AG_REPLAYS times (default 2): before each launch the send buffer gets a pattern of
// its own (per rank and per replay) and the receive buffer is poisoned;
// DRV_SLEEP_BEFORE_REPLAY_MS sleeps first (which orders the ranks; with DRV_AG_BARRIER=1 they
// meet before that); after it, cuStreamSynchronize and a check against every rank's pattern of
// that replay. <tag>.launch_rc (the first failed launch's CUresult, else 0), <tag>.replay_ok
// (the replays whose output was right), <tag>.rc (= capture_rc), <tag>.data_ok (1 only if every
// replay was right). DRV_AG_CHECK=1 then asks ncclCommGetAsyncError and runs one more
// all-gather eagerly, as for eager ones. Then the exec and the graph are destroyed
// (<tag>.exec_destroy, <tag>.graph_destroy); with DRV_AG_KEEP_GRAPH=1 they and their buffers
// are kept until the communicator has been destroyed, finalized or aborted.
// DRV_AG_INVALIDATE_CAPTURE=1 invalidates that capture before the all-gather (a cuStreamQuery
// on the capturing stream, which CUDA refuses): no graph, no replay.
// DRV_AG_CAPTURE_DISCARD=1 first captures one all-gather whose graph is destroyed, never
// instantiated nor launched (<tag>.discard_begin, <tag>.discard_rc, <tag>.discard_end,
// <tag>.discard_destroy). The replays of two ranks wait for each other's flags in shared
// memory: tests that replay set FAKE_CUDA_WAIT_MS.
//
// All-gather buffers, in every scenario: DRV_AG_MEM=cumem (the default) allocates them with the
// driver's cuMem API, exportable as POSIX fds (what the route reaches across processes), one
// allocation each or DRV_AG_CHUNK bytes each, mapped back to back;
// DRV_AG_MEM=host takes host memory (which no peer reaches: an op goes to NCCL when the first
// rank to arrive at it has such buffers).
#include <cuda.h>
#include <dirent.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "driver_util.h"

extern "C" int fake_cuda_live(const char* kind);  // tests/fake_nccl/fake_cuda_mem.cc

namespace {

std::string g_prefix;  // "r<K>." in a rank, "" otherwise
int g_device = 0;      // a rank's device (DRV_DEVICE, default the rank)
int g_nranks = 0;      // the ranks run_ranks forked

// The ranks' barrier before each all-gather with DRV_AG_BARRIER=1, in memory shared by every
// rank (mapped before the forks): a count of arrivals per generation.
struct RankBarrier {
  std::atomic<int> arrived{0};
  std::atomic<int> generation{0};
};
RankBarrier* g_barrier = nullptr;

void out(const std::string& key, const std::string& value) { drv::out(g_prefix + key, value); }
void out(const std::string& key, long long value) { drv::out(g_prefix + key, value); }

// Every rank waits here until all have come (the last to come opens the next generation).
void barrier_of_ranks() {
  RankBarrier& b = *g_barrier;
  const int generation = b.generation.load();
  if (b.arrived.fetch_add(1) + 1 == g_nranks) {
    b.arrived.store(0);
    b.generation.fetch_add(1);
    return;
  }
  while (b.generation.load() == generation) usleep(200);
}

std::string env_str(const char* name, const char* fallback) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}
long env_long(const char* name, long fallback) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? strtol(v, nullptr, 0) : fallback;
}

void make_current(int dev) {
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    out("make_current_failed", dev);
    _exit(3);
  }
}

// Threads of this process named zerocta-fd (the shim's fd service).
int fd_threads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      std::getline(f, name);
      if (name == "zerocta-fd") ++n;
    }
    closedir(d);
  }
  return n;
}

// The zerocta-* names in the channel directory, comma-separated ("" when none).
std::string channel_names() {
  std::string names;
  const std::string dir = env_str("ZEROCTA_CHANNEL_DIR", "/dev/shm");
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (strncmp(e->d_name, "zerocta-", 8) == 0)
        names += (names.empty() ? "" : ",") + std::string(e->d_name);
    closedir(d);
  }
  return names;
}
int channel_count() {
  const std::string n = channel_names();
  if (n.empty()) return 0;
  int c = 1;
  for (char ch : n) c += ch == ',';
  return c;
}

// The shim's counters that matter here, as <tag>.<name>=N ("<tag>.stats=absent" without it).
void stats(const std::string& tag) {
  using GetStats = int (*)(zerocta_stats_t*);
  auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "zerocta_get_stats"));
  zerocta_stats_t s;
  if (get == nullptr || get(&s) != 0) {
    out(tag + ".stats", "absent");
    return;
  }
  out(tag + ".ag_ce",
      static_cast<long long>(s.counters[zerocta_op_allgather][zerocta_route_ce].calls));
  out(tag + ".ag_pass",
      static_cast<long long>(s.counters[zerocta_op_allgather][zerocta_route_passthrough].calls));
  out(tag + ".ag_nccl_ce",
      static_cast<long long>(s.counters[zerocta_op_allgather][zerocta_route_nccl_ce].calls));
  out(tag + ".rs_ce",
      static_cast<long long>(s.counters[zerocta_op_reducescatter][zerocta_route_ce].calls));
  out(tag + ".rs_pass", static_cast<long long>(
                            s.counters[zerocta_op_reducescatter][zerocta_route_passthrough].calls));
  out(tag + ".created", static_cast<long long>(s.comms_created));
  out(tag + ".ce_ready", static_cast<long long>(s.comms_ce_ready));
  out(tag + ".pool_bytes", static_cast<long long>(s.pool_bytes));
}

void cuda_live(const std::string& tag) {
  for (const char* k :
       {"alloc", "reserve", "map", "stream", "event", "hostreg", "graph", "exec", "userobj"})
    out(tag + ".live_" + k, fake_cuda_live(k));
}

void report(const std::string& tag) {
  stats(tag);
  out(tag + ".fd_threads", fd_threads());
  out(tag + ".channel_files", channel_count());
}

// Byte i of `rank`'s send buffer; replay K of a captured all-gather has patterns of its own.
uint8_t pattern(int rank, size_t i, int replay = -1) {
  return static_cast<uint8_t>(rank * 37 + i * 7 + 1 + (replay + 1) * 101);
}

// pattern() repeats every 256 bytes (7 is odd): one period of it, so that buffers of many MiB
// are filled and checked with memcpy and memcmp (a byte at a time took most of a 256-op test).
constexpr size_t kPatternPeriod = 256;
std::array<uint8_t, kPatternPeriod> pattern_period(int rank, int replay) {
  std::array<uint8_t, kPatternPeriod> p;
  for (size_t i = 0; i < kPatternPeriod; ++i) p[i] = pattern(rank, i, replay);
  return p;
}

// One buffer of an all-gather. DRV_AG_MEM=cumem (the default): cuMem memory that may be
// exported as POSIX fds, opened read-write for `access` (the devices that must reach it by
// address: its own, and in one-process scenarios its peers'), rounded up to the granularity —
// one allocation, or with DRV_AG_CHUNK=BYTES allocations of that size mapped back to back in one
// reserved range, as PyTorch's expandable segments lay out a tensor (20 MiB each there).
// DRV_AG_MEM=fabric: the same exportable as FABRIC handles only (as PyTorch's segments on an
// IMEX node). DRV_AG_MEM=host: host memory, which no peer's copy engine reaches (a device pointer
// is a host pointer in the fake, so NCCL's fake and this driver still read it alike).
class Buffer {
 public:
  Buffer(size_t bytes, int device, const std::vector<int>& access) : bytes_(bytes) {
    if (env_str("DRV_AG_MEM", "cumem") == "host") {
      host_.resize(bytes);
      data_ = host_.data();
      return;
    }
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.requestedHandleTypes = env_str("DRV_AG_MEM", "cumem") == "fabric"
                                    ? CU_MEM_HANDLE_TYPE_FABRIC
                                    : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    if (cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS ||
        gran == 0)
      fail("granularity");
    const size_t want = static_cast<size_t>(env_long("DRV_AG_CHUNK", 0));
    const size_t whole = (bytes + gran - 1) / gran * gran;
    piece_ = want ? (want + gran - 1) / gran * gran : whole;
    mapped_ = (whole + piece_ - 1) / piece_ * piece_;
    if (cuMemAddressReserve(&va_, mapped_, 0, 0, 0) != CUDA_SUCCESS) fail("reserve");
    std::vector<CUmemAccessDesc> desc(access.size());
    for (size_t i = 0; i < access.size(); ++i) {
      desc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      desc[i].location.id = access[i];
      desc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    for (size_t at = 0; at < mapped_; at += piece_) {
      CUmemGenericAllocationHandle handle = 0;
      if (cuMemCreate(&handle, piece_, &prop, 0) != CUDA_SUCCESS) fail("create");
      if (cuMemMap(va_ + at, piece_, 0, handle, 0) != CUDA_SUCCESS) fail("map");
      cuMemRelease(handle);  // the mapping keeps the memory, as PyTorch's allocator does
      if (cuMemSetAccess(va_ + at, piece_, desc.data(), desc.size()) != CUDA_SUCCESS)
        fail("access");
    }
    data_ = reinterpret_cast<uint8_t*>(va_);
  }
  ~Buffer() {
    if (!va_) return;
    for (size_t at = 0; at < mapped_; at += piece_) cuMemUnmap(va_ + at, piece_);
    cuMemAddressFree(va_, mapped_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }
  uint8_t& operator[](size_t i) const { return data_[i]; }

 private:
  [[noreturn]] void fail(const char* what) {
    out("ag_buffer_failed", std::string(what));
    _exit(5);
  }
  size_t bytes_ = 0, mapped_ = 0, piece_ = 0;
  CUdeviceptr va_ = 0;
  std::vector<uint8_t> host_;
  uint8_t* data_ = nullptr;
};

// One all-gather's buffers (DRV_AG_BYTES per rank) on `device`, readable by address from the
// devices in `access` (default: `device` only).
struct Gather {
  Buffer send, recv;
  CUstream stream = nullptr;
  int rank = 0, nranks = 0;
  Gather(int r, int n, size_t bytes, int device, const std::vector<int>& access = {})
      : send(bytes, device, access.empty() ? std::vector<int>{device} : access),
        recv(bytes * static_cast<size_t>(n), device,
             access.empty() ? std::vector<int>{device} : access),
        rank(r),
        nranks(n) {
    fill();
    if (cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) stream = nullptr;
  }
  // DRV_AG_IN_PLACE=1: the op sends this rank's slot of the receive buffer (FSDP2's way).
  static bool in_place() { return env_long("DRV_AG_IN_PLACE", 0) == 1; }
  uint8_t* sent() const {
    return in_place() ? &recv[static_cast<size_t>(rank) * send.size()] : send.data();
  }
  // This rank's pattern (of a replay) into what it sends, poison into the rest of the receive
  // buffer.
  void fill(int replay = -1) {
    memset(recv.data(), 0xee, recv.size());
    uint8_t* out = sent();
    const auto period = pattern_period(rank, replay);
    for (size_t i = 0; i < send.size(); i += kPatternPeriod)
      memcpy(out + i, period.data(), std::min(kPatternPeriod, send.size() - i));
  }
  // `legacy`: on the legacy default stream rather than the buffers' own.
  ncclResult_t issue(ncclComm_t c, bool legacy = false) {
    return ncclAllGather(sent(), recv.data(), send.size(), ncclUint8, c,
                         legacy ? nullptr : reinterpret_cast<cudaStream_t>(stream));
  }
  // Both buffers as symmetric windows of `c` (NCCL may run the op on its own CE path); the
  // handles go with the communicator.
  void register_windows(ncclComm_t c) {
    ncclWindow_t w = nullptr;
    out("winreg", ncclCommWindowRegister(c, send.data(), send.size(), &w, NCCL_WIN_COLL_SYMMETRIC));
    out("winreg", ncclCommWindowRegister(c, recv.data(), recv.size(), &w, NCCL_WIN_COLL_SYMMETRIC));
  }
  // Whether every rank's bytes arrived. The fake's streams run at once in the issuing thread,
  // but the shim's push issuer issues an earlier rank's pushes from a thread of its own once the
  // later rank claims (push_issuer.h): as a stream synchronize would on a GPU, wait for them (up
  // to 2 s) before calling the bytes wrong.
  int data_ok(int replay = -1) const {
    for (int waited_ms = 0; waited_ms < 2000; ++waited_ms) {
      if (bytes_ok(replay)) return 1;
      usleep(1000);
    }
    return bytes_ok(replay);
  }
  int bytes_ok(int replay) const {
    const size_t bytes = send.size();
    for (int r = 0; r < nranks; ++r) {
      const auto period = pattern_period(r, replay);
      const uint8_t* row = &recv[static_cast<size_t>(r) * bytes];
      for (size_t i = 0; i < bytes; i += kPatternPeriod)
        if (memcmp(row + i, period.data(), std::min(kPatternPeriod, bytes - i)) != 0) return 0;
    }
    return 1;
  }
  ~Gather() {
    if (stream) cuStreamDestroy(stream);
  }
};

// ncclCommGetAsyncError (<tag>.async), then one more all-gather issued eagerly on `g`'s buffers
// (<tag>.next_rc, <tag>.next_data_ok): a rank's error shows in the op, or in the next call.
void check_after(const std::string& tag, ncclComm_t c, Gather& g) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t poll = ncclCommGetAsyncError(c, &state);
  out(tag + ".async", poll != ncclSuccess ? poll : state);
  g.fill();
  out(tag + ".next_rc", g.issue(c));
  if (g.stream) cuStreamSynchronize(g.stream);
  out(tag + ".next_data_ok", g.data_ok());
}

// A captured all-gather's graph, its exec and its buffers, destroyed together.
struct CapturedGather {
  std::string tag;
  std::unique_ptr<Gather> buffers;
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
};
// DRV_AG_KEEP_GRAPH=1: those kept until their communicator is gone.
std::vector<CapturedGather> g_kept;

void destroy_captured(CapturedGather& cg) {
  if (cg.exec) out(cg.tag + ".exec_destroy", cuGraphExecDestroy(cg.exec));
  if (cg.graph) out(cg.tag + ".graph_destroy", cuGraphDestroy(cg.graph));
  cg.buffers.reset();
}

// After a communicator's destroy (finalize, abort): the graphs kept by DRV_AG_KEEP_GRAPH=1.
void release_kept_graphs() {
  for (CapturedGather& cg : g_kept) destroy_captured(cg);
  g_kept.clear();
}

// One all-gather of `g` (in a group if `grouped`) captured on g's stream.
struct Captured {
  CUresult begin = CUDA_SUCCESS, end = CUDA_SUCCESS;
  ncclResult_t rc = ncclInvalidUsage;  // the captured call's (this, if the capture never began)
  CUgraph graph = nullptr;
};
// `invalidate`: a cuStreamQuery on the capturing stream first, which CUDA refuses and which
// invalidates the capture (the application's own mistake, before the all-gather).
Captured capture_one(ncclComm_t c, Gather& g, bool grouped, bool invalidate = false) {
  Captured cap;
  cap.begin = cap.end = cuStreamBeginCapture(g.stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
  if (cap.begin != CUDA_SUCCESS) return cap;
  if (invalidate) cuStreamQuery(g.stream);
  if (grouped) ncclGroupStart();
  cap.rc = g.issue(c);
  if (grouped) {
    const ncclResult_t group_end = ncclGroupEnd();
    if (cap.rc == ncclSuccess) cap.rc = group_end;
  }
  cap.end = cuStreamEndCapture(g.stream, &cap.graph);
  return cap;
}

// DRV_AG_CAPTURE=1's all-gather (see the header): capture, replays, checks.
void captured_all_gather(const std::string& tag, ncclComm_t c, int r, int n, bool grouped) {
  const size_t bytes = static_cast<size_t>(env_long("DRV_AG_BYTES", 4096));
  CapturedGather cg;
  cg.tag = tag;
  cg.buffers = std::make_unique<Gather>(r, n, bytes, g_device);
  Gather& g = *cg.buffers;
  if (long ms = env_long("DRV_SLEEP_BEFORE_AG_MS", 0)) usleep(static_cast<useconds_t>(ms) * 1000);
  if (env_long("DRV_AG_CAPTURE_DISCARD", 0) == 1) {
    const Captured discarded = capture_one(c, g, grouped);
    out(tag + ".discard_begin", discarded.begin);
    out(tag + ".discard_rc", discarded.rc);
    out(tag + ".discard_end", discarded.end);
    if (discarded.graph) out(tag + ".discard_destroy", cuGraphDestroy(discarded.graph));
  }
  const Captured cap = capture_one(c, g, grouped, env_long("DRV_AG_INVALIDATE_CAPTURE", 0) == 1);
  const ncclResult_t rc = cap.rc;
  cg.graph = cap.graph;
  out(tag + ".begin_capture", cap.begin);
  out(tag + ".capture_rc", rc);
  out(tag + ".end_capture", cap.end);
  CUresult instantiate = CUDA_ERROR_INVALID_VALUE;  // no graph to instantiate
  if (cg.graph) instantiate = cuGraphInstantiate(&cg.exec, cg.graph, 0);
  out(tag + ".instantiate", instantiate);
  const bool barrier = env_long("DRV_AG_BARRIER", 0) == 1 && g_barrier != nullptr;
  const long sleep_ms = env_long("DRV_SLEEP_BEFORE_REPLAY_MS", 0);
  const long replays = env_long("DRV_AG_REPLAYS", 2);
  CUresult launch_rc = CUDA_SUCCESS;
  long ok = 0;
  for (int i = 0; i < replays && cg.exec; ++i) {
    g.fill(i);
    if (barrier) barrier_of_ranks();
    if (sleep_ms > 0) usleep(static_cast<useconds_t>(sleep_ms) * 1000);
    const CUresult launched = cuGraphLaunch(cg.exec, g.stream);
    cuStreamSynchronize(g.stream);
    if (launch_rc == CUDA_SUCCESS) launch_rc = launched;
    ok += launched == CUDA_SUCCESS && g.data_ok(i);
  }
  out(tag + ".launch_rc", launch_rc);
  out(tag + ".replay_ok", ok);
  out(tag + ".rc", rc);
  out(tag + ".data_ok", cg.exec != nullptr && ok == replays ? 1 : 0);
  if (env_long("DRV_AG_CHECK", 0) == 1) check_after(tag, c, g);
  if (env_long("DRV_AG_KEEP_GRAPH", 0) == 1)
    g_kept.push_back(std::move(cg));
  else
    destroy_captured(cg);
}

int proc_entries(const char* dir);  // below, with the cycles scenario

// DRV_NOFILE_HEADROOM=K: the soft RLIMIT_NOFILE becomes the descriptors open now plus K, so that
// what the all-gathers need beyond K is more than the process may open (nofile, nofile_rc).
void limit_descriptors(long headroom) {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = static_cast<rlim_t>(proc_entries("fd") + headroom);
  out("nofile", static_cast<long long>(r.rlim_cur));
  out("nofile_rc", setrlimit(RLIMIT_NOFILE, &r));
}

// An all-gather on `c` (rank `r` of `n`) with buffers on this rank's device: prints <tag>.rc
// and <tag>.data_ok. DRV_SLEEP_BEFORE_AG_MS delays it (which rank arrives first);
// DRV_AG_REPEAT=N issues it N times on the same buffers, each checked (rc: the first error,
// data_ok: every op's); DRV_AG_CHECK=1 then asks ncclCommGetAsyncError (<tag>.async) and
// issues it once more (<tag>.next_rc, <tag>.next_data_ok): a rank's error shows in the op, or
// in the next call.
void all_gather(const std::string& tag, ncclComm_t c, int r, int n, bool grouped = false) {
  if (env_long("DRV_AG_CAPTURE", 0) == 1) return captured_all_gather(tag, c, r, n, grouped);
  const size_t bytes = static_cast<size_t>(env_long("DRV_AG_BYTES", 4096));
  auto fresh = std::make_unique<Gather>(r, n, bytes, g_device);
  if (long k = env_long("DRV_NOFILE_HEADROOM", 0)) limit_descriptors(k);
  if (long ms = env_long("DRV_SLEEP_BEFORE_AG_MS", 0)) usleep(static_cast<useconds_t>(ms) * 1000);
  ncclResult_t rc = ncclSuccess;
  int ok = 1;
  const long fresh_every = env_long("DRV_AG_FRESH_EVERY", 0);
  const bool grow = env_long("DRV_AG_GROW", 0) == 1;
  const long sleep_each_ms = env_long("DRV_SLEEP_EACH_AG_MS", 0);
  const bool barrier = env_long("DRV_AG_BARRIER", 0) == 1 && g_barrier != nullptr;
  CUstream other = nullptr;  // DRV_AG_INTERLEAVE's stream
  const long interleave = env_long("DRV_AG_INTERLEAVE", 0);
  if (interleave >= 1 && interleave <= 3 &&
      cuStreamCreate(&other, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    other = nullptr;
  const bool with_ag = interleave == 3;  // the all-reduce in the all-gather's group
  const long extra_allreduce = env_long("DRV_AG_EXTRA_ALLREDUCE", 0);
  if (env_long("DRV_AG_SIMULATE_ALLREDUCE", 0) == 1) {
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    ncclGroupStart();
    ncclAllReduce(fresh->recv.data(), fresh->recv.data(), 1, ncclFloat, ncclSum, c,
                  reinterpret_cast<cudaStream_t>(fresh->stream));
    out(tag + ".simulate_rc", ncclGroupSimulateEnd(&sim));
  }
  auto all_reduce = [&](Gather& g) {
    return ncclAllReduce(g.recv.data(), g.recv.data(), 1, ncclFloat, ncclSum, c,
                         reinterpret_cast<cudaStream_t>(other));
  };
  for (long i = 0, repeat = env_long("DRV_AG_REPEAT", 1); i < repeat; ++i) {
    // The old buffers are freed before the new ones exist, as a caching allocator's
    // empty_cache() and a fresh allocation would.
    if (i > 0 && (grow || (fresh_every > 0 && i % fresh_every == 0))) {
      fresh.reset();
      fresh = std::make_unique<Gather>(r, n, grow ? bytes * static_cast<size_t>(i + 1) : bytes,
                                       g_device);
    }
    Gather& g = *fresh;
    g.fill();  // poison in the receive buffer, this rank's pattern where it sends from
    if (barrier) barrier_of_ranks();
    if (sleep_each_ms > 0) usleep(static_cast<useconds_t>(sleep_each_ms) * 1000);
    if (grouped || with_ag) ncclGroupStart();
    ncclResult_t op = g.issue(c);
    if (other && with_ag && op == ncclSuccess) op = all_reduce(g);
    if (grouped || with_ag) {
      ncclResult_t end = ncclGroupEnd();
      if (op == ncclSuccess) op = end;
    }
    if (other && !with_ag && op == ncclSuccess) {
      if (interleave == 2) ncclGroupStart();
      op = all_reduce(g);
      if (interleave == 2) {
        ncclResult_t end = ncclGroupEnd();
        if (op == ncclSuccess) op = end;
      }
    }
    if (g.stream) cuStreamSynchronize(g.stream);
    if (other) cuStreamSynchronize(other);
    if (rc == ncclSuccess) rc = op;
    ok = ok && g.data_ok();
    if (i == 0 && extra_allreduce != 0) {
      float half = 0.5f;
      ncclRedOp_t redop = ncclSum;
      if (extra_allreduce == 2 &&
          ncclRedOpCreatePreMulSum(&redop, &half, ncclFloat, ncclScalarHostImmediate, c) !=
              ncclSuccess)
        out(tag + ".premul_rc", 1);
      out(tag + ".extra_rc", ncclAllReduce(g.recv.data(), g.recv.data(), 1, ncclFloat, redop, c,
                                           reinterpret_cast<cudaStream_t>(g.stream)));
      if (redop != ncclSum) out(tag + ".premul_destroy_rc", ncclRedOpDestroy(redop, c));
      if (g.stream) cuStreamSynchronize(g.stream);
    }
  }
  if (other) cuStreamDestroy(other);
  out(tag + ".rc", rc);
  out(tag + ".data_ok", ok);
  if (env_long("DRV_AG_CHECK", 0) == 1) check_after(tag, c, *fresh);
}

// Reduce-scatters (DRV_RS=1, after the all-gathers): DRV_RS_REPEAT (default 3) ops of
// DRV_RS_COUNT (default 1000) elements a rank of DRV_RS_TYPE (float or bf16), DRV_RS_OP (sum,
// avg, or premul: a pre-multiplied sum of each rank's own scalar, rs_scalar(), made before each
// call and destroyed right after it as PyTorch does, its scalar host-immediate or device-resident
// as DRV_RS_SCALAR says: host, device, or mixed = odd ranks device), DRV_RS_IN_PLACE=1 (the output
// is the rank's chunk of its input, as FSDP2 has it), DRV_RS_FRESH=1 (new buffers for every op, the
// old ones freed first), DRV_RS_GROUP=1 (each op in a group of its own). The inputs are small
// integers, new for every op, so that every order of the sum (and a 2-rank average) is exact: each
// rank checks its output against the sum it makes itself. Prints <tag>.rc (the first failure),
// <tag>.data_ok, <tag>.wrong (elements wrong) and <tag>.async (ncclCommGetAsyncError after the
// ops).
// Captured reduce-scatters first, with DRV_RS_CAPTURE=1: DRV_RS_CAPTURE_OPS (default 1) ops,
// each with buffers of its own (DRV_RS_CAPTURE_GROUP=1: in one group, their reductions destroyed
// before the group ends), captured into one graph on the rank's stream (global mode), the
// graph launched DRV_RS_REPLAYS times (default 3), fresh inputs (and a poisoned output) before
// each launch, every op's output checked after it: <tag>.capture_rc (the first captured call's
// error), <tag>.end_capture, <tag>.instantiate, <tag>.launch_rc, <tag>.replay_ok (replays whose
// every output was right); then the eager ops as above. DRV_RS_CAPTURE_DISCARD=1 first captures
// one such graph and destroys it unlaunched (<tag>.discard_rc). DRV_SLEEP_BEFORE_REPLAY_MS
// sleeps before each launch. Wrong elements of the replays count in <tag>.wrong too.
float rs_input(int rank, long op, size_t i) {
  return static_cast<float>((static_cast<size_t>(rank) * 5 + static_cast<size_t>(op) * 3 + i * 7) %
                            13);
}

// Rank r's scalar of a pre-multiplied sum: 0.5, 1 or 2, so that every sum stays exact.
float rs_scalar(int rank) { return static_cast<float>(1 << (rank % 3)) * 0.5f; }

// Makes this rank's pre-multiplied sum for `type` (bf16: the float's top half, exact here), its
// scalar in `device_scalar` where DRV_RS_SCALAR puts it on the device.
ncclRedOp_t make_premul(ncclComm_t c, int r, bool bf16, uint8_t* device_scalar) {
  const std::string where = env_str("DRV_RS_SCALAR", "host");
  const bool on_device = where == "device" || (where == "mixed" && r % 2 == 1);
  const float f = rs_scalar(r);
  uint32_t bits;
  memcpy(&bits, &f, 4);
  const uint16_t top = static_cast<uint16_t>(bits >> 16);
  const void* value = bf16 ? static_cast<const void*>(&top) : &bits;
  void* scalar = const_cast<void*>(value);
  if (on_device) {
    memcpy(device_scalar, value, bf16 ? 2 : 4);
    scalar = device_scalar;
  }
  ncclRedOp_t op = ncclSum;
  const ncclResult_t res =
      ncclRedOpCreatePreMulSum(&op, scalar, bf16 ? ncclBfloat16 : ncclFloat,
                               on_device ? ncclScalarDevice : ncclScalarHostImmediate, c);
  if (res != ncclSuccess) {
    out("premul_create_failed", res);
    _exit(4);
  }
  return op;
}

// One reduce-scatter's buffers and its settings (DRV_RS_*): fills its input for an op's number,
// checks its output against the sum of every rank's input for that number.
class RsOp {
 public:
  RsOp(int r, int n, int device = g_device)
      : r_(r),
        n_(n),
        device_(device),
        count_(static_cast<size_t>(env_long("DRV_RS_COUNT", 1000))),
        bf16_(env_str("DRV_RS_TYPE", "float") == "bf16"),
        avg_(env_str("DRV_RS_OP", "sum") == "avg"),
        premul_(env_str("DRV_RS_OP", "sum") == "premul"),
        in_place_(env_long("DRV_RS_IN_PLACE", 0) == 1),
        elem_(bf16_ ? 2 : 4),
        chunk_(count_ * elem_),
        scalar_(4, device, std::vector<int>{device}) {}

  // New buffers (the old ones freed first).
  void renew() {
    send_.reset();
    recv_.reset();
    send_ = std::make_unique<Buffer>(chunk_ * static_cast<size_t>(n_), device_,
                                     std::vector<int>{device_});
    if (!in_place_) recv_ = std::make_unique<Buffer>(chunk_, device_, std::vector<int>{device_});
  }
  bool has_buffers() const { return send_ != nullptr; }

  void fill(long op) {
    for (size_t i = 0; i < count_ * static_cast<size_t>(n_); ++i)
      store(send_->data() + i * elem_, rs_input(r_, op, i));
    if (!in_place_) memset(out(), 0xee, chunk_);
  }

  // The call, its reduction made before it and destroyed after it; *destroyed: the destroy's.
  ncclResult_t issue(ncclComm_t c, CUstream stream, ncclResult_t* destroyed) {
    const ncclRedOp_t redop = premul_ ? make_premul(c, r_, bf16_, scalar_.data())
                              : avg_  ? ncclAvg
                                      : ncclSum;
    const ncclResult_t res =
        ncclReduceScatter(send_->data(), out(), count_, bf16_ ? ncclBfloat16 : ncclFloat, redop, c,
                          reinterpret_cast<cudaStream_t>(stream));
    *destroyed = premul_ ? ncclRedOpDestroy(redop, c) : ncclSuccess;
    return res;
  }

  long wrong(long op) const {
    long wrong = 0;
    for (size_t i = 0; i < count_; ++i) {
      float want = 0;
      for (int p = 0; p < n_; ++p)
        want +=
            rs_input(p, op, static_cast<size_t>(r_) * count_ + i) * (premul_ ? rs_scalar(p) : 1);
      if (avg_) want *= 0.5f;
      wrong += load(out() + i * elem_) != want;
    }
    return wrong;
  }

 private:
  uint8_t* out() const {
    return in_place_ ? send_->data() + static_cast<size_t>(r_) * chunk_ : recv_->data();
  }
  void store(uint8_t* at, float v) const {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    if (bf16_) {
      const uint16_t top = static_cast<uint16_t>(bits >> 16);  // exact: small integers
      memcpy(at, &top, 2);
    } else {
      memcpy(at, &bits, 4);
    }
  }
  float load(const uint8_t* at) const {
    uint32_t bits = 0;
    if (bf16_) {
      uint16_t top;
      memcpy(&top, at, 2);
      bits = static_cast<uint32_t>(top) << 16;
    } else {
      memcpy(&bits, at, 4);
    }
    float v;
    memcpy(&v, &bits, 4);
    return v;
  }

  int r_, n_, device_;
  size_t count_;
  bool bf16_, avg_, premul_, in_place_;
  size_t elem_, chunk_;
  Buffer scalar_;  // a device-resident scalar's home
  std::unique_ptr<Buffer> send_, recv_;
};

// DRV_RS_CAPTURE_OPS reduce-scatters captured into one graph on `stream`; *rc: the first
// failure of a captured call; null when the capture failed (*end says how).
CUgraph capture_reduce_scatters(ncclComm_t c, CUstream stream,
                                const std::vector<std::unique_ptr<RsOp>>& ops, ncclResult_t* rc,
                                CUresult* end) {
  CUgraph graph = nullptr;
  *end = cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
  if (*end != CUDA_SUCCESS) return nullptr;
  const bool grouped = env_long("DRV_RS_CAPTURE_GROUP", 0) == 1;
  if (grouped) ncclGroupStart();
  for (const std::unique_ptr<RsOp>& op : ops) {
    ncclResult_t destroyed;
    const ncclResult_t res = op->issue(c, stream, &destroyed);
    if (*rc == ncclSuccess) *rc = res != ncclSuccess ? res : destroyed;
  }
  if (grouped) {
    const ncclResult_t group_end = ncclGroupEnd();
    if (*rc == ncclSuccess) *rc = group_end;
  }
  *end = cuStreamEndCapture(stream, &graph);
  return graph;
}

// DRV_RS_CAPTURE=1's graph, its exec and its ops' buffers: kept until the eager ops after it
// have run (a graph's hold is what tells a host that its replay could never pair).
struct CapturedRs {
  std::vector<std::unique_ptr<RsOp>> ops;
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  ~CapturedRs() {
    if (exec) cuGraphExecDestroy(exec);
    if (graph) cuGraphDestroy(graph);
  }
};

// DRV_RS_CAPTURE=1's part (see above); returns the wrong elements of its replays.
long captured_reduce_scatters(const std::string& tag, ncclComm_t c, int r, int n, CUstream stream,
                              CapturedRs* cap, ncclResult_t* rc) {
  std::vector<std::unique_ptr<RsOp>>& ops = cap->ops;
  for (long k = 0, m = env_long("DRV_RS_CAPTURE_OPS", 1); k < m; ++k) {
    ops.push_back(std::make_unique<RsOp>(r, n));
    ops.back()->renew();
  }
  CUresult end = CUDA_SUCCESS;
  if (env_long("DRV_RS_CAPTURE_DISCARD", 0) == 1) {
    ncclResult_t discard_rc = ncclSuccess;
    if (CUgraph g = capture_reduce_scatters(c, stream, ops, &discard_rc, &end)) cuGraphDestroy(g);
    out(tag + ".discard_rc", discard_rc);
  }
  ncclResult_t capture_rc = ncclSuccess;
  cap->graph = capture_reduce_scatters(c, stream, ops, &capture_rc, &end);
  out(tag + ".capture_rc", capture_rc);
  out(tag + ".end_capture", end);
  if (*rc == ncclSuccess) *rc = capture_rc;
  out(tag + ".instantiate",
      cap->graph ? cuGraphInstantiate(&cap->exec, cap->graph, 0) : CUDA_ERROR_INVALID_VALUE);
  const long replays = env_long("DRV_RS_REPLAYS", 3);
  const long sleep_ms = env_long("DRV_SLEEP_BEFORE_REPLAY_MS", 0);
  const long m = static_cast<long>(ops.size());
  CUresult launch_rc = CUDA_SUCCESS;
  long wrong = 0, ok = 0;
  for (long i = 0; i < replays && cap->exec; ++i) {
    for (long k = 0; k < m; ++k) ops[static_cast<size_t>(k)]->fill(100 + i * m + k);
    if (sleep_ms > 0) usleep(static_cast<useconds_t>(sleep_ms) * 1000);
    const CUresult launched = cuGraphLaunch(cap->exec, stream);
    cuStreamSynchronize(stream);
    if (launch_rc == CUDA_SUCCESS) launch_rc = launched;
    long wrong_here = 0;
    for (long k = 0; k < m; ++k) wrong_here += ops[static_cast<size_t>(k)]->wrong(100 + i * m + k);
    wrong += wrong_here;
    ok += launched == CUDA_SUCCESS && wrong_here == 0;
  }
  out(tag + ".launch_rc", launch_rc);
  out(tag + ".replay_ok", ok);
  return wrong + (cap->exec ? 0 : 1);
}

void reduce_scatter(const std::string& tag, ncclComm_t c, int r, int n) {
  const bool fresh_each = env_long("DRV_RS_FRESH", 0) == 1;
  const bool grouped = env_long("DRV_RS_GROUP", 0) == 1;
  CUstream stream = nullptr;
  cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING);
  ncclResult_t rc = ncclSuccess;
  long wrong = 0;
  CapturedRs captured;
  if (env_long("DRV_RS_CAPTURE", 0) == 1)
    wrong += captured_reduce_scatters(tag, c, r, n, stream, &captured, &rc);
  RsOp rs(r, n);
  for (long op = 0, repeat = env_long("DRV_RS_REPEAT", 3); op < repeat; ++op) {
    if (!rs.has_buffers() || fresh_each) rs.renew();
    rs.fill(op);
    if (grouped) ncclGroupStart();
    ncclResult_t destroyed = ncclSuccess;
    ncclResult_t res = rs.issue(c, stream, &destroyed);
    if (rc == ncclSuccess) rc = destroyed;
    if (grouped) {
      const ncclResult_t end = ncclGroupEnd();
      if (res == ncclSuccess) res = end;
    }
    if (stream) cuStreamSynchronize(stream);
    if (rc == ncclSuccess) rc = res;
    wrong += rs.wrong(op);
  }
  if (stream) cuStreamDestroy(stream);
  ncclResult_t state = ncclSuccess;
  const ncclResult_t poll = ncclCommGetAsyncError(c, &state);
  out(tag + ".async", poll != ncclSuccess ? poll : state);
  out(tag + ".rc", rc);
  out(tag + ".wrong", wrong);
  out(tag + ".data_ok", wrong == 0 ? 1 : 0);
}

// Polls until not in progress (at most 2000 polls); <tag>.polls_in_progress, <tag>.async,
// <tag>.ready_before (comms_ce_ready before the poll that saw the comm ready) and
// <tag>.ready_at (right after it).
void poll_ready(const std::string& tag, ncclComm_t c) {
  using GetStats = int (*)(zerocta_stats_t*);
  auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "zerocta_get_stats"));
  auto ce_ready = [get]() -> long long {
    zerocta_stats_t s;
    return get && get(&s) == 0 ? static_cast<long long>(s.comms_ce_ready) : -1;
  };
  int in_progress = 0;
  ncclResult_t state = ncclInProgress, rc = ncclSuccess;
  long long before = ce_ready();
  for (int i = 0; i < 2000; ++i) {
    before = ce_ready();
    state = ncclInProgress;
    rc = ncclCommGetAsyncError(c, &state);
    if (rc != ncclSuccess || state != ncclInProgress) break;
    ++in_progress;
    usleep(1000);
  }
  out(tag + ".polls_in_progress", in_progress);
  out(tag + ".poll_rc", rc);
  out(tag + ".async", state);
  out(tag + ".ready_before", before);
  out(tag + ".ready_at", ce_ready());
}

ncclUniqueId unique_id() {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) {
    out("uniqueid_failed", 1);
    _exit(4);
  }
  return id;
}

// basic's init: ncclCommInitRank or a non-blocking InitRankConfig, maybe in a group with an
// all-gather; polls as DRV_POLL says. Prints init.* and returns the comm (nullptr on failure).
ncclComm_t init_world(int rank, int nranks) {
  nranks = static_cast<int>(env_long("DRV_NRANKS", nranks));
  const ncclUniqueId id = unique_id();
  if (long ms = env_long("DRV_SLEEP_BEFORE_INIT_MS", 0)) usleep(static_cast<useconds_t>(ms) * 1000);
  if (env_long("DRV_LIST_CHANNEL", 0)) out("channel_before_init", channel_names());
  const bool nb = env_long("DRV_NB", 0) == 1;
  const bool group_ag = env_long("DRV_INIT_GROUP_AG", 0) == 1;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t c = nullptr;
  Gather* g = nullptr;
  drv::log_marker((g_prefix + "init").c_str());
  if (group_ag) ncclGroupStart();
  ncclResult_t rc = nb ? ncclCommInitRankConfig(&c, nranks, id, rank, &cfg)
                       : ncclCommInitRank(&c, nranks, id, rank);
  out("init.rc", rc);
  if (group_ag && c != nullptr) {
    g = new Gather(rank, nranks, static_cast<size_t>(env_long("DRV_AG_BYTES", 4096)), g_device);
    out("init_group_ag.rc", g->issue(c));
  }
  if (group_ag) out("init.group_end", ncclGroupEnd());
  if (c == nullptr) return nullptr;
  stats("init");
  out("init.channel_files", channel_count());
  if (long ms = env_long("DRV_SLEEP_AFTER_INIT_MS", 0)) usleep(static_cast<useconds_t>(ms) * 1000);
  if (nb && env_long("DRV_EARLY_DESTROY", 0)) {
    drv::log_marker((g_prefix + "early-destroy").c_str());
    out("early_destroy", ncclCommDestroy(c));
    drv::log_marker((g_prefix + "early-destroy-end").c_str());
  }
  const std::string poll = env_str("DRV_POLL", nb ? "main" : "none");
  if (poll == "main") {
    poll_ready("poll", c);
  } else if (poll == "thread") {
    std::thread t([&] {
      make_current(static_cast<int>(env_long("DRV_DEVICE", rank)));
      poll_ready("poll", c);
    });
    t.join();
  }
  if (g) {
    if (g->stream) cuStreamSynchronize(g->stream);
    out("init_group_ag.data_ok", g->data_ok());
    delete g;
  }
  stats("ready");
  out("ready.channel_files", channel_count());
  return c;
}

void end_comm(ncclComm_t c, const std::string& tag) {
  const std::string how = env_str("DRV_END", "destroy");
  drv::log_marker((g_prefix + "end-" + tag).c_str());
  if (how == "destroy") {
    out(tag + ".destroy", ncclCommDestroy(c));
  } else if (how == "finalize") {
    out(tag + ".finalize", ncclCommFinalize(c));
    out(tag + ".destroy", ncclCommDestroy(c));
  } else if (how == "abort") {
    out(tag + ".abort", ncclCommAbort(c));
  } else if (how == "abort_busy") {
    // As if the route's streams sat behind a kernel that never ends: their events never pass,
    // and a stream synchronization would take 5 s.
    setenv("FAKE_CUDA_BUSY_EVENTS", "1", 1);
    setenv("FAKE_CUDA_DELAY", "cuStreamSynchronize:5000,cuCtxSynchronize:5000", 1);
    const auto t0 = std::chrono::steady_clock::now();
    out(tag + ".abort", ncclCommAbort(c));
    out(tag + ".abort_ms",
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    out(tag + ".parked_hostreg", fake_cuda_live("hostreg"));
    unsetenv("FAKE_CUDA_BUSY_EVENTS");
    unsetenv("FAKE_CUDA_DELAY");
  } else if (how == "kill") {
    kill(getpid(), SIGKILL);
  }
  release_kept_graphs();
}

// NCCL 2.29.7's ncclCommSuspend/ncclCommResume (declared here: the 2.28 header lacks them).
extern "C" ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
extern "C" ncclResult_t ncclCommResume(ncclComm_t comm);

// DRV_SUSPEND=1: after the all-gather, ncclCommSuspend(NCCL_SUSPEND_MEM) (suspend.rc, then the
// shim's pool and the fake driver's live objects as suspended.*), ncclCommResume (resume.rc),
// and one more all-gather (after.*).
void suspend_and_resume(ncclComm_t c, int rank, int nranks) {
  constexpr int kSuspendMem = 0x01;
  out("suspend.rc", ncclCommSuspend(c, kSuspendMem));
  stats("suspended");
  cuda_live("suspended");
  out("resume.rc", ncclCommResume(c));
  all_gather("after", c, rank, nranks);
  stats("after");
}

// Descriptors of this process on the fake driver's memory (its memfds): its own allocations'
// mappings, the fd service's duplicates of its exports, its imports of a peer's allocations.
int memory_descriptors() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      char link[256];
      const std::string path = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t len = readlink(path.c_str(), link, sizeof link - 1);
      if (len > 0 &&
          std::string(link, static_cast<size_t>(len)).find("memfd:fake-cuda") != std::string::npos)
        ++n;
    }
    closedir(d);
  }
  return n;
}

// DRV_IDLE_WATCH_MS=N, after the all-gathers (their buffers freed): every rank meets the others,
// then, making no NCCL call, watches for up to N ms until this process holds nothing of the fake
// driver's memory (no memfd descriptor, no allocation handle, mapping or reservation): idle.*,
// idle.clean_ms = when (-1: not within N ms). Between the markers <rank>.idle-begin and
// <rank>.idle-end; the ranks meet again after it, so no rank calls NCCL while another watches.
void idle_watch(long ms) {
  using Clock = std::chrono::steady_clock;
  if (g_barrier) barrier_of_ranks();
  drv::log_marker((g_prefix + "idle-begin").c_str());
  const Clock::time_point start = Clock::now();
  out("idle.memfds_start", memory_descriptors());
  out("idle.live_map_start", fake_cuda_live("map"));
  long long clean_ms = -1;
  for (;;) {
    const long long waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    if (memory_descriptors() == 0 && fake_cuda_live("alloc") == 0 && fake_cuda_live("map") == 0 &&
        fake_cuda_live("reserve") == 0) {
      clean_ms = waited;
      break;
    }
    if (waited > ms) break;
    usleep(20 * 1000);
  }
  drv::log_marker((g_prefix + "idle-end").c_str());
  out("idle.clean_ms", clean_ms);
  out("idle.memfds", memory_descriptors());
  cuda_live("idle");
  stats("idle");
  if (g_barrier) barrier_of_ranks();
}

void rank_basic(int rank, int nranks) {
  ncclComm_t c = init_world(rank, nranks);
  if (c == nullptr) return;
  if (long ms = env_long("DRV_KILL_AFTER_INIT_MS", -1); ms >= 0) {
    usleep(static_cast<useconds_t>(ms) * 1000);
    kill(getpid(), SIGKILL);
  }
  if (env_long("DRV_AG", 1)) {
    all_gather("ag", c, rank, nranks, env_long("DRV_AG_GROUP", 0) == 1);
    stats("ag");
    if (long ms = env_long("DRV_IDLE_WATCH_MS", 0)) idle_watch(ms);
  }
  if (env_long("DRV_RS", 0) == 1) {
    reduce_scatter("rs", c, rank, nranks);
    stats("rs");
  }
  if (env_long("DRV_SUSPEND", 0) == 1) suspend_and_resume(c, rank, nranks);
  end_comm(c, "world");
  if (env_long("DRV_SECOND_WORLD", 0) == 1) {  // another communicator, made and destroyed
    ncclComm_t again = init_world(rank, nranks);
    if (again == nullptr) return;
    all_gather("again", again, rank, nranks);
    out("again.destroy", ncclCommDestroy(again));
  }
  report("end");
  cuda_live("end");
}

// A peer's abort, as PyTorch's test_abort_pg makes one: both ranks all-gather on the route,
// then rank 0 aborts while rank 1 goes on with an op NCCL runs (an all-reduce) and then asks
// for an all-gather. Prints peer.async (rank 1's ncclCommGetAsyncError after rank 0's abort),
// peer.ar_rc, peer.async_after_ar, peer.ag_rc; rank 0 prints peer.abort.
// DRV_PEER_AHEAD=N instead: rank 0 issues N more all-gathers alone (more than the op ring
// holds, so it ends up waiting for room) while rank 1 sleeps DRV_PEER_ABORT_AFTER_MS (default
// 500) and aborts. Rank 0 prints ahead.rc (the first failed call's result, 0 if none),
// ahead.failed_at (its index), ahead.ms (from its first call to the failed one's return) and
// ahead.abort.
void rank_ahead_of_an_aborting_peer(ncclComm_t c, int rank, int nranks, long ahead) {
  if (rank != 0) {
    usleep(static_cast<useconds_t>(env_long("DRV_PEER_ABORT_AFTER_MS", 500) * 1000));
    out("peer.abort", ncclCommAbort(c));
    return;
  }
  Gather g(rank, nranks, 4096, g_device);
  const auto t0 = std::chrono::steady_clock::now();
  ncclResult_t rc = ncclSuccess;
  long i = 0;
  for (; i < ahead && rc == ncclSuccess; ++i) rc = g.issue(c);
  out("ahead.rc", rc);
  out("ahead.failed_at", rc == ncclSuccess ? -1 : i - 1);
  out("ahead.ms",
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count());
  out("ahead.abort", ncclCommAbort(c));
}

void rank_peer_abort(int rank, int nranks) {
  ncclComm_t c = init_world(rank, nranks);
  if (c == nullptr) return;
  all_gather("ag", c, rank, nranks);
  const bool rs = env_long("DRV_RS", 0) == 1;
  if (rs) {
    reduce_scatter("rs", c, rank, nranks);
    stats("rs");
  }
  barrier_of_ranks();
  if (const long ahead = env_long("DRV_PEER_AHEAD", 0)) {
    rank_ahead_of_an_aborting_peer(c, rank, nranks, ahead);
    return;
  }
  if (rank == 0) {
    out("peer.abort", ncclCommAbort(c));
    barrier_of_ranks();
    return;
  }
  barrier_of_ranks();  // rank 0 has aborted
  auto async_error = [&] {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t poll = ncclCommGetAsyncError(c, &state);
    return poll != ncclSuccess ? poll : state;
  };
  out("peer.async", async_error());
  Gather g(rank, nranks, 4096, g_device);
  out("peer.ar_rc", ncclAllReduce(g.recv.data(), g.recv.data(), 1, ncclFloat, ncclSum, c,
                                  reinterpret_cast<cudaStream_t>(g.stream)));
  out("peer.async_after_ar", async_error());
  out("peer.ag_rc", g.issue(c));
  if (rs)  // 4096 B of floats a rank
    out("peer.rs_rc",
        ncclReduceScatter(g.recv.data(), g.recv.data() + static_cast<size_t>(rank) * 4096, 1024,
                          ncclFloat, ncclSum, c, reinterpret_cast<cudaStream_t>(g.stream)));
  out("peer.abort", ncclCommAbort(c));
}

void rank_two_comms(int rank, int nranks) {
  ncclComm_t first = init_world(rank, nranks);
  ncclComm_t second = first ? init_world(rank, nranks) : nullptr;
  if (second == nullptr) return;
  const size_t bytes = static_cast<size_t>(env_long("DRV_AG_BYTES", 4096));
  Gather a(rank, nranks, bytes, g_device), b(rank, nranks, bytes, g_device);
  constexpr int kSecondPattern = 5;  // b's pattern differs from a's, so a swap shows
  b.fill(kSecondPattern);
  auto gather_a = [&] { return a.issue(first); };
  auto gather_b = [&] {
    return ncclAllGather(b.sent(), b.recv.data(), bytes, ncclUint8, second,
                         reinterpret_cast<cudaStream_t>(a.stream));
  };
  const bool reverse = env_str("DRV_TWO_ORDER", "") == "reverse";
  ncclGroupStart();
  ncclResult_t rc = reverse ? gather_b() : gather_a();
  const ncclResult_t rc2 = reverse ? gather_a() : gather_b();
  if (rc == ncclSuccess) rc = rc2;
  const ncclResult_t end = ncclGroupEnd();
  if (rc == ncclSuccess) rc = end;
  if (a.stream) cuStreamSynchronize(a.stream);
  out("two.rc", rc);
  out("two.data_ok", a.data_ok() && b.data_ok(kSecondPattern));
  stats("two");
  out("two.destroy",
      ncclCommDestroy(first) == ncclSuccess && ncclCommDestroy(second) == ncclSuccess);
}

// A split's or shrink's child: its rank and size, stats after `made_by`, one all-gather on it,
// its destroy.
void use_child(ncclComm_t child, const char* made_by) {
  int r = -1, n = -1;
  ncclCommUserRank(child, &r);
  ncclCommCount(child, &n);
  out("child.rank", r);
  out("child.count", n);
  stats(made_by);
  all_gather("child_ag", child, r, n);
  stats("child_ag");
  if (env_long("DRV_RS", 0) == 1) {
    reduce_scatter("child_rs", child, r, n);
    stats("child_rs");
  }
  out("child.destroy", ncclCommDestroy(child));
  release_kept_graphs();
}

void rank_split(int rank, int nranks) {
  ncclComm_t c = init_world(rank, nranks);
  if (c == nullptr) return;
  const std::string color_text = env_str("DRV_COLOR", "0");
  const int color = color_text == "nocolor" ? NCCL_SPLIT_NOCOLOR : atoi(color_text.c_str());
  ncclComm_t child = nullptr;
  out("split.rc",
      ncclCommSplit(c, color, static_cast<int>(env_long("DRV_KEY", 0)), &child, nullptr));
  out("split.child", child != nullptr ? 1 : 0);
  if (child != nullptr) use_child(child, "split");
  if (env_long("DRV_AG", 1)) all_gather("world_ag", c, rank, nranks);
  end_comm(c, "world");
  report("end");
  cuda_live("end");
}

void rank_shrink(int rank, int nranks) {
  ncclComm_t c = init_world(rank, nranks);
  if (c == nullptr) return;
  std::vector<int> excluded;
  const std::string list = env_str("DRV_EXCLUDE", "");
  for (size_t at = 0; at < list.size();) {
    excluded.push_back(atoi(list.c_str() + at));
    const size_t comma = list.find(',', at);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  bool me_excluded = false;
  for (int x : excluded) me_excluded = me_excluded || x == rank;
  const bool abort_parent = env_long("DRV_SHRINK_ABORT", 0) == 1;
  if (abort_parent) {  // the parent's route in use; the excluded ranks abort it and leave
    all_gather("world_ag", c, rank, nranks);
    if (me_excluded) {
      out("excluded.abort", ncclCommAbort(c));
      return;
    }
  }
  if (!me_excluded) {
    ncclComm_t child = nullptr;
    out("shrink.rc",
        ncclCommShrink(c, excluded.data(), static_cast<int>(excluded.size()), &child, nullptr,
                       abort_parent ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT));
    if (abort_parent) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t poll = ncclCommGetAsyncError(c, &state);
      out("shrink.parent_async", poll != ncclSuccess ? poll : state);
    }
    if (child != nullptr) use_child(child, "shrink");
  }
  end_comm(c, "world");
  report("end");
  cuda_live("end");
}

void rank_fork(int rank, int nranks) {
  ncclComm_t c = init_world(rank, nranks);
  if (c == nullptr) return;
  all_gather("ag", c, rank, nranks);
  report("before_fork");
  const std::string parent_prefix = g_prefix;
  pid_t pid = fork();
  if (pid == 0) {
    alarm(static_cast<unsigned>(env_long("DRV_TIMEOUT_S", 20)));
    g_prefix = parent_prefix + "child.";
    // The parent's kept graphs and buffers are the parent's to destroy: forgotten here.
    for (CapturedGather& cg : g_kept) (void)cg.buffers.release();
    g_kept.clear();
    out("pid", getpid());
    out("fd_threads_at_start", fd_threads());
    setenv("FAKE_NCCL_COMM_ID", (env_str("FAKE_NCCL_COMM_ID", "x") + "-child").c_str(), 1);
    ncclComm_t cc = init_world(rank, nranks);
    if (cc != nullptr) {
      all_gather("ag", cc, rank, nranks);
      stats("ag");
      out("destroy", ncclCommDestroy(cc));
      release_kept_graphs();
    }
    report("end");
    _exit(0);
  }
  all_gather("after_fork_ag", c, rank, nranks);
  stats("after_fork");
  int status = 0;
  waitpid(pid, &status, 0);
  out("child_exit", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  end_comm(c, "world");
  report("end");
}

void rank_hang(int rank, int nranks) {
  const long ms = env_long("DRV_KILL_MS", 300);
  std::thread([ms] {
    usleep(static_cast<useconds_t>(ms) * 1000);
    kill(getpid(), SIGKILL);
  }).detach();
  init_world(rank, nranks);  // never completes: the other ranks never come
}

// Entries of a /proc/self directory ("fd", "task").
int proc_entries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir((std::string("/proc/self/") + dir).c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n - (std::string(dir) == "fd");  // less opendir's own descriptor
}

long resident_kib() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

void resources(const std::string& tag) {
  stats(tag);
  cuda_live(tag);
  out(tag + ".fds", proc_entries("fd"));
  out(tag + ".threads", proc_entries("task"));
  out(tag + ".rss_kib", resident_kib());
  out(tag + ".channel_files", channel_count());
}

// Destroys communicators on a thread of its own, up to `lag` behind their creation (as
// process groups torn down in the background are): DRV_CYCLES_DESTROY_LAG.
class LaggingDestroyer {
 public:
  explicit LaggingDestroyer(long lag) : lag_(lag), thread_([this] { run(); }) {}
  ~LaggingDestroyer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void hand_over(ncclComm_t c) {
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back(c);
    cv_.notify_all();
    cv_.wait(lock, [this] { return static_cast<long>(queue_.size()) <= lag_; });
  }

 private:
  void run() {
    make_current(g_device);
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      ncclComm_t c = queue_.front();
      queue_.pop_front();
      lock.unlock();
      ncclCommDestroy(c);
      lock.lock();
      cv_.notify_all();
    }
  }
  long lag_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ncclComm_t> queue_;
  bool stop_ = false;
  std::thread thread_;
};

void rank_cycles(int rank, int nranks) {
  const long cycles = env_long("DRV_CYCLES", 100), warm = env_long("DRV_CYCLES_WARM", 5);
  const long lag = env_long("DRV_CYCLES_DESTROY_LAG", 0);
  std::unique_ptr<LaggingDestroyer> destroyer;
  if (lag > 0) destroyer = std::make_unique<LaggingDestroyer>(lag);
  for (long i = 1; i <= cycles; ++i) {
    ncclComm_t c = init_world(rank, nranks);
    if (c == nullptr) return;
    all_gather("ag", c, rank, nranks);
    if (destroyer)
      destroyer->hand_over(c);
    else
      end_comm(c, "world");
    if (i == warm) resources("warm");
  }
  destroyer.reset();
  resources("last");
}

int grouped_ranks(int first, int local, int n);  // below, with the single-process scenarios

int run_ranks(int nranks, const std::string& scenario, int argc, char** argv) {
  void* shared =
      mmap(nullptr, sizeof(RankBarrier), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return 3;
  g_barrier = new (shared) RankBarrier;
  g_nranks = nranks;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nranks; ++rank) {
    pid_t pid = fork();
    if (pid < 0) return 3;
    if (pid == 0) {
      alarm(static_cast<unsigned>(env_long("DRV_TIMEOUT_S", 20)));
      g_prefix = "r" + std::to_string(rank) + ".";
      const std::string mine = "r" + std::to_string(rank) + ":";
      for (int i = 0; i < argc; ++i) {
        std::string a = argv[i];
        if (a.rfind(mine, 0) != 0) continue;
        a = a.substr(mine.size());
        const size_t eq = a.find('=');
        if (eq != std::string::npos) setenv(a.substr(0, eq).c_str(), a.substr(eq + 1).c_str(), 1);
      }
      out("pid", getpid());
      g_device = static_cast<int>(env_long("DRV_DEVICE", rank));
      make_current(g_device);
      if (scenario == "basic")
        rank_basic(rank, nranks);
      else if (scenario == "split")
        rank_split(rank, nranks);
      else if (scenario == "shrink")
        rank_shrink(rank, nranks);
      else if (scenario == "fork")
        rank_fork(rank, nranks);
      else if (scenario == "hang")
        rank_hang(rank, nranks);
      else if (scenario == "cycles")
        rank_cycles(rank, nranks);
      else if (scenario == "twocomms")
        rank_two_comms(rank, nranks);
      else if (scenario == "peerabort")
        rank_peer_abort(rank, nranks);
      else if (scenario == "grouped") {  // this process drives DRV_LOCAL_RANKS ranks
        const int local = static_cast<int>(env_long("DRV_LOCAL_RANKS", 2));
        grouped_ranks(rank * local, local, nranks * local);
      } else
        out("unknown_scenario", scenario);
      out("done", 1);
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (int rank = 0; rank < nranks; ++rank) {
    int status = 0;
    waitpid(pids[static_cast<size_t>(rank)], &status, 0);
    drv::out("r" + std::to_string(rank) + ".exit",
             WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return 0;
}

// ---- Single-process scenarios ----

cudaStream_t fake_stream() { return static_cast<cudaStream_t>(drv::fake_stream(1)); }

// Every creation path of the default mode, with the collectives and registrations a program
// makes on them. The ids come from FAKE_NCCL_COMM_ID (no renumbering when the shim rebuilds
// ncclCommInitAll with an id of its own).
int default_log() {
  make_current(0);
  ncclUniqueId id = unique_id();
  void* b = drv::fake_buffer(1);
  auto ag = [&](ncclComm_t c) { return ncclAllGather(b, b, 64, ncclFloat32, c, fake_stream()); };

  drv::log_marker("init-rank");
  ncclComm_t a = nullptr;
  out("a.init", ncclCommInitRank(&a, 2, id, 0));
  out("a.ag", ag(a));
  out("a.ar", ncclAllReduce(b, b, 64, ncclFloat32, ncclSum, a, fake_stream()));
  void* mem = nullptr;
  out("a.memalloc", ncclMemAlloc(&mem, 1 << 16));
  ncclWindow_t win = nullptr;
  out("a.winreg", ncclCommWindowRegister(a, mem, 1 << 16, &win, NCCL_WIN_COLL_SYMMETRIC));
  out("a.win_ag",
      ncclAllGather(mem, static_cast<char*>(mem) + 4096, 256, ncclFloat32, a, fake_stream()));
  out("a.windereg", ncclCommWindowDeregister(a, win));
  out("a.memfree", ncclMemFree(mem));

  drv::log_marker("split-one");
  ncclComm_t sa = nullptr, none = nullptr;
  out("sa.split", ncclCommSplit(a, 0, 0, &sa, nullptr));
  out("none.split", ncclCommSplit(a, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr));
  if (sa) {
    out("sa.ag", ag(sa));
    out("sa.a2a", ncclAlltoAll(b, b, 16, ncclFloat32, sa, fake_stream()));
    out("sa.destroy", ncclCommDestroy(sa));
  }

  drv::log_marker("init-all");
  ncclComm_t all[2] = {};
  out("all.init", ncclCommInitAll(all, 2, nullptr));
  drv::log_marker("split");
  ncclComm_t kids[2] = {};
  ncclGroupStart();
  out("split0", ncclCommSplit(all[0], 0, 1, &kids[0], nullptr));
  out("split1", ncclCommSplit(all[1], 0, 0, &kids[1], nullptr));
  out("split.end", ncclGroupEnd());
  ncclGroupStart();
  for (ncclComm_t k : kids)
    if (k) out("kid.ag", ag(k));
  out("kid.ag.end", ncclGroupEnd());
  for (ncclComm_t k : kids)
    if (k) out("kid.ar", ncclAllReduce(b, b, 64, ncclFloat32, ncclSum, k, fake_stream()));

  drv::log_marker("grouped-init");
  ncclComm_t g[2] = {};
  ncclGroupStart();
  for (int i = 0; i < 2; ++i) {
    make_current(i);
    out("g.init", ncclCommInitRank(&g[i], 2, id, i));
  }
  for (ncclComm_t c : g)
    if (c) out("g.ag", ag(c));
  out("g.end", ncclGroupEnd());
  make_current(0);

  drv::log_marker("nonblocking");
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t nb = nullptr;
  out("nb.init", ncclCommInitRankConfig(&nb, 2, id, 0, &cfg));
  ncclGroupStart();
  ncclResult_t state = ncclInProgress;
  for (int i = 0; i < 100 && nb; ++i) {
    state = ncclInProgress;
    if (ncclCommGetAsyncError(nb, &state) != ncclSuccess || state != ncclInProgress) break;
  }
  out("nb.async", state);
  out("nb.end", ncclGroupEnd());
  if (nb) out("nb.ag", ag(nb));

  drv::log_marker("never-polled");
  ncclComm_t np = nullptr;
  out("np.init", ncclCommInitRankConfig(&np, 2, id, 0, &cfg));
  if (np) {
    out("np.finalize", ncclCommFinalize(np));
    out("np.destroy", ncclCommDestroy(np));
    out("np.abort", ncclCommAbort(np));
  }

  drv::log_marker("teardown");
  for (ncclComm_t c : {nb, g[0], g[1], kids[0], kids[1], all[0], all[1], a})
    if (c) ncclCommDestroy(c);
  drv::log_marker("end");
  out("fd_threads", fd_threads());
  out("channel_files", channel_count());
  stats("end");
  return 0;
}

// DRV_GROUPED_RS=1 (every rank in this process): one reduce-scatter of each rank in a group
// (rs.wrong: elements wrong), then the communicators destroyed one by one, highest rank first,
// with the fake driver's live address reservations after each (rs.live_reserve<k>: after k
// destroys), and after the buffers are freed (rs.live_reserve_end).
int grouped_reduce_scatters(int first, int n, const std::vector<ncclComm_t>& c) {
  std::vector<std::unique_ptr<RsOp>> ops;
  long wrong = 0;
  ncclResult_t rc = ncclSuccess;
  for (size_t i = 0; i < c.size(); ++i) {
    const int r = first + static_cast<int>(i);
    ops.push_back(std::make_unique<RsOp>(r, n, r));
    ops.back()->renew();
    ops.back()->fill(0);
  }
  ncclGroupStart();
  for (size_t i = 0; i < c.size(); ++i) {
    make_current(first + static_cast<int>(i));
    ncclResult_t destroyed = ncclSuccess;
    const ncclResult_t res = ops[i]->issue(c[i], nullptr, &destroyed);
    if (rc == ncclSuccess) rc = res != ncclSuccess ? res : destroyed;
  }
  const ncclResult_t end = ncclGroupEnd();
  if (rc == ncclSuccess) rc = end;
  for (const std::unique_ptr<RsOp>& op : ops) wrong += op->wrong(0);
  out("rs.rc", rc);
  out("rs.wrong", wrong);
  stats("rs");
  out("rs.live_reserve0", fake_cuda_live("reserve"));
  for (size_t k = c.size(); k-- > 0;) {
    out("destroy", ncclCommDestroy(c[k]));
    out("rs.live_reserve" + std::to_string(c.size() - k), fake_cuda_live("reserve"));
  }
  ops.clear();
  out("rs.live_reserve_end", fake_cuda_live("reserve"));
  return 0;
}

// One thread creates ranks `first` .. `first + local - 1` of a communicator of `n` ranks in one
// group (the rest, if any, in other processes), then all-gathers on all of them in another group
// (the multi-GPU-per-process pattern), or with DRV_AG_UNGROUPED=1 one by one, outside any group.
// DRV_AG_WINDOWS=1: each op's buffers registered as symmetric windows first (NCCL may take its
// CE path); DRV_AG_LEGACY_STREAM=1: the ops on the legacy default stream.
// DRV_AG_OWN_ACCESS=1: each buffer readable by its own device only (cuMem memory whose access
// the application did not grant the peers; else every device of this process). DRV_AG_GROUP_OPS=2:
// two all-gathers per rank in the group, each rank's both in turn. Each key is printed once per
// round (the last round's value wins).
int grouped_ranks(int first, int local, int n) {
  const ncclUniqueId id = unique_id();
  std::vector<ncclComm_t> c(static_cast<size_t>(local), nullptr);
  ncclGroupStart();
  for (int i = 0; i < local; ++i) {
    make_current(first + i);
    out("init" + std::to_string(first + i),
        ncclCommInitRank(&c[static_cast<size_t>(i)], n, id, first + i));
    int r = -77;
    ncclCommUserRank(c[static_cast<size_t>(i)], &r);
    out("in_group.rank" + std::to_string(first + i), r);
  }
  out("group_end", ncclGroupEnd());
  stats("init");
  out("init.channel_files", channel_count());
  for (ncclComm_t x : c)
    if (!x) return 0;
  const long rounds = env_long("DRV_AG_ROUNDS", 1);
  for (long round = 0; round < rounds; ++round) {
    const size_t bytes = static_cast<size_t>(env_long("DRV_AG_BYTES", 4096));
    const bool own = env_long("DRV_AG_OWN_ACCESS", 0) == 1;
    const bool twice = env_long("DRV_AG_GROUP_OPS", 1) == 2;
    const bool grouped = env_long("DRV_AG_UNGROUPED", 0) != 1;
    const bool windows = env_long("DRV_AG_WINDOWS", 0) == 1;
    const bool legacy = env_long("DRV_AG_LEGACY_STREAM", 0) == 1;
    std::vector<int> here;
    for (int i = 0; i < local; ++i) here.push_back(first + i);
    std::vector<std::unique_ptr<Gather>> g, h;
    for (int i = 0; i < local; ++i) {
      const int r = first + i;
      const std::vector<int> access = own ? std::vector<int>{r} : here;
      g.emplace_back(new Gather(r, n, bytes, r, access));
      h.emplace_back(new Gather(r, n, bytes, r, access));
    }
    // Across processes (fake streams run at issue, a flag wait does not hold them): every
    // process's buffers are filled before any pushes into them, and every process has issued
    // before any checks what landed.
    for (int i = 0; i < local && windows; ++i)
      g[static_cast<size_t>(i)]->register_windows(c[static_cast<size_t>(i)]);
    if (g_barrier) barrier_of_ranks();
    if (grouped) ncclGroupStart();
    for (int i = 0; i < local; ++i) {
      make_current(first + i);
      const std::string r = std::to_string(first + i);
      out("ag" + r, g[static_cast<size_t>(i)]->issue(c[static_cast<size_t>(i)], legacy));
      if (twice) out("ag" + r + "b", h[static_cast<size_t>(i)]->issue(c[static_cast<size_t>(i)]));
    }
    if (grouped) out("ag.end", ncclGroupEnd());
    if (g_barrier) barrier_of_ranks();
    for (int i = 0; i < local; ++i) {
      const std::string r = std::to_string(first + i);
      out("ag" + r + ".data_ok", g[static_cast<size_t>(i)]->data_ok());
      if (twice) out("ag" + r + "b.data_ok", h[static_cast<size_t>(i)]->data_ok());
    }
    // Every process saw its data before any frees its buffers: a push the shim's issuer makes
    // later still reads them (on a GPU the buffers' streams would wait for it).
    if (g_barrier) barrier_of_ranks();
    stats("ag");
  }
  out("rounds.live_reserve", fake_cuda_live("reserve"));
  if (env_long("DRV_GROUPED_RS", 0) == 1) return grouped_reduce_scatters(first, n, c);
  for (ncclComm_t x : c) out("destroy", ncclCommDestroy(x));
  report("end");
  cuda_live("end");
  return 0;
}

// Every rank of DRV_GROUPED_RANKS (default 2) in this process: grouped_ranks over all of them.
int grouped_init() {
  out("pid", getpid());
  make_current(0);
  const int n = static_cast<int>(env_long("DRV_GROUPED_RANKS", 2));
  return grouped_ranks(0, n, n);
}

// ncclCommInitAll(2) and a split of both comms into one child with reversed keys: in one group
// from one thread, or (DRV_SPLIT_THREADS=1) one thread per comm without a group.
int initall_split() {
  out("pid", getpid());
  make_current(0);
  ncclComm_t all[2] = {};
  out("initall", ncclCommInitAll(all, 2, nullptr));
  stats("initall");
  if (!all[0] || !all[1]) return 0;
  ncclComm_t kids[2] = {};
  if (env_long("DRV_SPLIT_THREADS", 0)) {
    std::thread t[2];
    ncclResult_t rc[2] = {};
    for (int i = 0; i < 2; ++i)
      t[i] = std::thread([&, i] {
        make_current(i);
        rc[i] = ncclCommSplit(all[i], 0, 1 - i, &kids[i], nullptr);
      });
    for (auto& th : t) th.join();
    out("split0", rc[0]);
    out("split1", rc[1]);
  } else {
    ncclGroupStart();
    out("split0", ncclCommSplit(all[0], 0, 1, &kids[0], nullptr));
    out("split1", ncclCommSplit(all[1], 0, 0, &kids[1], nullptr));
    out("split.end", ncclGroupEnd());
  }
  stats("split");
  if (!kids[0] || !kids[1]) {
    out("children", 0);
    return 0;
  }
  int r[2] = {-1, -1};
  for (int i = 0; i < 2; ++i) {
    ncclCommUserRank(kids[i], &r[i]);
    out("kid" + std::to_string(i) + ".rank", r[i]);
  }
  {
    const size_t bytes = static_cast<size_t>(env_long("DRV_AG_BYTES", 4096));
    Gather g0(r[0], 2, bytes, 0, {0, 1}), g1(r[1], 2, bytes, 1, {0, 1});
    ncclGroupStart();
    make_current(0);
    out("ag0", g0.issue(kids[0]));
    make_current(1);
    out("ag1", g1.issue(kids[1]));
    out("ag.end", ncclGroupEnd());
    out("ag0.data_ok", g0.data_ok());
    out("ag1.data_ok", g1.data_ok());
    stats("ag");
  }
  for (ncclComm_t x : {kids[0], kids[1], all[0], all[1]}) out("destroy", ncclCommDestroy(x));
  report("end");
  cuda_live("end");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: drv_route SCENARIO | ranks N SCENARIO [rK:VAR=VALUE ...]\n");
    return 64;
  }
  const std::string s = argv[1];
  if (s == "ranks" && argc >= 4) {
    alarm(static_cast<unsigned>(env_long("DRV_TIMEOUT_S", 20) + 5));
    return run_ranks(atoi(argv[2]), argv[3], argc - 4, argv + 4);
  }
  alarm(static_cast<unsigned>(env_long("DRV_TIMEOUT_S", 20)));
  if (s == "default-log") return default_log();
  if (s == "grouped-init") return grouped_init();
  if (s == "initall-split") return initall_split();
  fprintf(stderr, "drv_route: unknown scenario %s\n", argv[1]);
  return 64;
}
