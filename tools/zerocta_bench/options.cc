#include "options.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace zcb {

namespace {

struct PathRow {
  PathId id;
  const char* name;
};
constexpr PathRow kPaths[] = {
    {PathId::kNcclKernel, "nccl-kernel"}, {PathId::kNcclCe, "nccl-ce"},
    {PathId::kZerocta, "zerocta"},        {PathId::kZeroctaAuto, "zerocta-auto"},
    {PathId::kCeiling, "ceiling"},        {PathId::kBareCe, "bare-ce"},
    {PathId::kNcclPolicy, "nccl-policy"}, {PathId::kZeroctaPolicy, "zerocta-policy"},
    {PathId::kSumKernel, "sum-kernel"},
};

const DataType kTypes[] = {
    {"int8", ncclInt8, 1},       {"char", ncclChar, 1},         {"uint8", ncclUint8, 1},
    {"int32", ncclInt32, 4},     {"int", ncclInt, 4},           {"uint32", ncclUint32, 4},
    {"int64", ncclInt64, 8},     {"uint64", ncclUint64, 8},     {"half", ncclHalf, 2},
    {"float16", ncclFloat16, 2}, {"float", ncclFloat, 4},       {"float32", ncclFloat32, 4},
    {"double", ncclDouble, 8},   {"float64", ncclFloat64, 8},   {"bfloat16", ncclBfloat16, 2},
    {"bf16", ncclBfloat16, 2},   {"f8e4m3", ncclFloat8e4m3, 1}, {"f8e5m2", ncclFloat8e5m2, 1},
};

bool parse_int(const std::string& text, long lo, long hi, long* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long v = strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// "a,b,c" -> {"a","b","c"}; empty items are kept so "a,,b" is rejected by the caller.
std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// Parses a path list into canonical run order (duplicates removed). "all" = every path in
// `all`; "none" = empty. `where` names the list in errors about known paths that do not
// belong to it ("for --op allreduce").
bool parse_path_list(const std::string& text, const std::vector<PathId>& all,
                     const std::string& where, std::vector<PathId>* out, std::string* error) {
  std::vector<bool> want(sizeof(kPaths) / sizeof(kPaths[0]), false);
  out->clear();
  if (text == "none") return true;
  for (const std::string& item : split_commas(text)) {
    if (item == "all") {
      for (PathId p : all) want[static_cast<int>(p)] = true;
      continue;
    }
    PathId p;
    const bool known = parse_path_name(item, &p);
    bool allowed = false;
    if (known)
      for (PathId a : all) allowed |= (a == p);
    if (!allowed) {
      *error =
          known ? "path \"" + item + "\" does not apply " + where : "unknown path \"" + item + "\"";
      *error += " (accepted: all, none";
      for (PathId a : all) *error += std::string(", ") + path_name(a);
      *error += ")";
      return false;
    }
    want[static_cast<int>(p)] = true;
  }
  for (PathId a : all)
    if (want[static_cast<int>(a)]) out->push_back(a);
  return true;
}

// bare-ce is the floor every contention table is read against: always run it, last in the
// canonical order.
void add_contention_floor(std::vector<PathId>* paths) {
  for (PathId p : *paths)
    if (p == PathId::kBareCe) return;
  paths->push_back(PathId::kBareCe);
}

bool parse_gemm(const std::string& text, Options* o) {
  std::vector<std::string> parts = split_commas(text);
  if (parts.size() != 3) return false;
  long v[3];
  for (int i = 0; i < 3; ++i)
    if (!parse_int(parts[i], 16, 65536, &v[i])) return false;
  o->gemm_m = static_cast<int>(v[0]);
  o->gemm_n = static_cast<int>(v[1]);
  o->gemm_k = static_cast<int>(v[2]);
  return true;
}

// --quick: a smoke run that finishes in well under a minute on 2-4 GPUs. Applied before the
// other flags, so any flag given explicitly still wins.
void apply_quick_preset(Options* o) {
  o->min_bytes = 1ull << 20;
  o->max_bytes = 64ull << 20;
  o->step_factor = 8;
  o->iters = 5;
  o->warmups = 2;
  o->gemm_m = o->gemm_n = o->gemm_k = 4096;
  o->gemm_iters = 10;
  o->contention_ops = 10;
  o->repeats = 3;
  o->contention_bytes = 0;
}

}  // namespace

const char* path_name(PathId p) {
  for (const PathRow& r : kPaths)
    if (r.id == p) return r.name;
  return "?";
}

bool parse_path_name(const std::string& name, PathId* out) {
  for (const PathRow& r : kPaths) {
    if (name == r.name) {
      *out = r.id;
      return true;
    }
  }
  return false;
}

bool path_uses_shim(PathId p) { return path_allgather_mode(p) != nullptr; }

const char* path_allgather_mode(PathId p) {
  if (p == PathId::kZerocta) return "zerocta";
  if (p == PathId::kZeroctaAuto) return "auto";
  if (p == PathId::kZeroctaPolicy) return "nccl";  // the shim changes only the CTA policy
  return nullptr;
}

const char* path_reducescatter_mode(PathId p) { return path_allgather_mode(p); }

bool path_routes_op(PathId p, CollOp op) {
  return (p == PathId::kZerocta || p == PathId::kZeroctaAuto) &&
         (op == CollOp::kAllGather || op == CollOp::kReduceScatter);
}

bool path_is_single_process(PathId p) {
  return p == PathId::kCeiling || p == PathId::kBareCe || p == PathId::kSumKernel;
}

bool path_sets_zero_policy(PathId p) { return p == PathId::kNcclCe || p == PathId::kNcclPolicy; }

int path_process_count(PathId p, bool one_process, int nranks) {
  return path_is_single_process(p) || one_process ? 1 : nranks;
}

bool path_honours_alloc(PathId p) { return path_runs_nccl(p) && p != PathId::kNcclCe; }

const char* alloc_name(BufferAlloc a) {
  switch (a) {
    case BufferAlloc::kCuMem:
      return "cumem";
    case BufferAlloc::kNcclMem:
      return "ncclmem";
    default:
      return "cudamalloc";
  }
}

bool parse_alloc(const std::string& name, BufferAlloc* out) {
  if (name == "cudamalloc")
    *out = BufferAlloc::kCudaMalloc;
  else if (name == "cumem")
    *out = BufferAlloc::kCuMem;
  else if (name == "ncclmem")
    *out = BufferAlloc::kNcclMem;
  else
    return false;
  return true;
}

const char* contention_mode_name(ContentionMode m) {
  return m == ContentionMode::kSaturate ? "saturate" : "fixed";
}

std::vector<bool> contention_placements(const std::string& which) {
  if (which == "in") return {true};
  if (which == "out") return {false};
  return {false, true};  // nccl-tests' order: out-of-place first
}

std::vector<PathId> rotated_run_order(const std::vector<PathId>& paths, int repeat) {
  std::vector<PathId> out;
  const size_t n = paths.size();
  for (size_t i = 0; i < n; ++i) out.push_back(paths[(i + static_cast<size_t>(repeat)) % n]);
  return out;
}

const std::vector<PathId>& sweep_path_set(CollOp op) {
  // The policy paths right after their baseline, so the policy comparison runs first.
  static const std::vector<PathId> all_gather = {
      PathId::kNcclKernel, PathId::kNcclPolicy,  PathId::kZeroctaPolicy, PathId::kNcclCe,
      PathId::kZerocta,    PathId::kZeroctaAuto, PathId::kCeiling};
  static const std::vector<PathId> reduce_scatter = {
      PathId::kNcclKernel,  PathId::kNcclPolicy, PathId::kZeroctaPolicy, PathId::kZerocta,
      PathId::kZeroctaAuto, PathId::kBareCe,     PathId::kSumKernel};
  static const std::vector<PathId> other = {PathId::kNcclKernel, PathId::kNcclPolicy,
                                            PathId::kZeroctaPolicy, PathId::kZerocta,
                                            PathId::kZeroctaAuto};
  if (op == CollOp::kAllGather) return all_gather;
  return op == CollOp::kReduceScatter ? reduce_scatter : other;
}

const std::vector<PathId>& contention_path_set(CollOp op) {
  // Every NCCL program of the sweep's set, then the floor.
  static const std::vector<PathId> all_gather = {
      PathId::kNcclKernel, PathId::kNcclPolicy,  PathId::kZeroctaPolicy, PathId::kNcclCe,
      PathId::kZerocta,    PathId::kZeroctaAuto, PathId::kBareCe};
  static const std::vector<PathId> reduce_scatter = {PathId::kNcclKernel,    PathId::kNcclPolicy,
                                                     PathId::kZeroctaPolicy, PathId::kZerocta,
                                                     PathId::kZeroctaAuto,   PathId::kBareCe};
  return op == CollOp::kReduceScatter ? reduce_scatter : all_gather;
}

std::vector<PathId> default_contention_paths(CollOp op) {
  if (op == CollOp::kReduceScatter) return {PathId::kNcclKernel, PathId::kZerocta, PathId::kBareCe};
  return {PathId::kNcclKernel, PathId::kNcclCe, PathId::kZerocta, PathId::kBareCe};
}

bool contention_supports(CollOp op) {
  return op == CollOp::kAllGather || op == CollOp::kReduceScatter;
}

namespace {
struct RedOpName {
  RedOp op;
  const char* name;
  const char* reference;  // the float64 reference of maxdiff
};
constexpr RedOpName kRedOps[] = {
    {RedOp::kSum, "sum", "sum"},
    {RedOp::kAvg, "avg", "mean"},
    {RedOp::kPreMul, "premul", "sum of each rank's input times its scalar"},
    {RedOp::kPreMulDev, "premul-dev", "sum of each rank's input times its scalar"},
};
}  // namespace

const char* redop_name(RedOp r) {
  for (const RedOpName& n : kRedOps)
    if (n.op == r) return n.name;
  return "?";
}

const char* redop_reference_name(RedOp r) {
  for (const RedOpName& n : kRedOps)
    if (n.op == r) return n.reference;
  return "?";
}

bool parse_redop(const std::string& name, RedOp* out) {
  for (const RedOpName& n : kRedOps)
    if (name == n.name) {
      *out = n.op;
      return true;
    }
  return false;
}

bool reducescatter_dtype_ok(ncclDataType_t t) {
  return t == ncclFloat32 || t == ncclFloat16 || t == ncclBfloat16;
}

std::vector<PathId> sweep_path_set(CollOp op, RedOp red) {
  std::vector<PathId> set = sweep_path_set(op);
  // sum-kernel launches the route's kernel with one scale for every source (an average's
  // floor); the scalars of a pre-multiplied sum differ by rank.
  if (op == CollOp::kReduceScatter && redop_is_premul(red))
    set.erase(std::remove(set.begin(), set.end(), PathId::kSumKernel), set.end());
  return set;
}

std::vector<PathId> default_sweep_paths(CollOp op) {
  if (op == CollOp::kAllGather) return sweep_path_set(op);
  return {PathId::kNcclKernel, PathId::kNcclPolicy, PathId::kZeroctaPolicy};
}

const char* const kMulticastOffEnv[2] = {"NCCL_NVLS_ENABLE=0",
                                         "TORCH_SYMM_MEM_DISABLE_MULTICAST=1"};

int check_gpu_count(const Options& o, int visible, const std::string& no_gpu_reason,
                    std::string* message) {
  if (visible == 0 && o.ngpus == 0) {
    *message = "# zerocta-bench: no GPU found (" + no_gpu_reason + "); nothing to measure.";
    return kExitOk;
  }
  if (visible < 2 && o.ngpus == 0) {
    *message = "# zerocta-bench: only " + std::to_string(visible) +
               " GPU found; the comparison needs at least 2. Nothing to measure.";
    return kExitOk;
  }
  const int nranks = o.ngpus > 0 ? o.ngpus : visible;
  if (nranks > visible) {
    *message = "zerocta-bench: " + (o.ranks_option.empty() ? std::string("-g") : o.ranks_option) +
               " " + std::to_string(nranks) + " but only " + std::to_string(visible) +
               " GPU(s) visible";
    if (visible == 0) *message += " (" + no_gpu_reason + ")";
    return kExitUsage;
  }
  if (nranks < 2) {
    // One rank has no peer: no copy engine, no communication to compare.
    *message =
        "zerocta-bench: the comparison needs at least 2 ranks (-g " + std::to_string(nranks) + ")";
    return kExitUsage;
  }
  return -1;
}

bool parse_dtype(const std::string& name, DataType* out) {
  for (const DataType& t : kTypes) {
    if (name == t.name) {
      *out = t;
      return true;
    }
  }
  return false;
}

uint64_t Options::contention_total_bytes(int nranks) const {
  if (contention_bytes != 0) return contention_bytes;
  return (256ull << 20) * static_cast<uint64_t>(nranks > 0 ? nranks : 1);
}

bool parse_size(const std::string& text, uint64_t* out) {
  if (text.empty() || !isdigit(static_cast<unsigned char>(text[0]))) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(text.c_str(), &end, 10);
  if (errno != 0) return false;
  std::string suffix(end);
  unsigned shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else {
    char c = static_cast<char>(toupper(static_cast<unsigned char>(suffix[0])));
    std::string rest = suffix.substr(1);
    if (!(rest.empty() || rest == "B" || rest == "iB")) return false;
    switch (c) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        return false;
    }
  }
  if (shift != 0 && v > (std::numeric_limits<uint64_t>::max() >> shift)) return false;
  *out = static_cast<uint64_t>(v) << shift;
  return true;
}

