// Randomized reduce-scatter soak for the shim's copy-engine route (ZEROCTA_REDUCESCATTER=zerocta).
//
// Two ranks, one process per GPU, run ZCTEST_RS_SOAK_OPS reduce-scatters through the public
// ncclReduceScatter (the shim's when it is preloaded) and check each rank's output bit for bit
// against NCCL's own result for the same inputs: the same op on a second communicator created
// and driven through the loaded libnccl.so.2's own symbols (dlopen RTLD_NOLOAD, dlsym), which
// the shim never sees. Both are also compared with the exact sum in float64; the largest
// difference per datatype is printed (NCCL's and the shim's must be the same on 2 ranks).
//
// Every iteration all ranks draw from a shared generator: one reduce-scatter, a group of 2-3,
// or a CUDA graph capturing 1-3 (grouped or not) that is replayed 3 times with fresh inputs
// before each replay; and per op a datatype the route sums (float, bfloat16, half), a reduction
// (sum, average, or a pre-multiplied sum: see below) and a receive count whose input is
// log-uniform from 1 element a rank to ZCTEST_RS_SOAK_MAX_BYTES (some next to powers of two).
// Each rank then chooses on its own: in place (recv = send + rank * recvcount * size) or not,
// the stream (legacy, per-thread, a blocking or a non-blocking stream of its own), offsets of a
// few elements into its buffers, a delay of up to 2 ms before an op (so that either rank lags),
// and, now and then, new buffers (the old ones freed first) from cudaMalloc or from cuMem in
// expandable-segment pieces. Inputs are fresh finite values every op (regenerable from a seed
// by any rank, so the float64 reference needs no exchange), outputs and the bytes beside every
// buffer are poisoned with NaNs first, and the input must be left as it was.
//
// A pre-multiplied sum is PyTorch's: every rank makes the op with ncclRedOpCreatePreMulSum
// right before the call, with a scalar of its own, on the communicator under test and on the
// reference alike, and destroys it as soon as the call has returned (in a group: before the
// group ends). Rank q's scalar is kPreMulScalars[(pick + q) % 5], pick drawn per op alike on
// every rank (so any rank knows every rank's scalar and up to 5 ranks all differ), rounded to
// the type; it resides on the host (ncclScalarHostImmediate) or, drawn alike on every rank, in
// a device buffer of the soak's that outlives the op (ncclScalarDevice).
//
// Routes: with ZCTEST_RS_SOAK_EXPECT_CE=1 (the default when the shim is preloaded with
// ZEROCTA_REDUCESCATTER=zerocta) every eager reduce-scatter must have taken the copy-engine
// route (the shim's counters, zerocta_get_stats, advance by one per op), a captured one too (by
// one per captured call: its replays are the graph's).
//
// Hangs fail: a stream not done within ZCTEST_OP_TIMEOUT_S (60) fails the rank, an iteration
// not done within ZCTEST_RS_SOAK_WATCHDOG_S (120; host calls that block included) ends it,
// naming the op, and the harness kills whatever is left.
//
//   ZCTEST_RS_SOAK_OPS (10000)  ZCTEST_RS_SOAK_MAX_BYTES (512 MiB of input)
//   ZCTEST_RS_SOAK_SEED (1)
//   ZCTEST_RS_SOAK_CI=1: a CI-size run, 400 ops of up to 64 MiB (the two above still win)
//   ZCTEST_RS_SOAK_NRANKS (2)  ZCTEST_RS_SOAK_BITWISE (1 on 2 ranks: equal bits to NCCL's
//     required; on more ranks NCCL's order of the sum is its ring's, so only the float64
//     bound is)
//   ZCTEST_RS_SOAK_MOVE_EVERY=N (25): a rank moves its buffers before about one iteration in N
//     (0: never)
//   ZCTEST_RS_SOAK_PREMUL (1): 0 draws no pre-multiplied sums (a library that leaves them to
//     NCCL then still passes ZCTEST_RS_SOAK_EXPECT_CE=1)
//   ZCTEST_RS_SOAK_TIMEOUT_S (600 + ops / 5)  ZCTEST_RS_SOAK_VERBOSE=1: every op's plan
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_gtest.h"
#include "gpu_kernels.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "rs_soak_kernels.h"
#include "soak_common.h"
#include "test_data.h"

