#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

namespace zcb {

namespace {

const char* const kRouteNames[zerocta_route_count] = {"passthrough", "ce", "nccl_ce"};

void fold(PlaceAgg* a, const PlaceResult& p, bool first) {
  a->time_us = first ? p.mean_us : std::max(a->time_us, p.mean_us);
  a->median_us = first ? p.median_us : std::max(a->median_us, p.median_us);
  if (first)
    a->wrong = p.wrong;
  else if (a->wrong < 0 || p.wrong < 0)
    a->wrong = -1;
  else
    a->wrong += p.wrong;
  for (int i = 0; i < zerocta_route_count; ++i) a->routes[i] += p.route_calls[i];
  if (first)
    a->maxdiff = p.maxdiff;
  else if (a->maxdiff < 0 || p.maxdiff < 0)
    a->maxdiff = -1;
  else
    a->maxdiff = std::max(a->maxdiff, p.maxdiff);
}

std::string time_str(double us) {
  char buf[32];
  if (us < 1e4)
    snprintf(buf, sizeof(buf), "%7.2f", us);
  else if (us < 1e5)
    snprintf(buf, sizeof(buf), "%7.1f", us);
  else
    snprintf(buf, sizeof(buf), "%7.0f", us);
  return buf;
}

std::string wrong_str(int64_t w) { return w < 0 ? "N/A" : std::to_string(w); }

std::string path_description(PathId p, CollOp op) {
  const std::string call = op_nccl_call(op);
  const bool rs = op == CollOp::kReduceScatter;
  const std::string forwards = path_routes_op(PathId::kZerocta, op)
                                   ? ""
                                   : std::string(" (forwards ") + op_name(op) + " to NCCL)";
  const auto shim_env = [&](const char* mode) {
    return std::string("ZEROCTA_ALLGATHER=") + mode +
           (rs ? std::string(", ZEROCTA_REDUCESCATTER=") + mode : std::string());
  };
  switch (p) {
    case PathId::kNcclKernel:
      return "ncclCommInitRank, " + call + " (no shim)";
    case PathId::kNcclPolicy:
      return "ncclCommInitRankConfig with CTAPolicy=NCCL_CTA_POLICY_ZERO, " + call + " (no shim)";
    case PathId::kZeroctaPolicy:
      return "nccl-kernel's program under LD_PRELOAD=libzerocta.so, " + shim_env("nccl") +
             " (the shim changes only the CTA policy)";
    case PathId::kNcclCe:
      return "CTAPolicy=ZERO, ncclMemAlloc + symmetric windows: NCCL's copy-engine all-gather "
             "(no shim)";
    case PathId::kZerocta:
      return "nccl-kernel's program under LD_PRELOAD=libzerocta.so, " + shim_env("zerocta") +
             forwards;
    case PathId::kZeroctaAuto:
      return "nccl-kernel's program under LD_PRELOAD=libzerocta.so, " + shim_env("auto") + forwards;
    case PathId::kCeiling:
      return "bare peer writes, one cudaMemcpyBatchAsync per GPU, one process, no protocol "
             "but 3+ GPUs kept in step by events (per-GPU time, max)";
    case PathId::kBareCe:
      if (rs)
        return "every GPU writes each peer's chunk of its input (the op's per-peer bytes) into "
               "that peer's buffer, one cudaMemcpyBatchAsync per GPU and op, one process, no "
               "reduction (3+ GPUs kept in step by events; per-GPU time, max)";
      return "the ceiling's batched peer writes, back to back";
    case PathId::kSumKernel:
      return "src/route/chunk_sum.cu's kernel alone on GPU 0: the sum (avg: pre-multiplied "
             "sum) of nranks chunks of the op's output size into one, cudaLaunchKernel";
  }
  return "";
}

double time_at(const PathResult* r, size_t i, bool in_place, int nranks) {
  if (!r || i >= r->rows.size() || !r->complete(i, nranks)) return NAN;
  return in_place ? r->rows[i].ip.time_us : r->rows[i].oop.time_us;
}

double max_init(const std::vector<InitTimesMsg>& v, double InitTimesMsg::*field) {
  if (v.empty()) return NAN;
  double m = v.front().*field;
  for (const InitTimesMsg& t : v) m = std::max(m, t.*field);
  return m;
}

}  // namespace

double safe_ratio(double a, double b) { return b > 0 ? a / b : NAN; }

const PathResult* find_path(const BenchReport& b, PathId p, int round) {
  for (const PathResult& r : b.sweep)
    if (r.path == p && r.round == round && r.status != "NOT RUN" && r.status != "SKIPPED")
      return &r;
  return nullptr;
}

double busbw_at(const PathResult* r, size_t i, bool in_place, int nranks) {
  if (!r || i >= r->rows.size() || !r->complete(i, nranks)) return NAN;
  return in_place ? r->rows[i].ip.busbw : r->rows[i].oop.busbw;
}

std::string path_alloc_label(PathId p, BufferAlloc alloc) {
  if (p == PathId::kNcclCe) return "ncclMemAlloc+window";
  if (p == PathId::kSumKernel) return "cudamalloc (one GPU)";
  if (!path_honours_alloc(p)) return "cudamalloc (peer)";
  return alloc_name(alloc);
}

const char* route_name(int route) {
  return route >= 0 && route < zerocta_route_count ? kRouteNames[route] : "?";
}

void coll_bw(CollOp op, uint64_t bytes, double time_us, int nranks, double* algbw, double* busbw) {
  *algbw = time_us > 0 ? static_cast<double>(bytes) / (time_us * 1e3) : 0;
  *busbw = *algbw * bus_factor(op, nranks);
}

bool add_row(PathResult* r, const RowMsg& m, int nranks, CollOp op) {
  if (m.size_index < 0 || static_cast<size_t>(m.size_index) >= r->rows.size()) return false;
  RowAgg& a = r->rows[m.size_index];
  const bool first = a.reported == 0;
  a.bytes = m.bytes;
  a.count = m.count;
  a.first.ms = first ? m.first.ms : std::max(a.first.ms, m.first.ms);
  a.first.call_ms = first ? m.first.call_ms : std::max(a.first.call_ms, m.first.call_ms);
  a.first.windows_ms =
      first ? m.first.windows_ms : std::max(a.first.windows_ms, m.first.windows_ms);
  for (int i = 0; i < zerocta_route_count; ++i) a.first.routes[i] += m.first.route_calls[i];
  fold(&a.oop, m.oop, first);
  fold(&a.ip, m.ip, first);
  if (++a.reported != nranks) return false;
  coll_bw(op, a.bytes, a.oop.time_us, nranks, &a.oop.algbw, &a.oop.busbw);
  coll_bw(op, a.bytes, a.ip.time_us, nranks, &a.ip.algbw, &a.ip.busbw);
  return true;
}

bool add_init(PathResult* r, const InitTimesMsg& m, int nranks) {
  r->init.push_back(m);
  return static_cast<int>(r->init.size()) == nranks;
}

double PathResult::init_ms() const { return max_init(init, &InitTimesMsg::init_ms); }
double PathResult::first_op_ms() const { return max_init(init, &InitTimesMsg::first_op_ms); }

double time_ratio(const PathResult* r, const PathResult* base, size_t i, bool in_place,
                  int nranks) {
  return safe_ratio(time_at(r, i, in_place, nranks), time_at(base, i, in_place, nranks));
}

RatioSummary time_ratio_summary(const PathResult& r, const PathResult& base, int nranks) {
  std::vector<double> v;
  for (size_t i = 0; i < r.rows.size(); ++i)
    for (int ip = 0; ip < 2; ++ip) {
      const double t = time_ratio(&r, &base, i, ip != 0, nranks);
      if (std::isfinite(t)) v.push_back(t);
    }
  RatioSummary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.rows = static_cast<int>(v.size());
  s.min = v.front();
  s.max = v.back();
  const size_t mid = v.size() / 2;
  s.median = v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
  return s;
}

int64_t PathResult::wrong_total() const {
  int64_t sum = 0;
  bool checked = false;
  for (const RowAgg& row : rows) {
    if (row.reported == 0) continue;
    for (const PlaceAgg* p : {&row.oop, &row.ip})
      if (p->wrong >= 0) {
        sum += p->wrong;
        checked = true;
      }
  }
  return checked ? sum : -1;
}

double PathResult::avg_busbw() const {
  double sum = 0;
  int n = 0;
  for (const RowAgg& row : rows)
    if (row.reported > 0 && row.oop.time_us > 0) {
      sum += row.oop.busbw + row.ip.busbw;
      n += 2;
    }
  return n ? sum / n : 0;
}

uint64_t PathResult::off_route_calls(int route) const {
  uint64_t n = 0;
  for (const RowAgg& row : rows) {
    for (int i = 0; i < zerocta_route_count; ++i)
      if (i != route) n += row.first.routes[i];
    for (const PlaceAgg* p : {&row.oop, &row.ip})
      for (int i = 0; i < zerocta_route_count; ++i)
        if (i != route) n += p->routes[i];
  }
  return n;
}

std::string ContentionResult::status() const {
  bool any_ok = false, any_skipped = false;
  for (const ContentionRun& run : runs) {
    if (run.status == "FAILED") return "FAILED";
    any_ok |= run.status == "OK";
    any_skipped |= run.status == "SKIPPED";
  }
  // Runs cut by the deadline leave fewer samples (the runs column says how many), not a failure.
  if (any_ok) return "OK";
  return any_skipped ? "SKIPPED" : "NOT RUN";
}

std::string ContentionResult::first_error() const {
  for (const ContentionRun& run : runs)
    if (!run.error.empty()) return "repeat " + std::to_string(run.repeat + 1) + ": " + run.error;
  return "";
}

int ContentionResult::runs_ok() const {
  int n = 0;
  for (const ContentionRun& run : runs) n += run.status == "OK";
  return n;
}

std::vector<ContentionSample> ContentionResult::samples(bool in_place, int nranks) const {
  std::vector<ContentionSample> out;
  for (const ContentionRun& run : runs) {
    ContentionSample s;
    if (run.status == "OK" && contention_sample(run.msgs, in_place, nranks, &s)) out.push_back(s);
  }
  return out;
}

bool BenchReport::ok() const {
  for (const PathResult& r : sweep)
    if (r.status == "FAILED") return false;
  for (const ContentionResult& r : contention)
    if (r.status() == "FAILED") return false;
  return !interrupted;
}

std::string route_tag(const uint64_t* routes) {
  std::string tag;
  int kinds = 0;
  for (int i = 0; i < zerocta_route_count; ++i) kinds += routes[i] != 0;
  if (kinds == 0) return "-";
  for (int i = 0; i < zerocta_route_count; ++i) {
    if (!routes[i]) continue;
    if (!tag.empty()) tag += ",";
    tag += kRouteNames[i];
    if (kinds > 1) tag += ":" + std::to_string(routes[i]);
  }
  return tag;
}

void print_path_banner(FILE* f, const PathResult& r, const BenchReport& b) {
  fprintf(f, "#\n# Path %s: %s\n", path_name(r.path), path_description(r.path, b.o->op).c_str());
  if (b.o->rounds > 1) fprintf(f, "# round %d of %d\n", r.round + 1, b.o->rounds);
  fprintf(f,
          "# op %s  nranks %d  minBytes %llu  maxBytes %llu  step: %llu(factor)  warmup iters: %d  "
          "iters: %d (a timed event every %d)  validation: %d  timeout: %d s\n",
          op_name(b.o->op), b.nranks, static_cast<unsigned long long>(b.o->min_bytes),
          static_cast<unsigned long long>(b.o->max_bytes),
          static_cast<unsigned long long>(b.o->step_factor), b.o->warmups, b.o->iters,
          events_every(*b.o, b.o->iters), b.o->check ? 1 : 0, r.timeout_s);
  fprintf(f, "# dtype %s  redop %s", b.o->dtype.name, b.o->redop_label());
  if (b.o->op == CollOp::kReduceScatter) {
    if (r.path == PathId::kBareCe)
      fprintf(f,
              "  check: the pushed chunks compared bitwise with their hash pattern (no sum, "
              "no maxdiff)");
    else if (r.path == PathId::kSumKernel)
      fprintf(f,
              "  check: random finite inputs, #wrong = elements that differ bitwise from the "
              "kernel's adds redone in order on the device, maxdiff = largest |output - float64 "
              "%s|; %d CTAs",
              redop_reference_name(b.o->redop), b.o->rs_ctas);
    else
      fprintf(f,
              "  check: random finite inputs per rank and size, #wrong = elements that differ "
              "bitwise from NCCL's own kernel result on the same inputs, maxdiff = largest "
              "|output - float64 %s|",
              redop_reference_name(b.o->redop));
  }
  fprintf(f, "\n");
  const int procs = path_process_count(r.path, b.o->one_process, b.nranks);
  std::string buffers = path_alloc_label(r.path, b.o->alloc);
  if (buffers == "cumem") {
    buffers += " in " + format_size(b.o->cumem_chunk_bytes) + " allocations";
    const std::string props = cumem_props_name(b.o->cumem_props);
    if (props != "none") buffers += " (" + props + ")";
  }
  fprintf(f, "# buffers: %s  processes: %d (%s)\n", buffers.c_str(), procs,
          procs == 1 ? "one thread drives every GPU" : "one per rank");
  if (path_uses_shim(r.path)) fprintf(f, "# LD_PRELOAD=%s\n", b.shim_lib.c_str());
  fflush(f);
}

void print_rank_line(FILE* f, const HelloMsg& h, const BenchReport& b) {
  std::string extra;
  if (h.nccl_version > 0) extra += "  NCCL " + nccl_version_string(h.nccl_version);
  if (h.shim_loaded)  // MAJOR*10000 + MINOR*100 + PATCH
    extra += "  zerocta " + std::to_string(h.shim_version / 10000) + "." +
             std::to_string(h.shim_version / 100 % 100) + "." +
             std::to_string(h.shim_version % 100);
  fprintf(f, "#  Rank %2d Pid %6d on %s device %2d [%s] %s%s\n", h.rank, h.pid,
          b.machine.hostname.c_str(), h.device, h.bus_id, h.gpu_name, extra.c_str());
  fflush(f);
}

void print_table_header(FILE* f, bool with_routes, bool with_maxdiff) {
  fprintf(f,
          "#\n# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
          "in-place          \n",
          "", "", "", "", "");
  fprintf(f,
          "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %8s  %8s%s  %9s%s\n",
          "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
          "algbw", "busbw", "#wrong", "oop-med", "ip-med", with_maxdiff ? "    maxdiff" : "",
          "first-op", with_routes ? "  route" : "");
  fprintf(f,
          "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s  %8s  %8s%s  %9s\n",
          "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
          "(GB/s)", "", "(us)", "(us)", with_maxdiff ? "           " : "", "(ms)");
  fflush(f);
}

std::string format_row(const RowAgg& row, CollOp op, const char* type_name, bool with_routes,
                       const char* redop) {
  char buf[512];
  int n = snprintf(buf, sizeof(buf), "%12llu  %12llu  %8s  %6s  %6i",
                   static_cast<unsigned long long>(row.bytes),
                   static_cast<unsigned long long>(row.count), type_name,
                   !op_reduces(op) ? "none"
                   : *redop        ? redop
                                   : "sum",
                   op == CollOp::kBroadcast ? kBroadcastRoot : -1);
  for (const PlaceAgg* p : {&row.oop, &row.ip})
    n += snprintf(buf + n, sizeof(buf) - n, "  %7s  %6.2f  %6.2f  %5s",
                  time_str(p->time_us).c_str(), p->algbw, p->busbw, wrong_str(p->wrong).c_str());
  n += snprintf(buf + n, sizeof(buf) - n, "  %8.2f  %8.2f", row.oop.median_us, row.ip.median_us);
  if (op == CollOp::kReduceScatter) {
    const double d = row.maxdiff();
    if (d < 0)
      n += snprintf(buf + n, sizeof(buf) - n, "  %9s", "N/A");
    else
      n += snprintf(buf + n, sizeof(buf) - n, "  %9.2e", d);
  }
  n += snprintf(buf + n, sizeof(buf) - n, "  %9.3f", row.first.ms);
  std::string s(buf, static_cast<size_t>(n));
  if (with_routes) {
    std::string a = route_tag(row.oop.routes), c = route_tag(row.ip.routes);
    s += "  " + (a == c ? a : a + "|" + c);
    // The first op's route only where it differs from the out-of-place calls'.
    const std::string first = route_tag(row.first.routes);
    if (first != "-" && first != a) s += " first:" + first;
  }
  return s;
}

std::string init_summary(const PathResult& r) {
  if (r.init.empty()) return "";
  char buf[128];
  snprintf(buf, sizeof(buf), "init: max over ranks %.1f ms, first op %.1f ms", r.init_ms(),
           r.first_op_ms());
  return buf;
}

void print_path_footer(FILE* f, const PathResult& r, const BenchReport& b) {
  const int64_t wrong = r.wrong_total();
  fprintf(f, "# Out of bounds values : %lld %s\n", static_cast<long long>(wrong < 0 ? 0 : wrong),
          wrong > 0 ? "FAILED" : "OK");
  fprintf(f, "# Avg bus bandwidth    : %g \n", r.avg_busbw());
  if (!r.init.empty())
    fprintf(f, "# %s (%s; first %s of %llu B, enqueue to synchronized; %zu of %d ranks)\n",
            init_summary(r).c_str(),
            path_sets_zero_policy(r.path) ? "ncclCommInitRankConfig" : "ncclCommInitRank",
            op_nccl_call(b.o->op), static_cast<unsigned long long>(r.init.front().first_op_bytes),
            r.init.size(), b.nranks);
  if (path_uses_shim(r.path) && r.shim_reports > 0) {
    fprintf(f, "# zerocta %s routes (all ranks, whole run):", op_name(b.o->op));
    for (int i = 0; i < zerocta_route_count; ++i)
      fprintf(f, " %s %llu", kRouteNames[i], static_cast<unsigned long long>(r.shim_op_calls[i]));
    fprintf(f, "; communicators %llu, zero-CTA %llu, ce-ready %llu\n",
            static_cast<unsigned long long>(r.comms_created),
            static_cast<unsigned long long>(r.comms_zero_policy),
            static_cast<unsigned long long>(r.comms_ce_ready));
  }
  fprintf(f, "# Path %s: %s (%.1f s)%s%s\n", path_name(r.path), r.status.c_str(), r.seconds,
          r.error.empty() ? "" : ": ", r.error.c_str());
  fflush(f);
}

}  // namespace zcb