std::string format_size(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (v == std::floor(v))
    snprintf(buf, sizeof(buf), "%.0f %s", v, kUnits[u]);
  else
    snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  return buf;
}

int events_every(const Options& o, int n) {
  if (o.events_every > 0) return o.events_every;
  return std::max(1, (n + 4) / 5);
}

std::vector<uint64_t> sweep_sizes(const Options& o) {
  std::vector<uint64_t> out;
  if (o.min_bytes == 0 || o.min_bytes > o.max_bytes) return out;
  uint64_t s = o.min_bytes;
  while (s <= o.max_bytes) {
    out.push_back(s);
    if (o.step_factor <= 1 || s > o.max_bytes / o.step_factor) break;
    s *= o.step_factor;
  }
  return out;
}

uint64_t per_rank_count(uint64_t total_bytes, int nranks, int dtype_bytes) {
  if (nranks <= 0 || dtype_bytes <= 0) return 0;
  return total_bytes / static_cast<uint64_t>(dtype_bytes) / static_cast<uint64_t>(nranks);
}

CollShape sweep_shape(const Options& o, uint64_t size_bytes, int nranks) {
  return coll_shape(o.op, size_bytes, nranks, o.dtype.bytes);
}

bool parse_options(int argc, char** argv, Options* o, bool* help, std::string* error) {
  *help = false;
  bool redop_given = false;  // --redop other than sum
  // --quick first, so explicit flags override the preset whatever their order.
  for (int i = 1; i < argc; ++i)
    if (strcmp(argv[i], "--quick") == 0) {
      o->quick = true;
      apply_quick_preset(o);
    }

  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string value;
    // Accept "--flag=value" as well as "--flag value".
    size_t eq = a.find('=');
    bool has_inline = a.rfind("--", 0) == 0 && eq != std::string::npos;
    if (has_inline) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    auto need = [&](std::string* v) {
      if (has_inline) {
        *v = value;
        return true;
      }
      if (i + 1 >= argc) {
        *error = "option " + a + " needs a value";
        return false;
      }
      *v = argv[++i];
      return true;
    };
    auto bad = [&](const std::string& v, const char* what) {
      *error = "invalid value \"" + v + "\" for " + a + " (" + what + ")";
      return false;
    };
    std::string v;
    long n = 0;
    if (a == "-h" || a == "--help") {
      *help = true;
      return true;
    } else if (a == "--quick") {
      // handled above
    } else if (a == "-g" || a == "--ngpus" || a == "--procs") {
      // nccl-tests' -g: GPUs one thread drives, in one process; --procs: a process per rank.
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 1024, &n)) return bad(v, a == "--procs" ? "ranks >= 1" : "GPUs >= 1");
      const std::string which = a == "--procs" ? "--procs" : "-g";
      if (!o->ranks_option.empty() && o->ranks_option != which) {
        *error =
            "-g (GPUs of one thread, in one process, as nccl-tests) and --procs (a process "
            "per rank) exclude each other";
        return false;
      }
      o->ranks_option = which;
      o->ngpus = static_cast<int>(n);
      if (which == "-g") o->one_process = true;
    } else if (a == "-t" || a == "--nthreads") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 1024, &n)) return bad(v, "threads >= 1");
      if (n != 1) {
        *error = "-t " + v + ": threads per process, as in nccl-tests; this bench drives a " +
                 "process's GPUs from one thread (-g N), or runs a process per rank (--procs N)";
        return false;
      }
    } else if (a == "-b" || a == "--minbytes") {
      if (!need(&v)) return false;
      if (!parse_size(v, &o->min_bytes) || o->min_bytes == 0) return bad(v, "a size like 1M");
    } else if (a == "-e" || a == "--maxbytes") {
      if (!need(&v)) return false;
      if (!parse_size(v, &o->max_bytes) || o->max_bytes == 0) return bad(v, "a size like 1G");
    } else if (a == "-f" || a == "--stepfactor") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 1024, &n)) return bad(v, "integer factor >= 1");
      o->step_factor = static_cast<uint64_t>(n);
    } else if (a == "-n" || a == "--iters") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 100000, &n)) return bad(v, "1..100000");
      o->iters = static_cast<int>(n);
    } else if (a == "-w" || a == "--warmup_iters" || a == "--warmups") {
      if (!need(&v)) return false;
      if (!parse_int(v, 0, 100000, &n)) return bad(v, "0..100000");
      o->warmups = static_cast<int>(n);
    } else if (a == "-c" || a == "--check") {
      if (!need(&v)) return false;
      if (!parse_int(v, 0, 1, &n)) return bad(v, "0 or 1");
      o->check = n != 0;
    } else if (a == "-d" || a == "--datatype" || a == "--dtype") {
      if (!need(&v)) return false;
      if (!parse_dtype(v, &o->dtype))
        return bad(v,
                   "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2");
    } else if (a == "--redop") {
      if (!need(&v)) return false;
      if (!parse_redop(v, &o->redop)) return bad(v, "sum|avg|premul|premul-dev");
      redop_given = v != "sum";
    } else if (a == "--rs-ctas") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 1024, &n)) return bad(v, "1..1024");
      o->rs_ctas = static_cast<int>(n);
    } else if (a == "--op") {
      if (!need(&v)) return false;
      if (!parse_op(v, &o->op)) return bad(v, "allgather|allreduce|reducescatter|broadcast");
    } else if (a == "--paths") {
      if (!need(&o->paths_text)) return false;
      if (o->paths_text.empty()) return bad(o->paths_text, "a comma list of paths");
    } else if (a == "--contention-paths") {
      if (!need(&o->contention_paths_text)) return false;
      if (o->contention_paths_text.empty()) return bad(v, "a comma list of paths");
      o->contention = true;
    } else if (a == "--json") {
      if (!need(&o->json_path)) return false;
      if (o->json_path.empty()) return bad(v, "a file name");
    } else if (a == "--contention") {
      o->contention = true;
    } else if (a == "--contention-bytes") {
      if (!need(&v)) return false;
      if (!parse_size(v, &o->contention_bytes) || o->contention_bytes == 0)
        return bad(v, "a size like 512M");
      o->contention = true;
    } else if (a == "--gemm") {
      if (!need(&v)) return false;
      if (!parse_gemm(v, o)) return bad(v, "M,N,K each 16..65536");
    } else if (a == "--contention-mode") {
      if (!need(&v)) return false;
      if (v == "fixed")
        o->contention_mode = ContentionMode::kFixed;
      else if (v == "saturate")
        o->contention_mode = ContentionMode::kSaturate;
      else
        return bad(v, "fixed|saturate");
      o->contention = true;
    } else if (a == "--contention-ops") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 100000, &n)) return bad(v, "1..100000");
      o->contention_ops = static_cast<int>(n);
      o->contention = true;
    } else if (a == "--contention-placement") {
      if (!need(&v)) return false;
      if (v != "in" && v != "out" && v != "both") return bad(v, "in|out|both");
      o->contention_placement = v;
      o->contention = true;
    } else if (a == "--rounds") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 100, &n)) return bad(v, "1..100");
      o->rounds = static_cast<int>(n);
    } else if (a == "--repeats") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 1000, &n)) return bad(v, "1..1000");
      o->repeats = static_cast<int>(n);
    } else if (a == "--alloc") {
      if (!need(&v)) return false;
      if (!parse_alloc(v, &o->alloc)) return bad(v, "cudamalloc|cumem|ncclmem");
    } else if (a == "--cumem-chunk") {
      if (!need(&v)) return false;
      if (!parse_size(v, &o->cumem_chunk_bytes) || o->cumem_chunk_bytes == 0)
        return bad(v, "a size like 20M");
    } else if (a == "--cumem-props") {
      if (!need(&v)) return false;
      if (!parse_cumem_props(v, &o->cumem_props)) return bad(v, "none or rdma,recommended,peers");
    } else if (a == "--one-process") {
      o->one_process = true;
    } else if (a == "--graph") {
      o->graph = true;
    } else if (a == "--iter-times") {
      o->iter_times = true;
    } else if (a == "--events-every") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 100000, &n)) return bad(v, "1..100000");
      o->events_every = static_cast<int>(n);
    } else if (a == "--gemm-iters") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 100000, &n)) return bad(v, "1..100000");
      o->gemm_iters = static_cast<int>(n);
    } else if (a == "--zerocta-lib") {
      if (!need(&o->zerocta_lib)) return false;
    } else if (a == "--allow-fallback") {
      o->allow_fallback = true;
    } else if (a == "--seed") {
      if (!need(&v)) return false;
      if (!parse_int(v, 0, std::numeric_limits<long>::max(), &n)) return bad(v, "integer");
      o->seed = static_cast<uint64_t>(n);
    } else if (a == "--timeout") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 86400, &n)) return bad(v, "seconds");
      o->timeout_s = static_cast<int>(n);
    } else if (a == "--deadline") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 86400, &n)) return bad(v, "seconds");
      o->deadline_s = static_cast<int>(n);
    } else if (a == "--dry-run") {
      o->dry_run = true;
    } else if (a == "--multicast-off" || a == "--test-host") {  // the latter: its former name
      o->multicast_off = true;
    } else if (a == "--self-test") {
      o->self_test = true;
    } else if (a == "--fake-gpus") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 64, &n)) return bad(v, "1..64");
      o->fake_gpus = static_cast<int>(n);
    } else if (a == "--worker-path") {
      if (!need(&o->worker_path)) return false;
      PathId p;
      if (!parse_path_name(o->worker_path, &p)) return bad(o->worker_path, "a path name");
    } else if (a == "--worker-mode") {
      if (!need(&o->worker_mode)) return false;
      if (o->worker_mode != "sweep" && o->worker_mode != "contention")
        return bad(o->worker_mode, "sweep|contention");
    } else if (a == "--worker-rank") {
      if (!need(&v)) return false;
      if (!parse_int(v, -1, 1023, &n)) return bad(v, "rank");
      o->worker_rank = static_cast<int>(n);
    } else if (a == "--worker-nranks") {
      if (!need(&v)) return false;
      if (!parse_int(v, 1, 1024, &n)) return bad(v, "ranks");
      o->worker_nranks = static_cast<int>(n);
    } else if (a == "--worker-repeat") {
      if (!need(&v)) return false;
      if (!parse_int(v, 0, 1000, &n)) return bad(v, "repeat");
      o->worker_repeat = static_cast<int>(n);
    } else if (a == "--worker-fds") {
      if (!need(&v)) return false;
      std::vector<std::string> fds = split_commas(v);
      long in = 0, out = 0;
      if (fds.size() != 2 || !parse_int(fds[0], 0, 65535, &in) ||
          !parse_int(fds[1], 0, 65535, &out))
        return bad(v, "IN,OUT");
      o->worker_in_fd = static_cast<int>(in);
      o->worker_out_fd = static_cast<int>(out);
    } else {
      *error = "unknown option " + a + " (see --help)";
      return false;
    }
  }
  if (o->min_bytes > o->max_bytes) {
    *error = "-b (minbytes) is larger than -e (maxbytes)";
    return false;
  }
  // The path list depends on the op, which may come after --paths on the command line.
  if (o->paths_text.empty())
    o->paths = default_sweep_paths(o->op);
  else if (!parse_path_list(o->paths_text, sweep_path_set(o->op, o->reduction()),
                            std::string("to --op ") + op_name(o->op) +
                                (redop_is_premul(o->reduction())
                                     ? std::string(" --redop ") + redop_name(o->redop)
                                     : std::string()),
                            &o->paths, error))
    return false;
  if (o->contention_paths_text.empty())
    o->contention_paths = default_contention_paths(o->contention_op());
  else if (!parse_path_list(o->contention_paths_text, contention_path_set(o->contention_op()),
                            std::string("to --contention with --op ") + op_name(o->contention_op()),
                            &o->contention_paths, error))
    return false;
  add_contention_floor(&o->contention_paths);
  if (o->contention && !contention_supports(o->op)) {
    *error = std::string(
                 "--contention measures all-gathers and reduce-scatters; run it without "
                 "--op ") +
             op_name(o->op) + " (or with --op allgather or reducescatter)";
    return false;
  }
  if (o->op == CollOp::kReduceScatter && !reducescatter_dtype_ok(o->dtype.nccl)) {
    *error = std::string(
                 "--op reducescatter takes --dtype float, bf16 or half (random inputs "
                 "checked against NCCL's own result), not ") +
             o->dtype.name;
    return false;
  }
  if (redop_given && o->op != CollOp::kReduceScatter) {
    *error = "--redop " + std::string(redop_name(o->redop)) +
             " applies to --op reducescatter only (all-reduces sum)";
    return false;
  }
  if (o->is_worker() && (o->worker_mode.empty() || o->worker_nranks <= 0 || o->worker_in_fd < 0 ||
                         o->worker_out_fd < 0)) {
    *error = "incomplete worker flags (internal)";
    return false;
  }
  return true;
}

