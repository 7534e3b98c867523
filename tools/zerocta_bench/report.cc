#include "report.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace zcb {

namespace {

const char* const kRouteNames[zerocta_route_count] = {"passthrough", "ce", "nccl_ce",
                                                      "nccl_staged"};

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

std::string path_description(PathId p) {
  switch (p) {
    case PathId::kNcclKernel:
      return "cudaMalloc buffers, default communicator, ncclAllGather (no shim)";
    case PathId::kNcclCe:
      return "CTAPolicy=ZERO, ncclMemAlloc + symmetric windows: NCCL's copy-engine all-gather "
             "(no shim)";
    case PathId::kZerocta:
      return "nccl-kernel's program under LD_PRELOAD=libzerocta.so, ZEROCTA_ALLGATHER=zerocta";
    case PathId::kZeroctaAuto:
      return "nccl-kernel's program under LD_PRELOAD=libzerocta.so, ZEROCTA_ALLGATHER=auto";
    case PathId::kCeiling:
      return "bare cudaMemcpyAsync peer pulls, one process, no protocol (per-GPU time, max)";
    case PathId::kBareCe:
      return "the ceiling's raw peer pulls, back to back";
  }
  return "";
}

double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

std::string cell(double v, const char* fmt, int width) {
  char buf[64];
  if (!std::isfinite(v))
    snprintf(buf, sizeof(buf), "%*s", width, "-");
  else
    snprintf(buf, sizeof(buf), fmt, width, v);
  return buf;
}

const PathResult* find_path(const BenchReport& b, PathId p) {
  for (const PathResult& r : b.sweep)
    if (r.path == p && r.status != "NOT RUN" && r.status != "SKIPPED") return &r;
  return nullptr;
}

double busbw_at(const PathResult* r, size_t i, bool in_place, int nranks) {
  if (!r || i >= r->rows.size() || !r->complete(i, nranks)) return NAN;
  return in_place ? r->rows[i].ip.busbw : r->rows[i].oop.busbw;
}

template <typename F>
double max_over(const std::vector<ContentionMsg>& v, F f) {
  double m = 0;
  for (const ContentionMsg& c : v) m = std::max(m, f(c));
  return m;
}

}  // namespace

const char* route_name(int route) {
  return route >= 0 && route < zerocta_route_count ? kRouteNames[route] : "?";
}

void all_gather_bw(uint64_t bytes, double time_us, int nranks, double* algbw, double* busbw) {
  *algbw = time_us > 0 ? static_cast<double>(bytes) / (time_us * 1e3) : 0;
  *busbw = nranks > 0 ? *algbw * (nranks - 1) / nranks : 0;
}

bool add_row(PathResult* r, const RowMsg& m, int nranks) {
  if (m.size_index < 0 || static_cast<size_t>(m.size_index) >= r->rows.size()) return false;
  RowAgg& a = r->rows[m.size_index];
  const bool first = a.reported == 0;
  a.bytes = m.bytes;
  a.count = m.count;
  fold(&a.oop, m.oop, first);
  fold(&a.ip, m.ip, first);
  if (++a.reported != nranks) return false;
  all_gather_bw(a.bytes, a.oop.time_us, nranks, &a.oop.algbw, &a.oop.busbw);
  all_gather_bw(a.bytes, a.ip.time_us, nranks, &a.ip.algbw, &a.ip.busbw);
  return true;
}

void add_contention(ContentionResult* r, const ContentionMsg& m) { r->ranks.push_back(m); }

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

uint64_t PathResult::non_ce_calls() const {
  uint64_t n = 0;
  for (const RowAgg& row : rows)
    for (const PlaceAgg* p : {&row.oop, &row.ip})
      for (int i = 0; i < zerocta_route_count; ++i)
        if (i != zerocta_route_ce) n += p->routes[i];
  return n;
}

double ContentionResult::gemm_alone_ms() const {
  return max_over(ranks, [](const ContentionMsg& c) { return c.gemm_alone_ms; });
}
double ContentionResult::gemm_overlap_ms() const {
  return max_over(ranks, [](const ContentionMsg& c) { return c.gemm_overlap_ms; });
}
double ContentionResult::ag_alone_ms() const {
  return max_over(ranks, [](const ContentionMsg& c) { return c.ag_alone_ms; });
}
double ContentionResult::ag_overlap_ms() const {
  return max_over(ranks, [](const ContentionMsg& c) { return c.ag_overlap_ms; });
}
double ContentionResult::makespan_ms() const {
  return max_over(ranks, [](const ContentionMsg& c) { return c.makespan_ms; });
}
double ContentionResult::sequential_ms() const {
  return max_over(ranks, [](const ContentionMsg& c) { return c.sequential_ms; });
}
double ContentionResult::slowdown_pct() const {
  double a = gemm_alone_ms();
  return a > 0 ? (gemm_overlap_ms() / a - 1.0) * 100.0 : NAN;
}
bool ContentionResult::covered() const {
  for (const ContentionMsg& c : ranks)
    if (!c.covered) return false;
  return !ranks.empty();
}

