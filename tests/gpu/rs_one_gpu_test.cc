// The copy-engine reduce-scatter end to end on ONE GPU: the route's real driver work — the
// scratch made and exported at the join, imported and mapped by the peer processes, flags in
// the registered channel memory waited on and written by real streams, the summing kernel loaded
// and launched, every stream running asynchronously — which the CPU tests' fake driver cannot
// show. NCCL refuses two ranks on one GPU, so the ranks meet through the fake NCCL
// (tests/fake_nccl: rendezvous only; it moves no data) and the library is a test build that lets
// ranks share a GPU (-DZEROCTA_SHARED_GPU_TEST=ON). Every op is on the route; each rank checks
// its output against the sum it makes itself (small integers and scalars of 0.5, 1 and 2: exact
// in any order).
//
// Every case kind — fp32 and bf16; a sum, an average (2 ranks), a pre-multiplied sum of a
// host-immediate or a device-resident scalar; out of place and in place — runs twice:
//   eager     three ops on the same buffers, fresh inputs each, from 1 element a rank to 24M;
//   captured  one op captured into a CUDA graph as PyTorch captures it (global capture mode, a
//             non-blocking stream, a pre-multiplied sum made and destroyed inside the capture),
//             the graph replayed three times on the buffers it captured, with fresh inputs, a
//             poisoned output and a rewritten device scalar (a new value: read when the replay
//             runs) before each replay; at a small count and at 40 MiB a rank (3 slices).
// Then one graph of two captured reduce-scatters of different sizes back to back, replayed
// three times. The routed counter (zerocta_get_stats: the copy-engine route's reduce-scatter
// calls) must grow by exactly one per eager op, and per captured op once, at its capture:
// replays are not calls and leave it as it is.
//
//   env FAKE_NCCL_RENDEZVOUS_DIR=DIR FAKE_NCCL_COMM_ID=ID ZEROCTA_REDUCESCATTER=zerocta
//     LD_LIBRARY_PATH=<a directory holding the fake libnccl.so.2 only>
//     LD_PRELOAD=<shared-GPU build>/libzerocta.so zerocta_gpu_rs_one_gpu [NRANKS]
//   (tests/gpu/run_rs_one_gpu.sh does all of it)
//
// Prints a RESULT line per rank and case, and exits non-zero when any rank saw a wrong
// element, an error (the line names the first call that failed, a capture's included), or an
// op that did not take the route. Without a GPU each rank says so and the test exits 0.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "zerocta.h"