namespace zgpu {
namespace {

constexpr size_t kGuard = 256;  // poisoned bytes after each buffer of an op
constexpr size_t kAlign = 256;  // where each op's buffers start before their offsets
constexpr size_t kMaxOffsetElems = 63;
constexpr int kMaxOps = 3;  // reduce-scatters of one group or graph
constexpr int kReplays = 3;
constexpr int kMaxReports = 20;
constexpr uint8_t kNanPoison = 0xFF;  // a NaN in float, half and bfloat16 alike
constexpr int kWatchdogExit = 71;
// Added to the poison offsets of an out-of-place output, to tell them from the input's.
constexpr unsigned long long kOutputPoisonBase = 1ull << 48;

struct RoutedType {
  ncclDataType_t nccl;
  RsElem elem;
  const char* name;
};
constexpr RoutedType kRoutedTypes[] = {{ncclFloat32, RsElem::kF32, "float32"},
                                       {ncclBfloat16, RsElem::kBF16, "bfloat16"},
                                       {ncclFloat16, RsElem::kF16, "float16"}};
constexpr int kTypes = static_cast<int>(sizeof kRoutedTypes / sizeof kRoutedTypes[0]);

// The reductions the soak draws (RsRed's order): NCCL's two built-in ones the route sums, and,
// last (ZCTEST_RS_SOAK_PREMUL=0 leaves it out), a pre-multiplied sum made per call (kNoRedOp
// here: the op is the call's own).
constexpr ncclRedOp_t kNoRedOp = ncclMaxRedOp;
struct RoutedRed {
  RsRed kind;
  ncclRedOp_t nccl;
  const char* name;
};
constexpr RoutedRed kRoutedReds[] = {{RsRed::kSum, ncclSum, "sum"},
                                     {RsRed::kAvg, ncclAvg, "avg"},
                                     {RsRed::kPreMulSum, kNoRedOp, "premul"}};
constexpr int kReds = static_cast<int>(sizeof kRoutedReds / sizeof kRoutedReds[0]);
// A pre-multiplied sum's scalars: exact in every type but 1/3, which each type rounds.
constexpr double kPreMulScalars[] = {0.5, 0.25, 1.5, 3.0, 1.0 / 3.0};
constexpr int kPreMulScalarCount =
    static_cast<int>(sizeof kPreMulScalars / sizeof kPreMulScalars[0]);

enum class IterKind { kSingle, kGroup, kGraph };
const char* iter_name(IterKind k) {
  return k == IterKind::kSingle ? "single" : k == IterKind::kGroup ? "group" : "graph";
}

struct OpPlan {
  // Alike on every rank.
  int type = 0;                   // into kRoutedTypes
  int red = 0;                    // into kRoutedReds
  int scalar_pick = 0;            // pre-multiplied sum: rank q's scalar is entry pick + q
  bool scalar_on_device = false;  // pre-multiplied sum: ncclScalarDevice, else HostImmediate
  size_t recvcount = 0;
  // This rank's own.
  bool in_place = false;
  StreamKind stream = StreamKind::kNonBlocking;
  size_t send_offset = 0;  // bytes, whole elements
  size_t recv_offset = 0;
  unsigned delay_us = 0;
  size_t send_region = 0;  // where the op's buffers start in the soak's
  size_t recv_region = 0;
  size_t elem() const { return rs_elem_bytes(kRoutedTypes[type].elem); }
  size_t chunk_bytes() const { return recvcount * elem(); }
  bool premul() const { return kRoutedReds[red].kind == RsRed::kPreMulSum; }
  // Rank q's scalar of a pre-multiplied sum, in the type's bits.
  uint32_t scalar_bits(int q) const {
    return rs_scalar_bits(kRoutedTypes[type].elem,
                          kPreMulScalars[(scalar_pick + q) % kPreMulScalarCount]);
  }
  // Rank q's scalar as the bytes NCCL reads for the type (4 or 2): the returned value's own,
  // so it must outlive their use.
  struct ScalarValue {
    uint32_t bits32;
    uint16_t bits16;
    void* bytes(size_t elem) { return elem == 4 ? static_cast<void*>(&bits32) : &bits16; }
  };
  ScalarValue scalar_value(int q) const {
    const uint32_t bits = scalar_bits(q);
    return {bits, static_cast<uint16_t>(bits)};
  }
  // The reduction as the float64 reference applies it, every rank's scalar included.
  RsReduction reduction(int nranks) const {
    RsReduction r;
    r.kind = kRoutedReds[red].kind;
    if (premul())
      for (int q = 0; q < nranks; ++q)
        r.scale[q] = rs_to_double(kRoutedTypes[type].elem, scalar_bits(q));
    return r;
  }
};

struct IterPlan {
  IterKind kind = IterKind::kSingle;
  bool grouped = false;  // its reduce-scatters in one ncclGroupStart/End
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeThreadLocal;
  std::vector<OpPlan> ops;
};

struct Config {
  long ops;
  uint64_t seed;
  size_t max_input;
  int nranks;
  long move_every;
  bool expect_ce;
  bool bitwise;
  bool premul;
  long watchdog_s;
  bool verbose;
};

Config read_config() {
  Config c;
  const bool ci = env_long("ZCTEST_RS_SOAK_CI", 0) != 0;
  c.ops = env_long("ZCTEST_RS_SOAK_OPS", ci ? 400 : 10000);
  c.seed = static_cast<uint64_t>(env_long("ZCTEST_RS_SOAK_SEED", 1));
  c.max_input =
      static_cast<size_t>(env_long("ZCTEST_RS_SOAK_MAX_BYTES", ci ? 64L << 20 : 512L << 20));
  c.nranks = static_cast<int>(env_long("ZCTEST_RS_SOAK_NRANKS", 2));
  c.move_every = env_long("ZCTEST_RS_SOAK_MOVE_EVERY", 25);
  const char* mode = getenv("ZEROCTA_REDUCESCATTER");
  const bool asked =
      shim_get_stats() != nullptr && mode != nullptr && std::string(mode) == "zerocta";
  c.expect_ce = env_long("ZCTEST_RS_SOAK_EXPECT_CE", asked ? 1 : 0) != 0;
  c.bitwise = env_long("ZCTEST_RS_SOAK_BITWISE", c.nranks == 2 ? 1 : 0) != 0;
  c.premul = env_long("ZCTEST_RS_SOAK_PREMUL", 1) != 0;
  c.watchdog_s = env_long("ZCTEST_RS_SOAK_WATCHDOG_S", 120);
  c.verbose = env_long("ZCTEST_RS_SOAK_VERBOSE", 0) != 0;
  return c;
}

// What a rank leaves for the parent in its shared block. Counts of ops, not of elements.
struct TypeSummary {
  uint64_t ops[kReds];     // by kRoutedReds
  double max_out_error;    // |output - float64|
  double max_nccl_error;   // |NCCL's output - float64|
  double max_out_vs_nccl;  // |output - NCCL's output|
};
struct RsSoakResult {
  uint64_t ops, eager_ops, replayed_ops, captured_calls, in_place_ops, cumem_ops, moves;
  uint64_t failed_ops;
  uint64_t differ_from_nccl, beyond_bound, nccl_beyond_bound, input_changed, poison_changed;
  uint64_t not_routed;  // ops (eager, or captured calls) the shim did not count on the route
  uint64_t route_calls[zerocta_route_count];  // the shim's reduce-scatter counters
  int shim_loaded;
  TypeSummary types[kTypes];
};
static_assert(sizeof(RsSoakResult) <= kRankSharedBlockBytes, "result must fit the shared block");

double from_ordered_bits(unsigned long long bits) {
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

// How a pre-multiplied sum is made and dropped: through the public symbols (the shim's where it
// is preloaded) on the communicator under test, through NCCL's own on the reference.
struct PreMulApi {
  decltype(&ncclRedOpCreatePreMulSum) create = nullptr;
  decltype(&ncclRedOpDestroy) destroy = nullptr;
};
const PreMulApi kPublicPreMul = {ncclRedOpCreatePreMulSum, ncclRedOpDestroy};

// NCCL's own entry points, from the libnccl.so.2 this process loaded (the test links it):
// dlsym on that library's handle finds its definitions, never the preloaded shim's, so the
// reference communicator is one the shim never sees and its results are NCCL's alone.
struct RealNccl {
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  PreMulApi premul;
};

template <typename Fn>
void find_real(void* lib, const char* name, Fn* out) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) fail(std::string(name) + " not found in the loaded libnccl");
  *out = reinterpret_cast<Fn>(sym);
}

RealNccl load_real_nccl() {
  void* lib = dlopen("libnccl.so.2", RTLD_NOLOAD | RTLD_LAZY);
  // A libnccl loaded under another name (LD_LIBRARY_PATH to a wheel's plain libnccl.so.2 is
  // still that name; a renamed copy is not): the object that defines pncclGetVersion.
  if (lib == nullptr) lib = dlopen(real_nccl_path().c_str(), RTLD_NOLOAD | RTLD_LAZY);
  if (lib == nullptr) fail(std::string("the loaded libnccl cannot be opened: ") + dlerror());
  RealNccl r;
  find_real(lib, "ncclCommInitRank", &r.comm_init_rank);
  find_real(lib, "ncclReduceScatter", &r.reduce_scatter);
  find_real(lib, "ncclCommGetAsyncError", &r.comm_get_async_error);
  find_real(lib, "ncclCommDestroy", &r.comm_destroy);
  find_real(lib, "ncclRedOpCreatePreMulSum", &r.premul.create);
  find_real(lib, "ncclRedOpDestroy", &r.premul.destroy);
  // With the shim preloaded the public name is the shim's: a reference through it would
  // compare the shim with itself.
  if (shim_get_stats() != nullptr &&
      reinterpret_cast<void*>(r.reduce_scatter) == dlsym(RTLD_DEFAULT, "ncclReduceScatter"))
    fail("the reference ncclReduceScatter is the shim's");
  return r;
}

// Ends the rank, saying what it was doing, when one step (an iteration: issue, run and check;
// or the communicators' creation and destruction) runs past its limit. A hang on the device
// fails wait_stream() sooner (ZCTEST_OP_TIMEOUT_S); this catches calls that block on the host
// (an op waiting for room in the shim's op ring, a group end, a free behind a stuck stream),
// which the harness's idle deadline would catch later and without naming the op.
class Watchdog {
 public:
  explicit Watchdog(long limit_s) : limit_s_(limit_s), thread_([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void arm(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    what_ = what;
    deadline_ = Clock::now() + std::chrono::seconds(limit_s_);
    armed_ = true;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (armed_ && Clock::now() >= deadline_) {
        report("WATCHDOG " + what_ + ": not finished after " + std::to_string(limit_s_) +
               " s (ZCTEST_RS_SOAK_WATCHDOG_S)");
        _exit(kWatchdogExit);  // the main thread may be stuck in a driver call: no unwinding
      }
      wake_.wait_for(lock, std::chrono::milliseconds(200));
    }
  }

  const long limit_s_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool armed_ = false;
  std::string what_;
  Clock::time_point deadline_{};
  std::thread thread_;  // last: starts once the rest is initialised
};

class RsSoak {
 public:
  RsSoak(const RankContext& ctx, const Config& cfg)
      : ctx_(ctx),
        cfg_(cfg),
        shared_rng_(seed_of({cfg.seed, 0x525354})),
        local_rng_(seed_of({cfg.seed, 0x10CA1, static_cast<uint64_t>(ctx.rank)})),
        real_(load_real_nccl()),
        watchdog_(cfg.watchdog_s) {
    watchdog_.arm("creating the communicators");
    comm_ = init_comm(ctx, InitKind::kInitRankConfig);
    // The same order on every rank: the shim's communicator, then the reference.
    const ncclResult_t res = real_.comm_init_rank(&ref_comm_, ctx.nranks, ctx.ids.at(1), ctx.rank);
    if (res != ncclSuccess || ref_comm_ == nullptr)
      fail(std::string("the reference communicator's ncclCommInitRank returned ") +
           ncclGetErrorString(res));
    watchdog_.disarm();
    ZG_CUDA(cudaStreamCreateWithFlags(&ref_stream_, cudaStreamNonBlocking));
    ZG_CUDA(cudaStreamCreateWithFlags(&verify_stream_, cudaStreamNonBlocking));
    // Whatever the split into ops, their buffers fit: inputs add up to max_input at most,
    // plus each op's offset, guard and alignment.
    const size_t slack = kMaxOps * (kMaxOffsetElems * 4 + kGuard + 2 * kAlign);
    send_capacity_ = cfg.max_input + slack;
    recv_capacity_ = cfg.max_input / static_cast<size_t>(ctx.nranks) + slack;
    ZG_CUDA(cudaMalloc(&ref_send_, send_capacity_));
    ZG_CUDA(cudaMalloc(&ref_recv_, recv_capacity_));
    ZG_CUDA(cudaMalloc(&checks_, sizeof(RsOpCheck) * kMaxOps));
    ZG_CUDA(cudaMalloc(&scalars_, sizeof(uint32_t) * 2 * kMaxOps));
    allocate_user_buffers();
  }

