// Command line of zerocta-bench: nccl-tests flags (-b -e -f -n -w -c -d -g) plus the path,
// contention and output options, and the hidden worker flags the parent passes to the rank
// processes it re-executes. Parsing is pure (no CUDA, no I/O besides the usage text).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "coll_op.h"
#include "cumem_buffer.h"

namespace zcb {

// Every way of running a collective the bench knows (the values index tables: append only).
// The sweep runs the paths of sweep_path_set(op); the contention study (all-gathers) runs
// kNcclKernel, kNcclCe, kZerocta, kZeroctaAuto and kBareCe.
enum class PathId {
  kNcclKernel,
  kNcclCe,
  kZerocta,
  kZeroctaAuto,
  kCeiling,
  kBareCe,
  kNcclPolicy,     // the application sets CTAPolicy = NCCL_CTA_POLICY_ZERO itself
  kZeroctaPolicy,  // nccl-kernel's program under the shim with ZEROCTA_ALLGATHER=nccl
  kSumKernel,      // reduce-scatter floor: the route's reduction kernel alone on one GPU
};

const char* path_name(PathId p);
bool parse_path_name(const std::string& name, PathId* out);
// True for the paths whose ranks run with LD_PRELOAD=libzerocta.so.
bool path_uses_shim(PathId p);
// The ZEROCTA_ALLGATHER value a shim path runs with ("zerocta", "auto" or "nccl"), else
// nullptr.
const char* path_allgather_mode(PathId p);
// True for the paths run in one process with a thread per GPU (peer memory, no NCCL).
bool path_is_single_process(PathId p);
// True for the paths that run an NCCL program (every path but the ceiling and bare-ce).
inline bool path_runs_nccl(PathId p) { return !path_is_single_process(p); }
// How many processes a path runs in: one for the peer paths, and for every path with
// --one-process; else one per rank.
int path_process_count(PathId p, bool one_process, int nranks);
// True when --alloc applies to the path: the NCCL programs but nccl-ce (ncclMemAlloc).
bool path_honours_alloc(PathId p);
// True for the paths whose program creates its communicator with ncclCommInitRankConfig and
// CTAPolicy = NCCL_CTA_POLICY_ZERO (nccl-ce, nccl-policy); the others call ncclCommInitRank.
bool path_sets_zero_policy(PathId p);
// The ZEROCTA_REDUCESCATTER value a shim path runs with for reduce-scatters ("zerocta", "auto"
// or "nccl"), else nullptr: the same word as its ZEROCTA_ALLGATHER.
const char* path_reducescatter_mode(PathId p);
// True when the shim path routes `op` itself (all-gathers and reduce-scatters on zerocta and
// zerocta-auto); the shim forwards every other op to NCCL.
bool path_routes_op(PathId p, CollOp op);
// The sweep paths that can run `op`, in run order ("--paths all"). All-gathers have a
// copy-engine path (nccl-ce) and a ceiling; reduce-scatters their floors bare-ce (the pushes
// alone) and sum-kernel (the reduction alone); the zerocta paths forward the other ops to NCCL.
const std::vector<PathId>& sweep_path_set(CollOp op);
// The sweep paths run without --paths: every path for all-gathers; for the other ops the
// policy comparison nccl-kernel, nccl-policy, zerocta-policy.
std::vector<PathId> default_sweep_paths(CollOp op);
// The contention paths that can run `op` (all-gathers and reduce-scatters), bare-ce last, and
// those run without --contention-paths.
const std::vector<PathId>& contention_path_set(CollOp op);
std::vector<PathId> default_contention_paths(CollOp op);
// True for the ops --contention can measure: all-gathers and reduce-scatters.
bool contention_supports(CollOp op);

// The reduction of the reduce-scatter (--redop): NCCL's sum or average, or a pre-multiplied sum
// (ncclRedOpCreatePreMulSum) whose scalar differs by rank (premul_op.h), held on the host
// (ncclScalarHostImmediate) or in device memory (ncclScalarDevice).
enum class RedOp { kSum, kAvg, kPreMul, kPreMulDev };
const char* redop_name(RedOp r);
bool parse_redop(const std::string& name, RedOp* out);
// True for the pre-multiplied sums, which are made per call on each communicator.
inline bool redop_is_premul(RedOp r) { return r == RedOp::kPreMul || r == RedOp::kPreMulDev; }
// What the float64 reference of maxdiff is for `r`, for the banners: "sum", "mean", ...
const char* redop_reference_name(RedOp r);
// sweep_path_set(op) for reduction `red`: without sum-kernel for the pre-multiplied sums.
std::vector<PathId> sweep_path_set(CollOp op, RedOp red);
// True for the data types of --op reducescatter: float, half and bfloat16 (the route's).
bool reducescatter_dtype_ok(ncclDataType_t t);

struct DataType {
  const char* name;  // nccl-tests spelling: "float", "bfloat16", "int8", ...
  ncclDataType_t nccl;
  int bytes;
};
bool parse_dtype(const std::string& name, DataType* out);

// How the NCCL-program paths other than nccl-ce allocate their send and receive buffers
// (--alloc). nccl-ce always uses ncclMemAlloc; the ceiling and bare-ce use cudaMalloc.
enum class BufferAlloc {
  kCudaMalloc,
  kCuMem,    // PyTorch's expandable segments: one VA range, 20 MiB cuMemCreate chunks
  kNcclMem,  // ncclMemAlloc without a window: the memory NCCL CE's windows are made of
};
const char* alloc_name(BufferAlloc a);
bool parse_alloc(const std::string& name, BufferAlloc* out);

// --contention-mode: the same work on every path (fixed), or all-gathers issued until they
// cover twice the GEMM loop, so a faster path does more of them (saturate).
enum class ContentionMode { kFixed, kSaturate };
const char* contention_mode_name(ContentionMode m);

// --contention-placement: which placements of the contention all-gather run, in this order.
std::vector<bool> contention_placements(const std::string& which);  // in_place flags

// Exit codes, also listed by --help.
constexpr int kExitOk = 0;      // every path passed, or no GPU found (a note says so)
constexpr int kExitFailed = 1;  // a path FAILED: wrong data, a worker died or hung, a fallback
constexpr int kExitUsage = 2;   // bad command line or a missing libzerocta.so

struct Options {
  // The collective of the sweep (--op); the contention study always all-gathers.
  CollOp op = CollOp::kAllGather;
  // nccl-tests flags. Sizes follow nccl-tests' "size" column (coll_shape).
  // Ranks (0 = every visible GPU) and how they run: nccl-tests' -g N (GPUs driven by one
  // thread: one process, one_process set) or --procs N (a process per rank).
  int ngpus = 0;
  std::string ranks_option = "";  // "-g" or "--procs", for messages; "" when not given
  uint64_t min_bytes = 1ull << 20;
  uint64_t max_bytes = 1ull << 30;
  uint64_t step_factor = 4;
  int iters = 20;
  int warmups = 5;
  bool check = true;
  DataType dtype{"float", ncclFloat, 4};
  // --redop (reduce-scatter only): sum, avg, premul or premul-dev. All-reduces always sum.
  RedOp redop = RedOp::kSum;
  // --rs-ctas: CTAs of the sum-kernel floor's reduction kernel.
  int rs_ctas = 16;