namespace {

// Ops of an eager case (on the same buffers), and replays of a captured case's graph.
constexpr int kRepeats = 3;
// A captured case's sizes: a small count, and output a rank of more than two slices of the
// largest size (16 MiB, reduce_scatter_plan.cc), so that a replay's slices take turns on the
// scratch's two buffers.
constexpr size_t kCapturedSmallCount = 1001;
constexpr size_t kCapturedLargeBytes = size_t{40} << 20;
// The graph of two ops: the second's count (the first is a large case).
constexpr size_t kSecondOpCount = 262147;
// Room for a failed call's name and error.
constexpr size_t kFailureChars = 256;

// Rank `rank`'s input element i for inputs numbered `pattern` (eager: the process's op;
// captured: the replay's): small integers, exact in any sum order. They repeat every
// kInputPeriod elements, so that a fill or a check of 100M elements takes a table of one period
// and not a computation per element (the host's time is most of the test's).
constexpr size_t kInputPeriod = 13;
float input(int rank, int pattern, size_t i) {
  return static_cast<float>(
      (static_cast<size_t>(rank) * 5 + static_cast<size_t>(pattern) * 3 + i * 7) % kInputPeriod);
}

// The reduction: a sum, an average (2 ranks), or a pre-multiplied sum of each rank's own
// scalar (scalar(): exact in any order), host-immediate or device-resident.
enum class Red { kSum, kAvg, kPreMulHost, kPreMulDevice };
const char* red_name(Red r) {
  return r == Red::kSum          ? "sum"
         : r == Red::kAvg        ? "avg"
         : r == Red::kPreMulHost ? "premul-host"
                                 : "premul-device";
}
// Rank k's scalar; k is the rank, plus the replay for a captured device scalar (a new value per
// replay).
float scalar(int k) { return static_cast<float>(1 << (k % 3)) * 0.5f; }

// An element as the test writes and reads it on the host: fp32, or bf16 as an fp32's top half
// (exact: small integers times 0.5, 1 or 2).
struct Elem {
  bool bf16;
  size_t bytes() const { return bf16 ? 2 : 4; }
  ncclDataType_t type() const { return bf16 ? ncclBfloat16 : ncclFloat; }
  void store(uint8_t* at, float v) const {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    if (bf16) {
      const uint16_t top = static_cast<uint16_t>(bits >> 16);
      memcpy(at, &top, 2);
    } else {
      memcpy(at, &bits, 4);
    }
  }
  float load(const uint8_t* at) const {
    uint32_t bits = 0;
    if (bf16) {
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
};

struct Case {
  bool bf16;
  Red red;
  bool in_place;
  size_t count;  // elements a rank receives
  Elem elem() const { return Elem{bf16}; }
  bool premul() const { return red == Red::kPreMulHost || red == Red::kPreMulDevice; }
};

std::string case_name(const Case& c) {
  return std::string(c.bf16 ? "bf16 " : "fp32 ") + red_name(c.red) +
         (c.in_place ? " in-place" : " out-of-place") + " count " + std::to_string(c.count);
}

// Every case kind the route takes (an average on 2 ranks only: 1/n exact) at each count that
// `counts` gives for its datatype.
std::vector<Case> every_kind(int nranks, std::vector<size_t> (*counts)(bool bf16)) {
  std::vector<Case> cases;
  for (bool bf16 : {false, true})
    for (Red red : {Red::kSum, Red::kAvg, Red::kPreMulHost, Red::kPreMulDevice})
      for (bool in_place : {false, true})
        for (size_t count : counts(bf16))
          if (red != Red::kAvg || nranks == 2) cases.push_back({bf16, red, in_place, count});
  return cases;
}
std::vector<size_t> eager_counts(bool) { return {1, 1000, 262147, size_t{24} << 20}; }
std::vector<size_t> captured_counts(bool bf16) {
  return {kCapturedSmallCount, kCapturedLargeBytes / Elem{bf16}.bytes()};
}

// The reduce-scatters routed so far in this process (the shim's counters).
long long routed() {
  using GetStats = int (*)(zerocta_stats_t*);
  auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "zerocta_get_stats"));
  zerocta_stats_t s;
  if (get == nullptr || get(&s) != 0) return -1;
  return static_cast<long long>(s.counters[zerocta_op_reducescatter][zerocta_route_ce].calls);
}

// The first call of a case that failed, for its RESULT line.
class FirstFailure {
 public:
  bool cuda(const std::string& call, cudaError_t e) {
    if (e != cudaSuccess) note(call, cudaGetErrorString(e), static_cast<int>(e));
    return e == cudaSuccess;
  }
  bool nccl(const std::string& call, ncclResult_t r) {
    if (r != ncclSuccess) note(call, ncclGetErrorString(r), static_cast<int>(r));
    return r == ncclSuccess;
  }
  bool failed() const { return !what_.empty(); }
  const std::string& what() const { return what_; }

 private:
  void note(const std::string& call, const char* error, int code) {
    if (failed()) return;
    char line[kFailureChars];
    snprintf(line, sizeof line, "%s failed: %s (%d)", call.c_str(), error ? error : "?", code);
    what_ = line;
  }
  std::string what_;
};

// A case's memory, the same for each of its ops or replays: its input (every rank's chunk),
// its output (a chunk of the input in place), its device scalar, and their host copies.
class CaseBuffers {
 public:
  CaseBuffers(const Case& c, int rank, int nranks, FirstFailure* f)
      : c_(c),
        rank_(rank),
        nranks_(nranks),
        chunk_(c.count * c.elem().bytes()),
        total_(chunk_ * static_cast<size_t>(nranks)),
        host_(total_),
        got_(chunk_) {
    f->cuda("cudaMalloc", cudaMalloc(&send_, total_));
    if (!c.in_place) f->cuda("cudaMalloc", cudaMalloc(&recv_, chunk_));
    f->cuda("cudaMalloc", cudaMalloc(&scalar_, c.elem().bytes()));
  }
  ~CaseBuffers() {
    cudaFree(send_);
    cudaFree(recv_);
    cudaFree(scalar_);
  }
  CaseBuffers(const CaseBuffers&) = delete;
  CaseBuffers& operator=(const CaseBuffers&) = delete;