  ~RsSoak() {
    if (std::uncaught_exceptions() > 0) return;  // possibly hung GPU: leave it to _exit
    free_user_buffers();
    cudaFree(ref_send_);
    cudaFree(ref_recv_);
    cudaFree(checks_);
    cudaFree(scalars_);
    cudaStreamDestroy(ref_stream_);
    cudaStreamDestroy(verify_stream_);
    if (comm_) ncclCommDestroy(comm_);
    if (ref_comm_) real_.comm_destroy(ref_comm_);
  }

  int run() {
    const auto start = std::chrono::steady_clock::now();
    if (ctx_.rank == 0) {
      printf(
          "rs-soak: seed=%llu ops=%ld nranks=%d max_input_bytes=%zu nccl=%d zerocta=%s "
          "expect_ce=%d bitwise=%d premul=%d\n",
          static_cast<unsigned long long>(cfg_.seed), cfg_.ops, ctx_.nranks, cfg_.max_input,
          real_nccl_version(), shim_get_stats() ? "yes" : "no", cfg_.expect_ce ? 1 : 0,
          cfg_.bitwise ? 1 : 0, cfg_.premul ? 1 : 0);
      fflush(stdout);
    }
    uint64_t next_progress = 1000;
    for (long it = 0; ops_ < static_cast<uint64_t>(cfg_.ops); ++it) {
      if (cfg_.move_every > 0 && local_rng_.below(static_cast<uint64_t>(cfg_.move_every)) == 0) {
        watchdog_.arm("iteration " + std::to_string(it) + ": moving the buffers");
        move_user_buffers();
      }
      const IterPlan plan = make_plan();
      if (cfg_.verbose) {
        for (size_t j = 0; j < plan.ops.size(); ++j)
          printf("[rank %d] %s\n", ctx_.rank, describe(it, plan, j, -1).c_str());
        fflush(stdout);
      }
      watchdog_.arm(describe(it, plan, 0, -1));
      if (plan.kind == IterKind::kGraph) {
        run_graph(it, plan);
      } else {
        run_eager(it, plan);
      }
      watchdog_.disarm();
      publish();  // so that the parent has the counts even if a later iteration kills the rank
      heartbeat();
      if (ctx_.rank == 0 && ops_ >= next_progress) {
        next_progress += 1000;
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        printf("rs-soak: progress ops=%llu failed=%llu elapsed=%.0fs\n",
               static_cast<unsigned long long>(ops_), static_cast<unsigned long long>(failed_ops_),
               secs);
        fflush(stdout);
      }
    }
    watchdog_.arm("destroying the communicators");
    check_comm_async(comm_, "end of soak");
    ncclResult_t async = ncclSuccess;
    if (real_.comm_get_async_error(ref_comm_, &async) != ncclSuccess || async != ncclSuccess)
      fail(std::string("the reference communicator has an error: ") + ncclGetErrorString(async));
    ZG_NCCL(ncclCommDestroy(comm_));
    comm_ = nullptr;
    if (real_.comm_destroy(ref_comm_) != ncclSuccess) fail("destroying the reference communicator");
    ref_comm_ = nullptr;
    watchdog_.disarm();
    publish();
    printf("[rank %d] rs-soak: ops=%llu failed=%llu not_routed=%llu\n", ctx_.rank,
           static_cast<unsigned long long>(ops_), static_cast<unsigned long long>(failed_ops_),
           static_cast<unsigned long long>(not_routed_));
    fflush(stdout);
    return failed_ops_ == 0 && not_routed_ == 0 ? 0 : 1;
  }