  std::vector<PathId> paths;  // sweep paths in run order; empty = no sweep ("--paths none")
  std::string paths_text;     // --paths as given ("" = default); resolved once --op is known
  std::string json_path;
  BufferAlloc alloc = BufferAlloc::kCudaMalloc;  // --alloc
  // --cumem-chunk: the physical allocations of a --alloc cumem buffer (PyTorch's expandable
  // segments: 20 MiB; a size at least the buffer's: one allocation, as ncclMemAlloc's).
  uint64_t cumem_chunk_bytes = 20ull << 20;
  CumemProps cumem_props;  // --cumem-props: ncclMemAlloc's properties, one at a time
  // -g N / --one-process: the NCCL-program paths run as one process whose one thread drives
  // every GPU (nccl-tests -g N); default and --procs N: one process per rank.
  bool one_process = false;
  // --graph: the sweep's checked op and timed loop replay a CUDA graph that captured the op
  // (global capture mode, as PyTorch captures): what graph users get, host work gone.
  bool graph = false;
  // --iter-times: each worker prints every timed op's time per rank (stderr), to see what a
  // mean and a median hide (bimodal latencies, the first ops of a loop).
  bool iter_times = false;
  // --events-every K: a timed event every K ops of a timed loop; 0: five runs (timing.h says
  // why not after every op).
  int events_every = 0;
  // --rounds R: the whole sweep path set R times, the order rotated each round, and a table of
  // each path's busbw and its ratio to the baseline in the same round, median (min..max): a
  // difference of 1 % between two paths is within one run's noise on these hosts.
  int rounds = 1;
  std::string zerocta_lib;  // resolved by the parent; "" = not given
  bool allow_fallback = false;
  uint64_t seed = 0x5a3c7e11ull;