  const Case& c() const { return c_; }
  const void* send() const { return send_; }
  void* out() const { return c_.in_place ? send_ + static_cast<size_t>(rank_) * chunk_ : recv_; }
  void* device_scalar() const { return scalar_; }

  // Queues on `s` the inputs numbered `pattern`, a poisoned output (out of place) and, for a
  // device scalar, scalar(rank + shift). wrong() checks against them.
  void prepare(int pattern, int shift, cudaStream_t s, FirstFailure* f) {
    const Elem e = c_.elem();
    pattern_ = pattern;
    shift_ = c_.red == Red::kPreMulDevice ? shift : 0;  // a host scalar is fixed at the call
    // One period, then copies of what is filled (a whole number of periods).
    const size_t period = std::min(kInputPeriod * e.bytes(), total_);
    for (size_t at = 0; at < period; at += e.bytes())
      e.store(host_.data() + at, input(rank_, pattern, at / e.bytes()));
    for (size_t filled = period; filled < total_; filled *= 2)
      memcpy(host_.data() + filled, host_.data(), std::min(filled, total_ - filled));
    f->cuda("cudaMemcpyAsync (inputs)",
            cudaMemcpyAsync(send_, host_.data(), total_, cudaMemcpyHostToDevice, s));
    if (!c_.in_place) f->cuda("cudaMemsetAsync (poison)", cudaMemsetAsync(recv_, 0xff, chunk_, s));
    if (c_.red != Red::kPreMulDevice) return;
    uint8_t bits[4];  // pageable: copied out before cudaMemcpyAsync returns
    e.store(bits, scalar(rank_ + shift_));
    f->cuda("cudaMemcpyAsync (device scalar)",
            cudaMemcpyAsync(scalar_, bits, e.bytes(), cudaMemcpyHostToDevice, s));
  }
  // Queues the output's copy to the host on `s`.
  void fetch(cudaStream_t s, FirstFailure* f) {
    f->cuda("cudaMemcpyAsync (output)",
            cudaMemcpyAsync(got_.data(), out(), chunk_, cudaMemcpyDeviceToHost, s));
  }
  // The output's wrong elements, once `s` finished: against the sum of every rank's inputs of
  // the last prepare(), each times its rank's scalar for a pre-multiplied sum.
  long long wrong() const {
    const Elem e = c_.elem();
    float want[kInputPeriod];  // by input index modulo the period
    for (size_t j = 0; j < kInputPeriod; ++j) {
      want[j] = 0;
      for (int p = 0; p < nranks_; ++p)
        want[j] += input(p, pattern_, j) * (c_.premul() ? scalar(p + shift_) : 1.0f);
      if (c_.red == Red::kAvg) want[j] *= 0.5f;  // 2 ranks
    }
    long long bad = 0;
    size_t j = static_cast<size_t>(rank_) * c_.count % kInputPeriod;  // my chunk's first input
    for (size_t i = 0; i < c_.count; ++i, j = j + 1 == kInputPeriod ? 0 : j + 1)
      bad += e.load(got_.data() + i * e.bytes()) != want[j];
    return bad;
  }