 private:
  // --- buffers ---------------------------------------------------------------------------

  void allocate_user_buffers() {
    memory_ = local_rng_.chance(0.5) ? SoakMemory::kCumem : SoakMemory::kCudaMalloc;
    send_ = soak_alloc(memory_, send_capacity_);
    recv_ = soak_alloc(memory_, recv_capacity_);
  }
  void free_user_buffers() {
    soak_free(memory_, send_);
    soak_free(memory_, recv_);
    send_ = recv_ = nullptr;
  }
  // Every op so far has been checked, so nothing still runs on the old buffers.
  void move_user_buffers() {
    free_user_buffers();
    allocate_user_buffers();
    ++moves_;
  }

  // The op's input and output in the soak's buffers (ref: the reference's, laid out alike).
  uint8_t* send_ptr(const OpPlan& op, bool ref) const {
    return static_cast<uint8_t*>(ref ? ref_send_ : send_) + op.send_region + op.send_offset;
  }
  uint8_t* recv_ptr(const OpPlan& op, bool ref) const {
    if (op.in_place) return send_ptr(op, ref) + static_cast<size_t>(ctx_.rank) * op.chunk_bytes();
    return static_cast<uint8_t*>(ref ? ref_recv_ : recv_) + op.recv_region + op.recv_offset;
  }
  size_t input_bytes(const OpPlan& op) const {
    return op.chunk_bytes() * static_cast<size_t>(ctx_.nranks);
  }
  // Op j's device-resident scalar (the reference's apart): written on the op's stream before
  // every run, read by the op when it runs, never freed while the soak runs.
  void* device_scalar(size_t j, bool ref) const {
    return static_cast<uint8_t*>(scalars_) + (ref ? kMaxOps + j : j) * sizeof(uint32_t);
  }

  // --- plans -----------------------------------------------------------------------------

  IterPlan make_plan() {
    IterPlan plan;
    // What every rank must agree on first, from shared_rng_ in the same order everywhere.
    const double kind = shared_rng_.uniform();
    plan.kind = kind < 0.08 ? IterKind::kGraph : kind < 0.20 ? IterKind::kGroup : IterKind::kSingle;
    int nops = 1;
    if (plan.kind == IterKind::kGroup) nops = 2 + static_cast<int>(shared_rng_.below(2));
    if (plan.kind == IterKind::kGraph) {
      nops = 1 + static_cast<int>(shared_rng_.below(kMaxOps));
      plan.grouped = nops > 1 && shared_rng_.chance(0.5);
    }
    if (plan.kind == IterKind::kGroup) plan.grouped = true;
    plan.ops.resize(static_cast<size_t>(nops));
    for (OpPlan& op : plan.ops) {
      op.type = static_cast<int>(shared_rng_.below(kTypes));
      op.red = static_cast<int>(shared_rng_.below(cfg_.premul ? kReds : kReds - 1));
      if (op.premul()) {
        op.scalar_pick = static_cast<int>(shared_rng_.below(kPreMulScalarCount));
        op.scalar_on_device = shared_rng_.chance(0.5);
      }
      op.recvcount = draw_soak_count(shared_rng_, cfg_.max_input / static_cast<size_t>(nops),
                                     op.elem(), ctx_.nranks);
    }
    // This rank's own choices.
    const bool graph = plan.kind == IterKind::kGraph;
    // PyTorch captures in global mode: another thread's unsafe CUDA call then breaks the
    // capture, so the shim's own threads must keep out of it.
    plan.capture_mode =
        local_rng_.chance(0.5) ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal;
    const StreamKind graph_stream =
        local_rng_.chance(0.5) ? StreamKind::kNonBlocking : StreamKind::kBlocking;
    size_t send_region = 0, recv_region = 0;
    for (OpPlan& op : plan.ops) {
      op.in_place = local_rng_.chance(0.5);
      op.stream = graph ? graph_stream : static_cast<StreamKind>(local_rng_.below(kStreamKinds));
      op.send_offset =
          local_rng_.chance(0.25) ? (1 + local_rng_.below(kMaxOffsetElems)) * op.elem() : 0;
      op.recv_offset =
          local_rng_.chance(0.25) ? (1 + local_rng_.below(kMaxOffsetElems)) * op.elem() : 0;
      op.delay_us =
          !graph && local_rng_.chance(0.1) ? static_cast<unsigned>(local_rng_.below(2000)) : 0;
      op.send_region = send_region;
      send_region = align_up(send_region + op.send_offset + input_bytes(op) + kGuard, kAlign);
      op.recv_region = recv_region;
      if (!op.in_place)
        recv_region = align_up(recv_region + op.recv_offset + op.chunk_bytes() + kGuard, kAlign);
    }
    if (send_region > send_capacity_ || recv_region > recv_capacity_)
      fail("rs-soak plan does not fit its buffers (test bug)");
    return plan;
  }