  // Contention study.
  bool contention = false;
  std::vector<PathId> contention_paths;  // always ends with bare-ce, the floor
  std::string contention_paths_text;     // --contention-paths as given; resolved once --op is known
  ContentionMode contention_mode = ContentionMode::kFixed;
  int contention_ops = 40;  // fixed mode: all-gathers per overlapped run (and alone)
  int repeats = 5;          // runs of the whole contention path set, order rotated each time
  std::string contention_placement = "both";  // in | out | both
  int gemm_m = 8192, gemm_n = 8192, gemm_k = 8192;
  int gemm_iters = 20;
  uint64_t contention_bytes = 0;  // total output bytes; 0 = 256 MiB per rank

  // Time limits, seconds.
  int timeout_s = 0;     // per path; 0 = derived from the estimate
  int deadline_s = 450;  // whole run; paths not started by then are SKIPPED

  bool quick = false;
  // --multicast-off: the workers run with kMulticastOffEnv (NVLink multicast off, for machines
  // that must not use it); off by default, so the bench measures what the caller's environment
  // gives.
  bool multicast_off = false;
  bool dry_run = false;    // probe, print the plan and the estimate, run nothing
  bool self_test = false;  // CPU self-test of parsing, math and report formatting
  int fake_gpus = 0;       // testing: pretend N GPUs, workers produce synthetic rows, no CUDA

  // Hidden worker mode (set by the parent on the re-executed rank processes).
  std::string worker_path;  // "" = parent
  std::string worker_mode;  // "sweep" | "contention"
  int worker_rank = -1;     // -1 for a process that drives every GPU
  int worker_nranks = 0;
  int worker_repeat = -1;  // contention: which repeat of the path set this run is
  int worker_in_fd = -1;
  int worker_out_fd = -1;

  bool is_worker() const { return !worker_path.empty(); }
  // The contention op's nccl-tests size for nranks ranks: an all-gather's total output, a
  // reduce-scatter's total input (--contention-bytes, default 256 MiB per rank: the same bytes
  // to each peer either way).
  uint64_t contention_total_bytes(int nranks) const;
  // The contention study's op: reduce-scatters with --op reducescatter, else all-gathers.
  CollOp contention_op() const {
    return op == CollOp::kReduceScatter ? CollOp::kReduceScatter : CollOp::kAllGather;
  }
  // The reduction of a reduce-scatter (--redop); the other reductions always sum.
  RedOp reduction() const { return op == CollOp::kReduceScatter ? redop : RedOp::kSum; }
  // The redop column: --redop's name for reduce-scatters, "sum" for all-reduces, "none" else.
  const char* redop_label() const {
    return !op_reduces(op) ? "none" : op == CollOp::kReduceScatter ? redop_name(redop) : "sum";
  }
};

// What --multicast-off sets in every worker's environment (NAME=value), whatever it held.
extern const char* const kMulticastOffEnv[2];

// What to do with `visible` GPUs before anything runs: -1 to go on, or the exit status with
// *message, the line to print (on stdout for kExitOk, else on stderr). No GPU or one GPU with
// no -g is "nothing to measure" (0); asking for ranks (-g) that are not there is an error.
int check_gpu_count(const Options& o, int visible, const std::string& no_gpu_reason,
                    std::string* message);

// Parses argv. On error returns false with *error set ("unknown option --foo"). --help sets
// *help and returns true.
bool parse_options(int argc, char** argv, Options* out, bool* help, std::string* error);

// The usage text of --help.
std::string usage_text(const char* argv0);

// Parses "1M", "256MiB", "1G", "4096": K/M/G/T are powers of 1024. False on junk/overflow.
bool parse_size(const std::string& text, uint64_t* out);

// Human size for tables and estimates: "1 MiB", "256 MiB", "1.5 GiB", "4096 B".
std::string format_size(uint64_t bytes);

// The sweep sizes, nccl-tests style: min, min*f, ... while <= max (min alone if f <= 1).
std::vector<uint64_t> sweep_sizes(const Options& o);

// Ops between two timed events of a loop of n ops: --events-every, else a fifth of n (at least 1).
int events_every(const Options& o, int n);

// The path order of repeat `repeat` (0-based; a contention repeat or a sweep round): `paths`
// rotated left by `repeat`, so every path runs at every position over the repeats (interleaved,
// not path after path).
std::vector<PathId> rotated_run_order(const std::vector<PathId>& paths, int repeat);

// Per-rank element count for a total size (0 when the size is too small for nranks ranks).
uint64_t per_rank_count(uint64_t total_bytes, int nranks, int dtype_bytes);

// The shape of sweep size `size_bytes` for the options' op and data type.
CollShape sweep_shape(const Options& o, uint64_t size_bytes, int nranks);

}  // namespace zcb