 private:
  Case c_;
  int rank_, nranks_;
  size_t chunk_, total_;
  uint8_t* send_ = nullptr;
  uint8_t* recv_ = nullptr;
  void* scalar_ = nullptr;
  std::vector<uint8_t> host_, got_;
  int pattern_ = 0, shift_ = 0;
};

// One ncclReduceScatter of a case as PyTorch issues it: a pre-multiplied sum made right before
// the call (host-immediate scalar(rank), or the case's device scalar) and destroyed right
// after it.
void issue(const CaseBuffers& b, int rank, ncclComm_t comm, cudaStream_t s, FirstFailure* f) {
  const Case& c = b.c();
  const std::string of = " of " + case_name(c);
  ncclRedOp_t op = c.red == Red::kAvg ? ncclAvg : ncclSum;
  bool made = false;
  if (c.premul()) {
    uint8_t bits[4];
    c.elem().store(bits, scalar(rank));
    const bool dev = c.red == Red::kPreMulDevice;
    made =
        f->nccl("ncclRedOpCreatePreMulSum" + of,
                ncclRedOpCreatePreMulSum(&op, dev ? b.device_scalar() : bits, c.elem().type(),
                                         dev ? ncclScalarDevice : ncclScalarHostImmediate, comm));
    if (!made) op = ncclSum;  // still called: the peers' op fails as a mismatch, never hangs
  }
  f->nccl("ncclReduceScatter" + of,
          ncclReduceScatter(b.send(), b.out(), c.count, c.elem().type(), op, comm, s));
  if (made) f->nccl("ncclRedOpDestroy" + of, ncclRedOpDestroy(op, comm));
}

// A case's RESULT line; true when it passed.
bool report(int rank, const std::string& name, long long wrong, const std::string& routed_text,
            bool routed_ok, const FirstFailure& f) {
  const bool ok = !f.failed() && wrong == 0 && routed_ok;
  printf("RESULT rank %d %s: wrong %lld %s%s%s %s\n", rank, name.c_str(), wrong,
         routed_text.c_str(), f.failed() ? ", " : "", f.what().c_str(), ok ? "ok" : "FAILED");
  fflush(stdout);
  return ok;
}

// An eager case: kRepeats ops on the same buffers, fresh inputs each, numbered across the
// process's ops (*op). Each op is one routed call.
bool run_eager(const Case& c, int rank, int nranks, ncclComm_t comm, cudaStream_t s, int* op) {
  FirstFailure f;
  CaseBuffers b(c, rank, nranks, &f);
  long long wrong = 0;
  const long long before = routed();
  if (!f.failed())  // buffers made: then every op, whatever fails, so that the peers' ops pair
    for (int rep = 0; rep < kRepeats; ++rep) {
      b.prepare(*op + rep, 0, s, &f);
      issue(b, rank, comm, s, &f);
      b.fetch(s, &f);
      f.cuda("cudaStreamSynchronize", cudaStreamSynchronize(s));
      wrong += b.wrong();
    }
  *op += kRepeats;
  const long long took_route = routed() - before;
  return report(rank, case_name(c), wrong,
                "routed " + std::to_string(took_route) + "/" + std::to_string(kRepeats),
                took_route == kRepeats, f);
}

using Ops = std::vector<std::unique_ptr<CaseBuffers>>;

// A CUDA graph and its instantiation, destroyed with it.
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

// Captures `ops` back to back on `s` as PyTorch captures a collective (global mode: an unsafe
// CUDA call anywhere in the process during it breaks it) and instantiates the graph. The
// capture is ended whatever failed in it, so that the stream leaves capture mode.
bool capture(const Ops& ops, int rank, ncclComm_t comm, cudaStream_t s, Graph* g, FirstFailure* f) {
  if (!f->cuda("cudaStreamBeginCapture", cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)))
    return false;
  for (const auto& b : ops) issue(*b, rank, comm, s, f);
  f->cuda("cudaStreamEndCapture", cudaStreamEndCapture(s, &g->graph));
  return !f->failed() &&
         f->cuda("cudaGraphInstantiate", cudaGraphInstantiate(&g->exec, g->graph, 0));
}

// Replay `rep` of the graph of `ops`: fresh inputs into the buffers it captured (op k's
// numbered rep * ops + k), a device scalar of a new value, the graph launched on `s`; returns
// the wrong elements of every op's output.
long long replay(const Ops& ops, int rep, cudaStream_t s, cudaGraphExec_t exec, FirstFailure* f) {
  const int n = static_cast<int>(ops.size());
  for (int k = 0; k < n; ++k) ops[k]->prepare(rep * n + k, rep, s, f);
  f->cuda("cudaGraphLaunch (replay " + std::to_string(rep) + ")", cudaGraphLaunch(exec, s));
  for (const auto& b : ops) b->fetch(s, f);
  f->cuda("cudaStreamSynchronize (replay " + std::to_string(rep) + ")", cudaStreamSynchronize(s));
  long long wrong = 0;
  for (const auto& b : ops) wrong += b->wrong();
  return wrong;
}