  std::string describe(long it, const IterPlan& plan, size_t j, int replay) const {
    const OpPlan& op = plan.ops[j];
    char redop[96];
    snprintf(redop, sizeof redop, "%s", kRoutedReds[op.red].name);
    if (op.premul())
      snprintf(redop, sizeof redop, "premul(own scalar %.9g on the %s)",
               rs_to_double(kRoutedTypes[op.type].elem, op.scalar_bits(ctx_.rank)),
               op.scalar_on_device ? "device" : "host");
    char buf[704];
    snprintf(buf, sizeof buf,
             "op=%llu iteration=%ld kind=%s%s%s op_in_iteration=%zu/%zu replay=%d rank=%d "
             "dtype=%s redop=%s recvcount=%zu input_bytes=%zu in_place=%d stream=%s "
             "send_offset=%zu recv_offset=%zu delay_us=%u memory=%s",
             static_cast<unsigned long long>(ops_), it, iter_name(plan.kind),
             plan.grouped ? "(grouped)" : "",
             plan.kind != IterKind::kGraph                      ? ""
             : plan.capture_mode == cudaStreamCaptureModeGlobal ? "(capture global)"
                                                                : "(capture thread-local)",
             j + 1, plan.ops.size(), replay, ctx_.rank, kRoutedTypes[op.type].name, redop,
             op.recvcount, input_bytes(op), op.in_place ? 1 : 0, stream_name(op.stream),
             op.send_offset, op.recv_offset, op.delay_us, memory_name(memory_));
    return buf;
  }

  // --- one iteration ---------------------------------------------------------------------

  // Poisons op j's buffers (and the bytes beside them), then writes this rank's fresh input and
  // a device-resident scalar: the op's on `stream`, the reference's alike on its own stream.
  void prepare(const OpPlan& op, size_t j, uint64_t seed, cudaStream_t stream) {
    const RsElem t = kRoutedTypes[op.type].elem;
    const size_t count = op.recvcount * static_cast<size_t>(ctx_.nranks);
    for (const bool ref : {false, true}) {
      cudaStream_t s = ref ? ref_stream_ : stream;
      uint8_t* send_base = static_cast<uint8_t*>(ref ? ref_send_ : send_) + op.send_region;
      ZG_CUDA(cudaMemsetAsync(send_base, kNanPoison, op.send_offset + input_bytes(op) + kGuard, s));
      if (!op.in_place) {
        uint8_t* recv_base = static_cast<uint8_t*>(ref ? ref_recv_ : recv_) + op.recv_region;
        ZG_CUDA(
            cudaMemsetAsync(recv_base, kNanPoison, op.recv_offset + op.chunk_bytes() + kGuard, s));
      }
      rs_fill_input(send_ptr(op, ref), t, count, seed, ctx_.rank, s);
      if (op.premul() && op.scalar_on_device) {
        // Pageable source: CUDA copies it before the call returns.
        OpPlan::ScalarValue v = op.scalar_value(ctx_.rank);
        ZG_CUDA(cudaMemcpyAsync(device_scalar(j, ref), v.bytes(op.elem()), op.elem(),
                                cudaMemcpyHostToDevice, s));
      }
    }
    ZG_CUDA(cudaGetLastError());
  }

  // Op j's reduction for one call on `comm`: ncclSum or ncclAvg, or a pre-multiplied sum made
  // now with this rank's scalar (NCCL copies a host one at once; a device one is op j's slot).
  ncclRedOp_t make_redop(const PreMulApi& api, ncclComm_t comm, const OpPlan& op, size_t j,
                         bool ref, const std::string& what) const {
    if (!op.premul()) return kRoutedReds[op.red].nccl;
    OpPlan::ScalarValue v = op.scalar_value(ctx_.rank);
    void* scalar = op.scalar_on_device ? device_scalar(j, ref) : v.bytes(op.elem());
    ncclRedOp_t redop = kNoRedOp;
    const ncclResult_t res =
        api.create(&redop, scalar, kRoutedTypes[op.type].nccl,
                   op.scalar_on_device ? ncclScalarDevice : ncclScalarHostImmediate, comm);
    if (res != ncclSuccess)
      fail(what + (ref ? ": the reference's" : ":") + " ncclRedOpCreatePreMulSum returned " +
           ncclGetErrorString(res));
    return redop;
  }
  // Drops what make_redop made, as soon as the call that used it has returned (PyTorch's way).
  void drop_redop(const PreMulApi& api, ncclComm_t comm, const OpPlan& op, ncclRedOp_t redop,
                  bool ref, const std::string& what) const {
    if (!op.premul()) return;
    const ncclResult_t res = api.destroy(redop, comm);
    if (res != ncclSuccess)
      fail(what + (ref ? ": the reference's" : ":") + " ncclRedOpDestroy returned " +
           ncclGetErrorString(res));
  }

  // The reduce-scatters through the public symbols: the shim's where it is preloaded.
  void issue(const IterPlan& plan, bool eager, const std::string& what) {
    if (plan.grouped) ZG_NCCL(ncclGroupStart());
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      const OpPlan& op = plan.ops[j];
      cudaStream_t s = streams_.get(op.stream);
      if (eager && op.delay_us > 0) launch_delay(op.delay_us, s);
      const ncclRedOp_t redop = make_redop(kPublicPreMul, comm_, op, j, false, what);
      const ncclResult_t res =
          ncclReduceScatter(send_ptr(op, false), recv_ptr(op, false), op.recvcount,
                            kRoutedTypes[op.type].nccl, redop, comm_, s);
      if (res != ncclSuccess)
        fail(what + ": ncclReduceScatter returned " + ncclGetErrorString(res) +
             "; last error: " + ncclGetLastError(comm_));
      drop_redop(kPublicPreMul, comm_, op, redop, false, what);
    }
    if (plan.grouped) {
      const ncclResult_t res = ncclGroupEnd();
      if (res != ncclSuccess)
        fail(what + ": ncclGroupEnd returned " + ncclGetErrorString(res) +
             "; last error: " + ncclGetLastError(comm_));
    }
  }