bool BenchReport::ok() const {
  for (const PathResult& r : sweep)
    if (r.status == "FAILED") return false;
  for (const ContentionResult& r : contention)
    if (r.status == "FAILED") return false;
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
  fprintf(f, "#\n# Path %s: %s\n", path_name(r.path), path_description(r.path).c_str());
  fprintf(f,
          "# nranks %d  minBytes %llu  maxBytes %llu  step: %llu(factor)  warmup iters: %d  "
          "iters: %d  validation: %d  timeout: %d s\n",
          b.nranks, static_cast<unsigned long long>(b.o->min_bytes),
          static_cast<unsigned long long>(b.o->max_bytes),
          static_cast<unsigned long long>(b.o->step_factor), b.o->warmups, b.o->iters,
          b.o->check ? 1 : 0, r.timeout_s);
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

void print_table_header(FILE* f, bool with_routes) {
  fprintf(f,
          "#\n# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
          "in-place          \n",
          "", "", "", "", "");
  fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %8s  %8s%s\n",
          "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
          "algbw", "busbw", "#wrong", "oop-med", "ip-med", with_routes ? "  route" : "");
  fprintf(f, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s  %8s  %8s\n",
          "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
          "(GB/s)", "", "(us)", "(us)");
  fflush(f);
}

std::string format_row(const RowAgg& row, const char* type_name, bool with_routes) {
  char buf[512];
  int n = snprintf(buf, sizeof(buf), "%12llu  %12llu  %8s  %6s  %6i",
                   static_cast<unsigned long long>(row.bytes),
                   static_cast<unsigned long long>(row.count), type_name, "none", -1);
  for (const PlaceAgg* p : {&row.oop, &row.ip})
    n += snprintf(buf + n, sizeof(buf) - n, "  %7s  %6.2f  %6.2f  %5s",
                  time_str(p->time_us).c_str(), p->algbw, p->busbw, wrong_str(p->wrong).c_str());
  n += snprintf(buf + n, sizeof(buf) - n, "  %8.2f  %8.2f", row.oop.median_us, row.ip.median_us);
  std::string s(buf, static_cast<size_t>(n));
  if (with_routes) {
    std::string a = route_tag(row.oop.routes), c = route_tag(row.ip.routes);
    s += "  " + (a == c ? a : a + "|" + c);
  }
  return s;
}

void print_path_footer(FILE* f, const PathResult& r, const BenchReport& b) {
  const int64_t wrong = r.wrong_total();
  fprintf(f, "# Out of bounds values : %lld %s\n", static_cast<long long>(wrong < 0 ? 0 : wrong),
          wrong > 0 ? "FAILED" : "OK");
  fprintf(f, "# Avg bus bandwidth    : %g \n", r.avg_busbw());
  if (path_uses_shim(r.path) && r.shim_reports > 0) {
    fprintf(f, "# zerocta all-gather routes (all ranks, whole run):");
    for (int i = 0; i < zerocta_route_count; ++i)
      fprintf(f, " %s %llu", kRouteNames[i], static_cast<unsigned long long>(r.shim_allgather[i]));
    fprintf(f, "; communicators %llu, zero-CTA %llu, ce-ready %llu\n",
            static_cast<unsigned long long>(r.comms_created),
            static_cast<unsigned long long>(r.comms_zero_policy),
            static_cast<unsigned long long>(r.comms_ce_ready));
  }
  fprintf(f, "# Path %s: %s (%.1f s)%s%s\n", path_name(r.path), r.status.c_str(), r.seconds,
          r.error.empty() ? "" : ": ", r.error.c_str());
  (void)b;
  fflush(f);
}

