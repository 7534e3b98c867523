// zerocta-bench: one collective's paths side by side (see --help). The parent never touches CUDA:
// it probes the GPUs in a forked child and runs every path in rank processes of its own
// (launcher.h), so each path gets a fresh process environment and a hang costs one path only.
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>

#include "gpu_telemetry.h"
#include "launcher.h"
#include "options.h"
#include "plan.h"
#include "probe.h"
#include "report.h"
#include "worker.h"

namespace zcb {
int run_self_test();  // selftest.cc
}

namespace {

using namespace zcb;
using Clock = std::chrono::steady_clock;

std::string exe_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string p(buf);
  size_t slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

bool is_file(const std::string& p) { return access(p.c_str(), R_OK) == 0; }

std::string absolute(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : p;
}

// --zerocta-lib, else $ZEROCTA_LIB, else next to the build tree / install tree of this binary.
// Returns "" (and *tried) when none exists.
std::string resolve_shim(const Options& o, std::string* tried) {
  std::vector<std::string> candidates;
  if (!o.zerocta_lib.empty()) {
    candidates.push_back(o.zerocta_lib);
  } else if (const char* env = getenv("ZEROCTA_LIB"); env && *env) {
    candidates.push_back(env);
  } else {
    candidates.push_back(exe_dir() + "/../libzerocta.so");
    candidates.push_back(exe_dir() + "/../lib/libzerocta.so");
  }
  for (const std::string& c : candidates) {
    if (is_file(c)) return absolute(c);
    *tried += (tried->empty() ? "" : ", ") + c;
  }
  return "";
}

std::string now_iso() {
  char buf[64];
  time_t t = time(nullptr);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S%z", &tm);
  return buf;
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void print_machine(const BenchReport& b) {
  const MachineInfo& m = b.machine;
  printf("# zerocta-bench: host %s, %d GPU(s) visible, using %d rank(s), --alloc %s, %s%s\n",
         m.hostname.c_str(), m.gpu_count, b.nranks, alloc_name(b.o->alloc),
         b.o->one_process ? "one process drives every GPU" : "one process per rank",
         m.fake ? "  [FAKE GPUs: synthetic numbers, for testing the bench]" : "");
  printf(
      "# driver %s, CUDA driver API %s, runtime %s, NCCL %s (as loaded by this binary; each "
      "rank prints its own)\n",
      m.driver_version.empty() ? "?" : m.driver_version.c_str(),
      cuda_version_string(m.cuda_driver_version).c_str(),
      cuda_version_string(m.cuda_runtime_version).c_str(),
      nccl_version_string(m.nccl_version).c_str());
  for (size_t i = 0; i < m.gpus.size(); ++i)
    printf("#   GPU %zu: %s [%s] %.0f GiB\n", i, m.gpus[i].name.c_str(), m.gpus[i].bus_id.c_str(),
           m.gpus[i].memory_bytes / 1073741824.0);
  if (!m.p2p_missing.empty()) {
    printf("# WARNING: no peer access for");
    for (const std::string& s : m.p2p_missing) printf(" %s", s.c_str());
    printf(": NCCL's CE path, zerocta's ce route and the ceiling need P2P\n");
  }
  if (const char* pol = getenv("NCCL_CTA_POLICY"))
    printf(
        "# WARNING: NCCL_CTA_POLICY=%s is set and overrides every communicator's config "
        "(nccl-kernel is then not what applications get by default)\n",
        pol);
}

// Prints the plan with its estimate; returns the estimated seconds.
double print_plan(const Options& o, int nranks) {
  double total = 0;
  printf("# Plan (estimates are pessimistic; startup dominates):\n");
  for (PathId p : o.paths) {
    double e = estimate_sweep_s(o, p, nranks);
    total += e * o.rounds;
    printf("#   sweep      %-13s %-14s ~%5.0f s x %d rounds (limit %d s each)\n", op_name(o.op),
           path_name(p), e, o.rounds, path_timeout_s(o, e));
  }
  if (o.contention)
    for (PathId p : o.contention_paths) {
      double e = estimate_contention_s(o, p, nranks);
      total += e * o.repeats;
      printf("#   contention %-13s %-14s ~%5.0f s x %d runs (limit %d s each)\n",
             op_name(o.contention_op()),
             path_name(p), e, o.repeats, path_timeout_s(o, e));
    }
  printf("#   total ~%.0f s; whole-run deadline %d s (paths not started by then are SKIPPED)\n",
         total, o.deadline_s);
  fflush(stdout);
  return total;
}

// Limit for the next path: its own, cut to what is left of the run's deadline.
int next_limit(const Options& o, double estimate, Clock::time_point start) {
  const int left = o.deadline_s - static_cast<int>(since(start));
  return std::min(path_timeout_s(o, estimate), left);
}

// The route every timed `op` of a path must take (the path forces it), or -1: zerocta's
// all-gathers and reduce-scatters take its ce route.
int forced_route(PathId p, CollOp op) {
  return p == PathId::kZerocta && path_routes_op(p, op) ? zerocta_route_ce : -1;
}

std::string off_route_message(uint64_t calls, CollOp op) {
  return std::to_string(calls) + (op == CollOp::kReduceScatter ? " reduce-scatters" : " all-gathers") +
         " did not take zerocta's ce route";
}

// zerocta-policy measures the shim's policy, so every process must report that every
// communicator it created got NCCL_CTA_POLICY_ZERO.
bool policy_applied(const PathResult& r, int nranks, int nprocs) {
  return r.shim_reports == nprocs && r.comms_created >= static_cast<uint64_t>(nranks) &&
         r.comms_zero_policy == r.comms_created;
}

void run_sweep_path(BenchReport* b, PathResult* r, const std::vector<std::string>& args,
                    int limit) {
  const Options& o = *b->o;
  r->timeout_s = limit;
  r->rows.assign(b->sizes.size(), RowAgg());
  print_path_banner(stdout, *r, *b);
  const bool shim = path_uses_shim(r->path);
  LaunchSpec spec;
  spec.path = r->path;
  spec.op = o.op;
  spec.mode = "sweep";
  spec.nranks = b->nranks;
  spec.one_process = o.one_process;
  spec.args = args;
  spec.shim_lib = b->shim_lib;
  spec.multicast_off = o.multicast_off;
  spec.timeout_s = limit;
  LaunchOutcome out = run_path(spec, [&](uint32_t type, const std::vector<char>& p) {
    if (type == kMsgHello && p.size() == sizeof(HelloMsg)) {
      RankInfo ri;
      memcpy(&ri.hello, p.data(), sizeof(HelloMsg));
      r->ranks.push_back(ri);
      print_rank_line(stdout, ri.hello, *b);
    } else if (type == kMsgInitTimes && p.size() == sizeof(InitTimesMsg)) {
      InitTimesMsg m;
      memcpy(&m, p.data(), sizeof(m));
      add_init(r, m, b->nranks);
    } else if (type == kMsgRow && p.size() == sizeof(RowMsg)) {
      RowMsg m;
      memcpy(&m, p.data(), sizeof(m));
      if (add_row(r, m, b->nranks, o.op)) {
        if (!r->header_printed)
          print_table_header(stdout, shim, o.op == CollOp::kReduceScatter);
        r->header_printed = true;
        printf("%s\n", format_row(r->rows[m.size_index], o.op, o.dtype.name, shim,
                                   o.redop_label())
                            .c_str());
        fflush(stdout);
      }
    } else if (type == kMsgShimTotals && p.size() == sizeof(ShimTotalsMsg)) {
      ShimTotalsMsg m;
      memcpy(&m, p.data(), sizeof(m));
      ++r->shim_reports;
      for (int i = 0; i < zerocta_route_count; ++i) r->shim_op_calls[i] += m.op_calls[i];
      r->comms_created += m.comms_created;
      r->comms_zero_policy += m.comms_zero_policy;
      r->comms_ce_ready += m.comms_ce_ready;
    }
  });
  r->seconds = out.seconds;
  b->interrupted |= out.interrupted;
  r->status = out.ok ? "OK" : "FAILED";
  r->error = out.error;
  if (out.ok) {
    size_t expected = 0, complete = 0;
    for (size_t i = 0; i < b->sizes.size(); ++i) {
      if (sweep_shape(o, b->sizes[i], b->nranks).count == 0) continue;
      ++expected;
      complete += r->complete(i, b->nranks);
    }
    const int64_t wrong = r->wrong_total();
    if (complete != expected) {
      r->status = "FAILED";
      r->error = "only " + std::to_string(complete) + " of " + std::to_string(expected) +
                 " sizes reported by every rank";
    } else if (wrong > 0) {
      r->status = "FAILED";
      r->error = std::to_string(wrong) + " wrong elements";
    } else if (const int nprocs = path_process_count(r->path, o.one_process, b->nranks);
               r->path == PathId::kZeroctaPolicy && !policy_applied(*r, b->nranks, nprocs)) {
      r->status = "FAILED";
      r->error = "the shim created " + std::to_string(r->comms_zero_policy) + " of " +
                 std::to_string(r->comms_created) + " communicators (" +
                 std::to_string(r->shim_reports) + " of " + std::to_string(nprocs) +
                 " processes reporting) with NCCL_CTA_POLICY_ZERO; check ZEROCTA_CTA_POLICY and "
                 "ZEROCTA_ENABLE";
    } else if (const int want = forced_route(r->path, o.op);
               want >= 0 && r->off_route_calls(want) > 0) {
      const std::string msg =
          off_route_message(r->off_route_calls(want), o.op) + " (see the route column)";
      if (o.allow_fallback)
        r->error = "WARNING: " + msg;
      else {
        r->status = "FAILED";
        r->error = msg + "; --allow-fallback to accept";
      }
    }
  }
  print_path_footer(stdout, *r, *b);
}

// One run of a contention path (one repeat, every placement), with nvidia-smi's readings
// right before and right after it.
void run_contention_path(BenchReport* b, const ContentionResult& r, ContentionRun* run,
                         const std::vector<std::string>& args, int limit) {
  const Options& o = *b->o;
  LaunchSpec spec;
  spec.path = r.path;
  spec.op = o.contention_op();
  spec.mode = "contention";
  spec.nranks = b->nranks;
  spec.one_process = o.one_process;
  spec.repeat = run->repeat;
  spec.args = args;
  spec.shim_lib = b->shim_lib;
  spec.multicast_off = o.multicast_off;
  spec.timeout_s = limit;
  run->before = read_gpu_telemetry();
  LaunchOutcome out = run_path(spec, [&](uint32_t type, const std::vector<char>& p) {
    if (type == kMsgHello && p.size() == sizeof(HelloMsg) && run->repeat == 0) {
      HelloMsg h;
      memcpy(&h, p.data(), sizeof(h));
      print_rank_line(stdout, h, *b);
    } else if (type == kMsgContention && p.size() == sizeof(ContentionMsg)) {
      ContentionMsg m;
      memcpy(&m, p.data(), sizeof(m));
      run->msgs.push_back(m);
    }
  });
  run->after = read_gpu_telemetry();
  run->seconds = out.seconds;
  b->interrupted |= out.interrupted;
  run->status = out.ok ? "OK" : "FAILED";
  run->error = out.error;
  const size_t expected = b->nranks * contention_placements(o.contention_placement).size();
  if (out.ok && run->msgs.size() != expected) {
    run->status = "FAILED";
    run->error = std::to_string(run->msgs.size()) + " of " + std::to_string(expected) +
                 " rank results (ranks x placements) reported";
  }
  if (const int want = forced_route(r.path, o.contention_op()); out.ok && want >= 0) {
    uint64_t other = 0;
    for (const ContentionMsg& c : run->msgs)
      for (int i = 0; i < zerocta_route_count; ++i)
        if (i != want) other += c.route_calls[i];
    if (other > 0 && !o.allow_fallback) {
      run->status = "FAILED";
      run->error = off_route_message(other, o.contention_op());
    }
  }
  print_contention_run(stdout, r, *run, o.repeats);
}

// Every contention path --repeats times, the order rotated each repeat so that no path always
// runs first (cold) or right after the same neighbour.
void run_contention_study(BenchReport* b, const std::vector<std::string>& args,
                          Clock::time_point start) {
  const Options& o = *b->o;
  for (PathId p : o.contention_paths) {
    b->contention.emplace_back();
    b->contention.back().path = p;
  }
  printf("#\n# Contention: %d run(s) of %zu paths, order rotated each run\n", o.repeats,
         o.contention_paths.size());
  for (int rep = 0; rep < o.repeats; ++rep) {
    const std::vector<PathId> order = rotated_run_order(o.contention_paths, rep);
    for (size_t pos = 0; pos < order.size(); ++pos) {
      ContentionResult& r =
          *std::find_if(b->contention.begin(), b->contention.end(),
                        [&](const ContentionResult& c) { return c.path == order[pos]; });
      r.runs.emplace_back();
      ContentionRun& run = r.runs.back();
      run.repeat = rep;
      run.position = static_cast<int>(pos);
      const int limit = next_limit(o, estimate_contention_s(o, r.path, b->nranks), start);
      if (b->interrupted || limit <= 0) {
        run.status = "SKIPPED";
        run.error = b->interrupted ? "interrupted" : "--deadline reached";
        continue;
      }
      run_contention_path(b, r, &run, args, limit);
    }
  }
  print_contention(stdout, *b);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool help = false;
  std::string error;
  if (!parse_options(argc, argv, &o, &help, &error)) {
    fprintf(stderr, "zerocta-bench: %s\n", error.c_str());
    return kExitUsage;
  }
  if (help) {
    printf("%s", usage_text(argv[0]).c_str());
    return kExitOk;
  }
  if (o.is_worker()) return worker_main(o);
  if (o.self_test) return run_self_test();

  install_parent_signal_handlers();
  const auto start = Clock::now();
  BenchReport b;
  b.o = &o;
  b.started_at = now_iso();
  for (int i = 0; i < argc; ++i) b.argv.push_back(argv[i]);
  b.machine = o.fake_gpus > 0 ? fake_machine(o.fake_gpus) : probe_machine(60);
  const bool driver = access("/proc/driver/nvidia/version", R_OK) == 0;
  std::string gpu_message;
  const int gpu_exit = check_gpu_count(
      o, b.machine.gpu_count,
      (driver ? "" : "no NVIDIA kernel driver loaded; ") + b.machine.no_gpu_reason, &gpu_message);
  if (gpu_exit >= 0) {
    fprintf(gpu_exit == kExitOk ? stdout : stderr, "%s\n", gpu_message.c_str());
    return gpu_exit;
  }
  b.nranks = o.ngpus > 0 ? o.ngpus : b.machine.gpu_count;

  bool need_shim = false;
  for (PathId p : o.paths) need_shim |= path_uses_shim(p);
  if (o.contention)
    for (PathId p : o.contention_paths) need_shim |= path_uses_shim(p);
  if (need_shim) {
    std::string tried;
    b.shim_lib = resolve_shim(o, &tried);
    if (b.shim_lib.empty()) {
      fprintf(stderr,
              "zerocta-bench: libzerocta.so not found (tried %s); build it, pass "
              "--zerocta-lib PATH or ZEROCTA_LIB, or leave the zerocta paths out of --paths\n",
              tried.c_str());
      return kExitUsage;
    }
  }

  print_machine(b);
  if (o.multicast_off) {
    printf("# --multicast-off: every worker runs with");
    for (const char* kv : kMulticastOffEnv) printf(" %s", kv);
    printf("\n");
  }
  b.sizes = sweep_sizes(o);
  print_plan(o, b.nranks);
  if (o.dry_run) return kExitOk;

  // Workers get the user's command line (they re-parse it) plus the hidden worker flags.
  std::vector<std::string> args(argv + 1, argv + argc);

  b.sweep.reserve(o.paths.size() * o.rounds);  // run_sweep_path holds a reference into it
  for (int round = 0; round < o.rounds; ++round)
    for (PathId p : rotated_run_order(o.paths, round)) {
      b.sweep.emplace_back();
      PathResult& r = b.sweep.back();
      r.path = p;
      r.round = round;
      const int limit = next_limit(o, estimate_sweep_s(o, p, b.nranks), start);
      if (b.interrupted || limit <= 0) {
        r.status = "SKIPPED";
        r.error = b.interrupted ? "interrupted" : "--deadline reached";
        printf("#\n# Path %s: SKIPPED (%s)\n", path_name(p), r.error.c_str());
        continue;
      }
      run_sweep_path(&b, &r, args, limit);
    }
  print_comparison(stdout, b);
  print_rounds(stdout, b);

  if (o.contention) run_contention_study(&b, args, start);

  int status = b.ok() ? kExitOk : kExitFailed;
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    f << report_json(b);
    if (!f) {
      fprintf(stderr, "zerocta-bench: cannot write %s\n", o.json_path.c_str());
      status = kExitFailed;
    } else {
      printf("# JSON written to %s\n", o.json_path.c_str());
    }
  }
  printf("#\n# zerocta-bench: %s (%.1f s)\n", b.ok() ? "OK" : "FAILED", since(start));
  return status;
}