  // NCCL's result for the same inputs, on the reference communicator.
  void issue_reference(const IterPlan& plan, const std::string& what) {
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      const OpPlan& op = plan.ops[j];
      const ncclRedOp_t redop = make_redop(real_.premul, ref_comm_, op, j, true, what);
      const ncclResult_t res =
          real_.reduce_scatter(send_ptr(op, true), recv_ptr(op, true), op.recvcount,
                               kRoutedTypes[op.type].nccl, redop, ref_comm_, ref_stream_);
      if (res != ncclSuccess)
        fail(what + ": the reference ncclReduceScatter returned " + ncclGetErrorString(res));
      drop_redop(real_.premul, ref_comm_, op, redop, true, what);
    }
  }

  void wait_all(const IterPlan& plan, const std::string& what) {
    bool waited[kStreamKinds] = {};
    for (const OpPlan& op : plan.ops) {
      const int k = static_cast<int>(op.stream);
      if (waited[k]) continue;
      waited[k] = true;
      wait_stream(streams_.get(op.stream), what + " (stream " + stream_name(op.stream) + ")");
    }
    wait_stream(ref_stream_, what + " (the reference)");
  }

  uint64_t shim_calls(zerocta_route_t route) const {
    GetStatsFn get = shim_get_stats();
    zerocta_stats_t stats{};
    if (get == nullptr || get(&stats) != 0) return 0;
    return stats.counters[zerocta_op_reducescatter][route].calls;
  }

  // With ZCTEST_RS_SOAK_EXPECT_CE, every op of `plan` issued since the route's counter read
  // `ce_before` was counted on it.
  void expect_routed(const IterPlan& plan, uint64_t ce_before, const std::string& what) {
    const uint64_t routed = shim_calls(zerocta_route_ce) - ce_before;
    if (!cfg_.expect_ce || routed == plan.ops.size()) return;
    not_routed_ += plan.ops.size() - std::min<uint64_t>(routed, plan.ops.size());
    report_limited("NOT ROUTED " + what + ": " + std::to_string(routed) + " of " +
                   std::to_string(plan.ops.size()) +
                   " reduce-scatters counted on the copy-engine route");
  }