void print_comparison(FILE* f, const BenchReport& b) {
  std::vector<const PathResult*> cols;
  for (const PathResult& r : b.sweep)
    if (find_path(b, r.path)) cols.push_back(&r);
  if (cols.empty()) return;
  const PathResult* kern = find_path(b, PathId::kNcclKernel);
  const PathResult* ce = find_path(b, PathId::kNcclCe);
  const PathResult* zc = find_path(b, PathId::kZerocta);
  const PathResult* ceil = find_path(b, PathId::kCeiling);
  for (int ip = 0; ip < 2; ++ip) {
    fprintf(f,
            "#\n# Comparison, %s: busbw (GB/s) per path, ratios, %% of the copy-engine "
            "ceiling\n",
            ip ? "in-place" : "out-of-place");
    std::string h = "#           size";
    char buf[64];
    for (const PathResult* c : cols) {
      snprintf(buf, sizeof(buf), "  %12s", path_name(c->path));
      h += buf;
    }
    h += "   zc/kernel  zc/nccl-ce";
    if (ceil)
      for (const PathResult* c : cols)
        if (c != ceil) {
          snprintf(buf, sizeof(buf), "  %%ceil:%s", path_name(c->path));
          h += buf;
        }
    fprintf(f, "%s\n", h.c_str());
    for (size_t i = 0; i < b.sizes.size(); ++i) {
      bool any = false;
      for (const PathResult* c : cols) any |= c->complete(i, b.nranks);
      if (!any) continue;
      uint64_t bytes = 0;
      for (const PathResult* c : cols)
        if (c->complete(i, b.nranks)) bytes = c->rows[i].bytes;
      std::string line;
      snprintf(buf, sizeof(buf), "  %12llu", static_cast<unsigned long long>(bytes));
      line += buf;
      for (const PathResult* c : cols)
        line += "  " + cell(busbw_at(c, i, ip, b.nranks), "%*.2f", 12);
      const double z = busbw_at(zc, i, ip, b.nranks);
      line += "  " + cell(ratio(z, busbw_at(kern, i, ip, b.nranks)), "%*.2fx", 9);
      line += "  " + cell(ratio(z, busbw_at(ce, i, ip, b.nranks)), "%*.2fx", 9);
      if (ceil) {
        const double top = busbw_at(ceil, i, ip, b.nranks);
        for (const PathResult* c : cols)
          if (c != ceil) {
            int width = 6 + static_cast<int>(strlen(path_name(c->path)));
            line += "  " + cell(100.0 * ratio(busbw_at(c, i, ip, b.nranks), top), "%*.1f", width);
          }
      }
      fprintf(f, "%s\n", line.c_str());
    }
  }
  fflush(f);
}

void print_contention(FILE* f, const BenchReport& b) {
  if (b.contention.empty()) return;
  const Options& o = *b.o;
  const double flop = 2.0 * o.gemm_m * o.gemm_n * static_cast<double>(o.gemm_k);
  fprintf(f,
          "#\n# Contention: cuBLAS bf16 GEMM %dx%dx%d (CUBLAS_COMPUTE_32F) x%d on one stream, "
          "back-to-back all-gathers of %s (total output) on another. Worst rank.\n",
          o.gemm_m, o.gemm_n, o.gemm_k, o.gemm_iters,
          format_size(o.contention_total_bytes(b.nranks)).c_str());
  fprintf(f, "# %-13s %9s %9s %9s %9s %8s  %9s %9s %7s  %8s %8s %7s  %s\n", "path", "gemm", "gemm",
          "gemm-ovl", "gemm-ovl", "slowdown", "ag", "ag-ovl", "ag-ops", "makespan", "sequent.",
          "saved", "status");
  fprintf(f, "# %-13s %9s %9s %9s %9s %8s  %9s %9s %7s  %8s %8s %7s\n", "", "(ms)", "(TFLOP/s)",
          "(ms)", "(TFLOP/s)", "(%)", "(ms)", "(ms)", "(in win)", "(ms)", "(ms)", "(%)");
  for (const ContentionResult& r : b.contention) {
    if (r.ranks.empty()) {
      fprintf(f, "  %-13s %s%s%s\n", path_name(r.path), r.status.c_str(),
              r.error.empty() ? "" : ": ", r.error.c_str());
      continue;
    }
    const double ga = r.gemm_alone_ms(), go = r.gemm_overlap_ms();
    int ops = 0, in_win = r.ranks.front().ag_in_window;
    for (const ContentionMsg& c : r.ranks) {
      ops = std::max(ops, c.ag_ops);
      in_win = std::min(in_win, c.ag_in_window);
    }
    char opsbuf[32];
    snprintf(opsbuf, sizeof(opsbuf), "%d(%d)", ops, in_win);
    const double saved = 100.0 * (1.0 - ratio(r.makespan_ms(), r.sequential_ms()));
    fprintf(f,
            "  %-13s %9.3f %9.1f %9.3f %9.1f %8.1f  %9.3f %9.3f %7s  %8.2f %8.2f %7.1f  %s%s%s\n",
            path_name(r.path), ga, flop / (ga * 1e9), go, flop / (go * 1e9), r.slowdown_pct(),
            r.ag_alone_ms(), r.ag_overlap_ms(), opsbuf, r.makespan_ms(), r.sequential_ms(), saved,
            r.status.c_str(), r.covered() ? "" : " (all-gathers ended before the GEMMs)",
            r.error.empty() ? "" : (" " + r.error).c_str());
  }
  fflush(f);
}

}  // namespace zcb