std::string usage_text(const char* argv0) {
  std::string s = "Usage: ";
  s += argv0;
  s += R"( [options]

Measures the bus bandwidth of one collective (--op) on several paths side by side on the local
GPUs (one process per rank, no MPI), nccl-tests style, then compares them, including each
path's communicator init time and first-operation time.

Paths (--paths; each runs in its own set of rank processes, one after another):
  nccl-kernel     cudaMalloc buffers, ncclCommInitRank: what applications get today
  nccl-policy     the same with ncclCommInitRankConfig and CTAPolicy=NCCL_CTA_POLICY_ZERO:
                  an application that sets the zero-CTA policy itself (no shim)
  zerocta-policy  nccl-kernel's code under LD_PRELOAD=libzerocta.so, ZEROCTA_ALLGATHER=nccl:
                  the shim changes only the CTA policy (FAILED if a communicator did not get it)
  nccl-ce         (allgather only) NCCL's copy-engine all-gather as a modified application
                  gets it: CTAPolicy=NCCL_CTA_POLICY_ZERO, ncclMemAlloc + symmetric windows
  zerocta         nccl-kernel's code under LD_PRELOAD=libzerocta.so, ZEROCTA_ALLGATHER=zerocta
                  (--op reducescatter: also ZEROCTA_REDUCESCATTER=zerocta); all-gathers and
                  reduce-scatters: FAILED if one did not take zerocta's "ce" route; other ops
                  are forwarded to NCCL
  zerocta-auto    the same with ZEROCTA_ALLGATHER=auto (ZEROCTA_REDUCESCATTER=auto): shows the
                  router's choice per size
  ceiling         (allgather only) bare copy-engine writes of each GPU's chunk to every
                  peer, one cudaMemcpyBatchAsync per GPU, one process, no protocol; 3+ GPUs
                  keep in step (each op starts when every GPU's previous one ended: events)
  bare-ce         the floor of the copy engines: allgather: --contention only (always run),
                  the ceiling's pushes; reducescatter: a sweep row too, every GPU writes each
                  peer's chunk of its input (the op's per-peer bytes) into that peer's buffer,
                  one cudaMemcpyBatchAsync per GPU and op, no reduction
  sum-kernel      (reducescatter only) the route's reduction kernel alone
                  (src/route/chunk_sum.cu, built into the bench) on GPU 0: nranks chunks of the
                  op's output size summed into one, --rs-ctas CTAs
Default paths: allgather: every path but bare-ce; allreduce, reducescatter, broadcast:
nccl-kernel, nccl-policy, zerocta-policy ("--paths all" adds zerocta and zerocta-auto, and
for reducescatter bare-ce and sum-kernel).
The NCCL paths run one process per rank by default; with --one-process each runs as one
process whose one thread drives every GPU (ncclGroupStart/End around the per-GPU calls; the
shim paths in one re-executed process under LD_PRELOAD).

nccl-tests options (sizes as nccl-tests prints them: allgather total output bytes, allreduce
and broadcast the buffer, reducescatter total input bytes):
  --op OP     allgather (default), allreduce, reducescatter, broadcast (ncclSum, root 0)
  -g N        GPUs driven by one thread, in one process (as nccl-tests; the NCCL paths
              then run as --one-process); default: every visible GPU, a process per rank
  -t N        threads per process (as nccl-tests): only 1 (see -g and --procs)
  -b SIZE     min size (default 1M)          -e SIZE   max size (default 1G)
  -f N        step factor (default 4)        -n N      timed iterations (default 20)
  -w N        warm-up iterations (default 5) -c 0|1    check results (default 1)
  -d TYPE     int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2
              (default float; also --dtype; reducescatter: float, bf16 or half only)
Reduce-scatter options:
  --redop R   sum (default), avg (ncclAvg), premul or premul-dev: a pre-multiplied sum
              (ncclRedOpCreatePreMulSum, made before and destroyed right after every call on
              each communicator, as PyTorch does), rank r of n multiplying its input by
              (r+1)/(n+1) rounded to the type; premul passes the scalar from the host
              (ncclScalarHostImmediate), premul-dev in device memory (ncclScalarDevice); no
              sum-kernel path
  --rs-ctas N CTAs of the sum-kernel row's reduction kernel (default 16)
  The reduce-scatter's #wrong compares every path's output bitwise with NCCL's own kernel
  result on the same random inputs (computed in each rank's process on communicators of the
  real libnccl, which the shim never sees); the maxdiff column is the largest |output -
  float64 reference|: the inputs' exact sum (avg: mean; premul, premul-dev: the sum of each
  input times its rank's scalar).
Other options:
  --paths LIST           comma list of the paths above, "all" (every path --op can run) or
                         "none"
  --json FILE            write machine info, every row and the contention results as JSON
  --alloc A              buffers of the NCCL paths but nccl-ce: cudamalloc (default), ncclmem
                         (ncclMemAlloc without a window: the memory NCCL CE's windows are
                         made of, one cuMem allocation a buffer) or cumem
                         (PyTorch's expandable segments: one reserved VA range, 20 MiB
                         cuMemCreate chunks with POSIX fd handles, mapped back to back)
  --cumem-chunk SIZE     the physical allocations of --alloc cumem buffers (default 20M; a
                         size at least the buffer's gives one allocation, as ncclMemAlloc)
  --cumem-props LIST     what ncclMemAlloc also gives its memory, for --alloc cumem buffers:
                         rdma (gpuDirectRDMACapable where supported), recommended
                         (the recommended granularity for chunks and VA alignment, not
                         the minimum), peers (access for every device that can reach
                         it); default none
  --procs N              N ranks, each in a process of its own (nccl-tests under mpirun -np N
                         -g 1); the default with every visible GPU when neither -g nor --procs
                         is given
  --one-process          the NCCL paths as one process, one thread driving every GPU
                         (nccl-tests -g N); default: one process per rank
  --graph                the sweep's checked op and timed iterations are replays of a CUDA
                         graph that captured the op once per size and placement (global
                         capture mode); the first-op column stays eager
  --rounds R             the sweep's paths R times (default 1), the order rotated each round,
                         then each path's busbw and its ratio to nccl-ce (else nccl-kernel)
                         in the same round: median (min..max) over the rounds, and in how many
                         rounds it was at least the baseline's
  --events-every K       a timed event every K ops of a timed loop (default: the loop in 5
                         runs, so the median columns are the median run's time per op); 1
                         times each op, which lengthens a route's op on a stream that only
                         waits on and records events by 4-6 us (docs/PERFORMANCE.md)
  --iter-times           print each timed interval's time per op on each rank (stderr,
                         "# iter-times" lines; the sweep's, and --contention's all-gathers
                         alone and overlapped): what the mean and median columns summarize
  --contention           (allgather, reducescatter) after the sweep, a cuBLAS bf16 GEMM loop
                         overlapped with the op (all-gathers, or with --op reducescatter
                         reduce-scatters of --dtype/--redop on random inputs) on another
                         stream, against both alone (default paths: nccl-kernel, nccl-ce,
                         zerocta, bare-ce; reducescatter: nccl-kernel, zerocta, bare-ce)
  --contention-paths L   paths for --contention: a comma list of nccl-kernel, nccl-policy,
                         zerocta-policy, nccl-ce (allgather only), zerocta, zerocta-auto,
                         bare-ce, or "all"; bare-ce (the floor) is always added
  --contention-mode M    fixed (default): every path runs the same --contention-ops
                         all-gathers against the same --gemm-iters GEMMs; saturate: all-gathers
                         back to back until they cover twice the GEMM loop
  --contention-ops N     all-gathers (reduce-scatters) per run in fixed mode (default 40)
  --contention-placement P  in, out or both (default): in-place (send = own piece of the
                         output) and/or out-of-place all-gathers, one table each
  --repeats R            runs of the whole contention path set, order rotated each run
                         (default 5); every metric is the median (min..max) over them
  --contention-bytes S   the op's size: all-gather total output, reduce-scatter total input
                         (default 256 MiB per rank)
  --gemm M,N,K           GEMM shape (default 8192,8192,8192)
  --gemm-iters N         GEMMs per run (default 20)
  --zerocta-lib PATH     libzerocta.so for the zerocta paths (default: $ZEROCTA_LIB, else
                         <dir of this binary>/../libzerocta.so, else ../lib/libzerocta.so)
  --allow-fallback       report, but do not fail on, zerocta all-gathers (reduce-scatters) that
                         took another route
  --quick                smoke preset: -b 1M -e 64M -f 8 -n 5 -w 2, GEMM 4096^3 x 10,
                         10 all-gathers, 3 repeats
  --timeout SEC          per path (default: from the estimate, at least 90)
  --deadline SEC         whole run (default 450); paths not started by then are SKIPPED
  --seed N               data pattern seed
  --multicast-off        run every worker with NVLink multicast off: NCCL_NVLS_ENABLE=0 and
                         TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (for machines that must not use
                         it; printed when used). Without it the workers get the caller's
                         environment as it is.
  --dry-run              probe the GPUs, print the plan and the time estimate, run nothing
  --self-test            CPU self-test of parsing, math and report formatting
  -h, --help             this text

Exit status: 0 all paths OK (also when, without -g, fewer than 2 GPUs are found: a line
               says so),
             1 a path FAILED (wrong data, a worker died or hung, a zerocta fallback,
               a zerocta-policy communicator created without the zero-CTA policy),
             2 usage error (also -g or --procs larger than the GPUs visible, e.g. --procs 2
               without a GPU, or 1 rank), or libzerocta.so not found while a zerocta path
               is requested.
)";
  return s;
}

}  // namespace zcb