  void run_eager(long it, const IterPlan& plan) {
    const std::string what = describe(it, plan, 0, -1);
    std::vector<uint64_t> seeds;
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      seeds.push_back(seed_of({cfg_.seed, static_cast<uint64_t>(it), j, 0}));
      prepare(plan.ops[j], j, seeds[j], streams_.get(plan.ops[j].stream));
    }
    const uint64_t ce_before = shim_calls(zerocta_route_ce);
    issue(plan, true, what);
    expect_routed(plan, ce_before, what);
    issue_reference(plan, what);
    wait_all(plan, what);
    eager_ops_ += plan.ops.size();
    verify(it, plan, seeds, -1);
  }

  void run_graph(long it, const IterPlan& plan) {
    const std::string what = describe(it, plan, 0, -1);
    cudaStream_t s = streams_.get(plan.ops[0].stream);
    // Captured work must not start before earlier work on other streams is done.
    ZG_CUDA(cudaDeviceSynchronize());
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    const uint64_t ce_before = shim_calls(zerocta_route_ce);
    ZG_CUDA(cudaStreamBeginCapture(s, plan.capture_mode));
    try {
      issue(plan, false, what + " (capture)");
    } catch (...) {
      cudaStreamEndCapture(s, &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    ZG_CUDA(cudaStreamEndCapture(s, &graph));
    expect_routed(plan, ce_before, what + " (capture)");
    ZG_CUDA(cudaGraphInstantiate(&exec, graph, 0));
    captured_calls_ += plan.ops.size();
    for (int replay = 0; replay < kReplays; ++replay) {
      std::vector<uint64_t> seeds;
      for (size_t j = 0; j < plan.ops.size(); ++j) {
        seeds.push_back(
            seed_of({cfg_.seed, static_cast<uint64_t>(it), j, static_cast<uint64_t>(replay + 1)}));
        prepare(plan.ops[j], j, seeds[j], s);
      }
      ZG_CUDA(cudaGraphLaunch(exec, s));
      issue_reference(plan, what + " replay " + std::to_string(replay));
      wait_all(plan, what + " replay " + std::to_string(replay));
      replayed_ops_ += plan.ops.size();
      verify(it, plan, seeds, replay);
    }
    ZG_CUDA(cudaGraphExecDestroy(exec));
    ZG_CUDA(cudaGraphDestroy(graph));
  }

  // --- checks ----------------------------------------------------------------------------

  void verify(long it, const IterPlan& plan, const std::vector<uint64_t>& seeds, int replay) {
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      const OpPlan& op = plan.ops[j];
      const RsElem t = kRoutedTypes[op.type].elem;
      const size_t n = static_cast<size_t>(ctx_.nranks);
      const size_t mine = static_cast<size_t>(ctx_.rank) * op.recvcount;
      RsOpCheck* c = checks_ + j;
      rs_reset_check(c, verify_stream_);
      rs_check_output(recv_ptr(op, false), recv_ptr(op, true), t, op.recvcount, mine, ctx_.nranks,
                      op.reduction(ctx_.nranks), seeds[j], c, verify_stream_);
      rs_check_input_kept(send_ptr(op, false), t, op.recvcount * n, op.in_place ? mine : 0,
                          op.in_place ? mine + op.recvcount : 0, seeds[j], ctx_.rank, c,
                          verify_stream_);
      const uint8_t* send_base = static_cast<uint8_t*>(send_) + op.send_region;
      rs_check_poison(send_base, op.send_offset, kNanPoison, 0, c, verify_stream_);
      rs_check_poison(send_ptr(op, false) + input_bytes(op), kGuard, kNanPoison,
                      op.send_offset + input_bytes(op), c, verify_stream_);
      if (!op.in_place) {
        const uint8_t* recv_base = static_cast<uint8_t*>(recv_) + op.recv_region;
        rs_check_poison(recv_base, op.recv_offset, kNanPoison, kOutputPoisonBase, c,
                        verify_stream_);
        rs_check_poison(recv_ptr(op, false) + op.chunk_bytes(), kGuard, kNanPoison,
                        kOutputPoisonBase + op.recv_offset + op.chunk_bytes(), c, verify_stream_);
      }
      ZG_CUDA(cudaGetLastError());
    }
    std::vector<RsOpCheck> found(plan.ops.size());
    ZG_CUDA(cudaMemcpyAsync(found.data(), checks_, sizeof(RsOpCheck) * found.size(),
                            cudaMemcpyDeviceToHost, verify_stream_));
    wait_stream(verify_stream_, describe(it, plan, 0, replay) + " (verification)");
    for (size_t j = 0; j < plan.ops.size(); ++j) {
      tally(it, plan, j, replay, seeds[j], found[j]);
      ++ops_;
    }
  }

  void tally(long it, const IterPlan& plan, size_t j, int replay, uint64_t seed,
             const RsOpCheck& c) {
    const OpPlan& op = plan.ops[j];
    TypeSummary& ts = types_[op.type];
    ++ts.ops[op.red];
    ts.max_out_error = std::max(ts.max_out_error, from_ordered_bits(c.max_out_error));
    ts.max_nccl_error = std::max(ts.max_nccl_error, from_ordered_bits(c.max_nccl_error));
    ts.max_out_vs_nccl = std::max(ts.max_out_vs_nccl, from_ordered_bits(c.max_out_vs_nccl));
    if (op.in_place) ++in_place_ops_;
    if (memory_ != SoakMemory::kCudaMalloc) ++cumem_ops_;
    const std::string what = describe(it, plan, j, replay);
    bool failed = false;
    if (c.differ_from_nccl != 0) {
      ++differ_from_nccl_;
      failed |= cfg_.bitwise;
      report_limited(std::string(cfg_.bitwise ? "MISMATCH " : "differs (not required) ") + what +
                     ": " + std::to_string(c.differ_from_nccl) +
                     " elements differ from NCCL's result; first " +
                     element_detail(op, seed, c.first_differ_from_nccl));
    }
    if (c.out_beyond_bound != 0) {
      ++beyond_bound_;
      failed = true;
      report_limited("MISMATCH " + what + ": " + std::to_string(c.out_beyond_bound) +
                     " elements farther from the float64 sum than rounding allows; first " +
                     element_detail(op, seed, c.first_out_beyond_bound));
    }
    if (c.nccl_beyond_bound != 0) {
      // NCCL's own result is wrong: not the shim's doing, but the run cannot be trusted.
      ++nccl_beyond_bound_;
      failed = true;
      report_limited("REFERENCE WRONG " + what + ": " + std::to_string(c.nccl_beyond_bound) +
                     " elements of NCCL's result farther from the float64 sum than rounding "
                     "allows; first " +
                     element_detail(op, seed, c.first_nccl_beyond_bound));
    }
    if (c.input_changed != 0) {
      ++input_changed_;
      failed = true;
      report_limited(
          "MISMATCH " + what + ": the op wrote into its input: " + std::to_string(c.input_changed) +
          " elements changed, first at element " + std::to_string(c.first_input_changed));
    }
    if (c.poison_changed != 0) {
      ++poison_changed_;
      failed = true;
      const bool output = c.first_poison_changed >= kOutputPoisonBase;
      report_limited("MISMATCH " + what + ": " + std::to_string(c.poison_changed) +
                     " bytes beside the op's buffers were written, first at byte " +
                     std::to_string(c.first_poison_changed - (output ? kOutputPoisonBase : 0)) +
                     " of the " + (output ? "output's" : "input's") +
                     " region (the buffer starts at byte " +
                     std::to_string(output ? op.recv_offset : op.send_offset) + ")");
    }
    if (failed) ++failed_ops_;
  }

  // Element `index` of the op's output: its bits and value here, NCCL's, and the float64 sum.
  std::string element_detail(const OpPlan& op, uint64_t seed, unsigned long long index) const {
    const RsElem t = kRoutedTypes[op.type].elem;
    const size_t at = static_cast<size_t>(index) * op.elem();
    uint32_t got = 0, nccl = 0;
    if (cudaMemcpy(&got, recv_ptr(op, false) + at, op.elem(), cudaMemcpyDeviceToHost) !=
            cudaSuccess ||
        cudaMemcpy(&nccl, recv_ptr(op, true) + at, op.elem(), cudaMemcpyDeviceToHost) !=
            cudaSuccess)
      return "element " + std::to_string(index) + " (could not be read back)";
    double magnitude = 0;
    const double sum = rs_reference(t, seed, ctx_.nranks, ctx_.rank * op.recvcount + index,
                                    op.reduction(ctx_.nranks), &magnitude);
    char buf[256];
    snprintf(buf, sizeof buf, "element %llu: got 0x%0*x (%.9g) nccl 0x%0*x (%.9g) float64 %.17g",
             index, static_cast<int>(2 * op.elem()), got, rs_to_double(t, got),
             static_cast<int>(2 * op.elem()), nccl, rs_to_double(t, nccl), sum);
    return buf;
  }

  void report_limited(const std::string& msg) {
    if (++reports_ <= kMaxReports) report(msg);
  }

  void publish() {
    auto* out = static_cast<RsSoakResult*>(rank_shared_block(ctx_.rank));
    out->ops = ops_;
    out->eager_ops = eager_ops_;
    out->replayed_ops = replayed_ops_;
    out->captured_calls = captured_calls_;
    out->in_place_ops = in_place_ops_;
    out->cumem_ops = cumem_ops_;
    out->moves = moves_;
    out->failed_ops = failed_ops_;
    out->differ_from_nccl = differ_from_nccl_;
    out->beyond_bound = beyond_bound_;
    out->nccl_beyond_bound = nccl_beyond_bound_;
    out->input_changed = input_changed_;
    out->poison_changed = poison_changed_;
    out->not_routed = not_routed_;
    out->shim_loaded = shim_get_stats() != nullptr;
    for (int r = 0; r < zerocta_route_count; ++r)
      out->route_calls[r] = shim_calls(static_cast<zerocta_route_t>(r));
    std::copy(std::begin(types_), std::end(types_), out->types);
  }

  RankContext ctx_;
  Config cfg_;
  SoakRng shared_rng_;
  SoakRng local_rng_;
  RealNccl real_;
  Watchdog watchdog_;
  ncclComm_t comm_ = nullptr;
  ncclComm_t ref_comm_ = nullptr;
  SoakStreams streams_;
  cudaStream_t ref_stream_ = nullptr;
  cudaStream_t verify_stream_ = nullptr;
  SoakMemory memory_ = SoakMemory::kCudaMalloc;  // of send_ and recv_
  void* send_ = nullptr;
  void* recv_ = nullptr;
  void* ref_send_ = nullptr;  // the reference's, cudaMalloc, never moved
  void* ref_recv_ = nullptr;
  RsOpCheck* checks_ = nullptr;
  void* scalars_ = nullptr;  // device-resident scalars: kMaxOps for comm_, then ref_comm_'s
  size_t send_capacity_ = 0;
  size_t recv_capacity_ = 0;
  uint64_t ops_ = 0, eager_ops_ = 0, replayed_ops_ = 0, captured_calls_ = 0;
  uint64_t in_place_ops_ = 0, cumem_ops_ = 0, moves_ = 0, failed_ops_ = 0;
  uint64_t differ_from_nccl_ = 0, beyond_bound_ = 0, nccl_beyond_bound_ = 0;
  uint64_t input_changed_ = 0, poison_changed_ = 0, not_routed_ = 0;
  TypeSummary types_[kTypes] = {};
  int reports_ = 0;
};