// A captured case: `cases` captured back to back into one graph, replayed kRepeats times.
// Routed counts calls: +1 per op at its capture, nothing at the replays.
bool run_captured(const std::vector<Case>& cases, const std::string& name, int rank, int nranks,
                  ncclComm_t comm, cudaStream_t s) {
  FirstFailure f;
  Ops ops;
  for (const Case& c : cases) ops.push_back(std::make_unique<CaseBuffers>(c, rank, nranks, &f));
  const long long calls = static_cast<long long>(ops.size());
  const long long before = routed();
  long long at_capture = 0, wrong = 0;
  int replays = 0;
  {
    Graph g;
    const bool captured = !f.failed() && capture(ops, rank, comm, s, &g, &f);
    at_capture = routed() - before;
    // Every replay, whatever failed in one: the peers' replays pair with these in launch order.
    for (; captured && replays < kRepeats; ++replays) wrong += replay(ops, replays, s, g.exec, &f);
  }
  const long long after = routed() - before;
  const std::string routed_text = "in " + std::to_string(replays) + " replays, routed " +
                                  std::to_string(at_capture) + "/" + std::to_string(calls) +
                                  " at capture, " + std::to_string(after) + " after replays";
  return report(rank, name, wrong, routed_text, at_capture == calls && after == calls, f);
}

// Two reduce-scatters of different sizes in one graph: a large one with a device scalar (a new
// value per replay), then a smaller one in place with a host scalar, of the other datatype.
std::vector<Case> two_op_graph() {
  return {{false, Red::kPreMulDevice, false, kCapturedLargeBytes / Elem{false}.bytes()},
          {true, Red::kPreMulHost, true, kSecondOpCount}};
}

int run_rank(int rank, int nranks, const ncclUniqueId& id) {
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    printf("RESULT rank %d: no CUDA context on GPU 0 FAILED\n", rank);
    return 2;
  }
  ncclComm_t comm = nullptr;
  if (const ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank); r != ncclSuccess) {
    printf("RESULT rank %d: ncclCommInitRank %d FAILED\n", rank, static_cast<int>(r));
    return 3;
  }
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    printf("RESULT rank %d: cudaStreamCreateWithFlags FAILED\n", rank);
    return 3;
  }
  int failures = 0, op = 0;
  for (const Case& c : every_kind(nranks, eager_counts))
    failures += !run_eager(c, rank, nranks, comm, stream, &op);
  for (const Case& c : every_kind(nranks, captured_counts))
    failures += !run_captured({c}, "captured " + case_name(c), rank, nranks, comm, stream);
  const std::vector<Case> two = two_op_graph();
  failures +=
      !run_captured(two, "captured graph of 2: " + case_name(two[0]) + " + " + case_name(two[1]),
                    rank, nranks, comm, stream);
  cudaStreamDestroy(stream);
  if (ncclCommDestroy(comm) != ncclSuccess) ++failures;
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int nranks = argc > 1 ? atoi(argv[1]) : 2;
  // No CUDA call here: a process that forks after CUDA started gives children that cannot use it.
  std::vector<pid_t> kids;
  for (int r = 0; r < nranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int gpus = 0;
      if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
        printf("RESULT rank %d: no GPU: skipped\n", r);
        fflush(stdout);
        _exit(0);
      }
      ncclUniqueId id;  // FAKE_NCCL_COMM_ID makes the ranks' ids alike
      const ncclResult_t got = ncclGetUniqueId(&id);
      if (got != ncclSuccess) printf("RESULT rank %d: ncclGetUniqueId %d FAILED\n", r, got);
      const int code = got == ncclSuccess ? run_rank(r, nranks, id) : 4;
      fflush(stdout);
      exit(code);  // not _exit: the library's exit report (ZEROCTA_STATS=1) runs at exit
    }
    kids.push_back(pid);
  }
  int worst = 0;
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0) worst = code;
  }
  printf("RESULT all ranks: %s\n", worst == 0 ? "ok" : "FAILED");
  return worst;
}