void print_rank_summary(int rank, const RsSoakResult& r) {
  printf(
      "rs-soak: rank %d ops=%llu (eager %llu, graph replays %llu of %llu captured calls) "
      "in_place=%llu on_cumem=%llu buffer_moves=%llu failed=%llu\n",
      rank, static_cast<unsigned long long>(r.ops), static_cast<unsigned long long>(r.eager_ops),
      static_cast<unsigned long long>(r.replayed_ops),
      static_cast<unsigned long long>(r.captured_calls),
      static_cast<unsigned long long>(r.in_place_ops), static_cast<unsigned long long>(r.cumem_ops),
      static_cast<unsigned long long>(r.moves), static_cast<unsigned long long>(r.failed_ops));
  printf(
      "rs-soak: rank %d ops with: bits unlike NCCL's=%llu beyond the float64 bound=%llu "
      "(NCCL's %llu) input written=%llu poison written=%llu eager not on the route=%llu\n",
      rank, static_cast<unsigned long long>(r.differ_from_nccl),
      static_cast<unsigned long long>(r.beyond_bound),
      static_cast<unsigned long long>(r.nccl_beyond_bound),
      static_cast<unsigned long long>(r.input_changed),
      static_cast<unsigned long long>(r.poison_changed),
      static_cast<unsigned long long>(r.not_routed));
  for (int t = 0; t < kTypes; ++t) {
    const TypeSummary& s = r.types[t];
    printf(
        "rs-soak: rank %d %-8s ops=%llu (sum %llu, avg %llu, premul %llu) "
        "max|zerocta-float64|=%.6g max|nccl-float64|=%.6g max|zerocta-nccl|=%.6g\n",
        rank, kRoutedTypes[t].name, static_cast<unsigned long long>(s.ops[0] + s.ops[1] + s.ops[2]),
        static_cast<unsigned long long>(s.ops[0]), static_cast<unsigned long long>(s.ops[1]),
        static_cast<unsigned long long>(s.ops[2]), s.max_out_error, s.max_nccl_error,
        s.max_out_vs_nccl);
  }
  if (r.shim_loaded) {
    printf("rs-soak: rank %d zerocta reduce-scatter calls by route:", rank);
    for (int route = 0; route < zerocta_route_count; ++route)
      printf(" %s=%llu", shim_route_name(route).c_str(),
             static_cast<unsigned long long>(r.route_calls[route]));
    printf("\n");
  }
}

TEST(ReduceScatterSoak, Randomized) {
  const Config cfg = read_config();
  if (cfg.nranks < 2) GTEST_SKIP() << "needs at least 2 ranks";
  ZG_REQUIRE_GPUS(cfg.nranks);
  ASSERT_LE(cfg.nranks, kRsMaxRanks)
      << "the float64 reference sums " << kRsMaxRanks << " ranks at most (ZCTEST_RS_SOAK_NRANKS)";
  RunOptions options = default_run_options(static_cast<int>(600 + cfg.ops / 5));
  options.total_timeout_s =
      static_cast<int>(env_long("ZCTEST_RS_SOAK_TIMEOUT_S", options.total_timeout_s));
  options.num_ids = 2;  // the shim's communicator, the reference's
  const RunResult result = run_ranks(
      cfg.nranks,
      [&cfg](const RankContext& ctx) {
        RsSoak soak(ctx, cfg);
        return soak.run();
      },
      options);
  uint64_t failed = 0, not_routed = 0;
  for (int r = 0; r < cfg.nranks; ++r) {
    const auto& res = *static_cast<const RsSoakResult*>(rank_shared_block(r));
    print_rank_summary(r, res);
    failed += res.failed_ops;
    not_routed += res.not_routed;
    EXPECT_GE(static_cast<long>(res.ops), cfg.ops) << "rank " << r << " did not finish";
    if (cfg.bitwise) {
      for (const TypeSummary& s : res.types) EXPECT_EQ(s.max_out_vs_nccl, 0.0) << "rank " << r;
    }
    if (cfg.expect_ce) {
      EXPECT_TRUE(res.shim_loaded) << "ZCTEST_RS_SOAK_EXPECT_CE=1 but the shim is not loaded";
      EXPECT_GE(res.route_calls[zerocta_route_ce], res.eager_ops)
          << "rank " << r << ": fewer copy-engine reduce-scatters than eager ones";
    }
  }
  fflush(stdout);
  EXPECT_TRUE(result.ok()) << result.summary();
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(not_routed, 0u);
}

}  // namespace
}  // namespace zgpu
