// The comparison printed after the sweep: busbw of every path, each path's time against
// nccl-kernel per size and placement (and zerocta's busbw ratios for all-gathers), the first
// op on each size's fresh buffers, % of the copy-engine ceiling, a summary of the time ratios
// ("the policy changes this op by N %") and the start-up table (init and first op against
// nccl-kernel).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "report.h"

namespace zcb {

namespace {

std::string cell(double v, const char* fmt, int width) {
  char buf[64];
  if (!std::isfinite(v))
    snprintf(buf, sizeof(buf), "%*s", width, "-");
  else
    snprintf(buf, sizeof(buf), fmt, width, v);
  return buf;
}

// "+1.6" / "-0.4": a difference in a column of its own width, "-" when unknown.
std::string signed_cell(double v, int width) { return cell(v, "%+*.1f", width); }

// One column of a comparison table: a header and a value per (size index, in-place).
struct Column {
  std::string header;
  const char* fmt;  // printf format with a * width, e.g. "%*.2f"
  std::function<double(size_t, bool)> value;
};

// A comparison table: one row per size and placement (out-of-place rows first; only those with
// oop_only), one column per entry; rows no path completed are left out.
void print_table(FILE* f, const BenchReport& b, const std::vector<const PathResult*>& paths,
                 const std::string& title, const std::vector<Column>& cols, bool oop_only = false) {
  fprintf(f, "#\n# %s\n", title.c_str());
  std::string h = "#  place          size";
  std::vector<int> widths;
  for (const Column& c : cols) {
    widths.push_back(std::max<int>(9, static_cast<int>(c.header.size())));
    h += "  " + std::string(widths.back() - c.header.size(), ' ') + c.header;
  }
  fprintf(f, "%s\n", h.c_str());
  for (int ip = 0; ip < (oop_only ? 1 : 2); ++ip)
    for (size_t i = 0; i < b.sizes.size(); ++i) {
      const PathResult* any = nullptr;
      for (const PathResult* p : paths)
        if (p->complete(i, b.nranks)) any = p;
      if (!any) continue;
      char buf[64];
      snprintf(buf, sizeof(buf), "  %5s  %12llu", ip ? "ip" : "oop",
               static_cast<unsigned long long>(any->rows[i].bytes));
      std::string line = buf;
      for (size_t c = 0; c < cols.size(); ++c)
        line += "  " + cell(cols[c].value(i, ip != 0), cols[c].fmt, widths[c]);
      fprintf(f, "%s\n", line.c_str());
    }
}

// busbw of every path; time ratios against nccl-kernel (with zerocta's busbw ratios for
// all-gathers); the first op per size; the % of the copy-engine ceiling when it ran.
void print_comparison_tables(FILE* f, const BenchReport& b,
                             const std::vector<const PathResult*>& paths) {
  const int n = b.nranks;
  const PathResult* kern = find_path(b, PathId::kNcclKernel);
  const PathResult* ce = find_path(b, PathId::kNcclCe);
  const PathResult* zc = find_path(b, PathId::kZerocta);
  // The floor the paths are read against: the ceiling's pushes (all-gathers), bare-ce's
  // (reduce-scatters: the bytes moved, no reduction).
  const bool rs = b.o->op == CollOp::kReduceScatter;
  const PathResult* ceil = find_path(b, rs ? PathId::kBareCe : PathId::kCeiling);
  const std::string op = op_name(b.o->op);

  std::vector<Column> bw;
  for (const PathResult* p : paths)
    bw.push_back(
        {path_name(p->path), "%*.2f", [=](size_t i, bool ip) { return busbw_at(p, i, ip, n); }});
  print_table(f, b, paths, "Comparison, " + op + ": busbw (GB/s) per path", bw);

  std::vector<Column> ratios;
  if (kern)
    for (const PathResult* p : paths)
      if (p != kern)
        ratios.push_back({path_name(p->path), "%*.3f",
                          [=](size_t i, bool ip) { return time_ratio(p, kern, i, ip, n); }});
  if (zc && b.o->op == CollOp::kAllGather) {
    ratios.push_back({"zc/kernel busbw", "%*.2fx", [=](size_t i, bool ip) {
                        return safe_ratio(busbw_at(zc, i, ip, n), busbw_at(kern, i, ip, n));
                      }});
    ratios.push_back({"zc/nccl-ce busbw", "%*.2fx", [=](size_t i, bool ip) {
                        return safe_ratio(busbw_at(zc, i, ip, n), busbw_at(ce, i, ip, n));
                      }});
  }
  if (!ratios.empty())
    print_table(f, b, paths,
                "Time of each path / time of nccl-kernel, " + op +
                    " (> 1: slower than nccl-kernel; mean times, max over ranks)",
                ratios);

  std::vector<Column> first;
  for (const PathResult* p : paths)
    first.push_back({path_name(p->path), "%*.3f", [=](size_t i, bool) {
                       return p->complete(i, n) ? p->rows[i].first.ms : NAN;
                     }});
  // What nccl-ce needs before its first op and the other paths do not: zerocta maps the peers'
  // buffers inside its first op, NCCL CE at the windows' registration.
  if (ce)
    first.push_back({"ce windows", "%*.3f", [=](size_t i, bool) {
                       return ce->complete(i, n) ? ce->rows[i].first.windows_ms : NAN;
                     }});
  print_table(f, b, paths,
              "First op on each size's fresh buffers (ms, call to synchronized, max over ranks; "
              "out of place, before the warm-ups; 'ce windows': nccl-ce's "
              "ncclCommWindowRegister of those buffers before its first op)",
              first, true);

  if (ceil) {
    std::vector<Column> pct;
    for (const PathResult* p : paths)
      if (p != ceil)
        pct.push_back({path_name(p->path), "%*.1f", [=](size_t i, bool ip) {
                         return 100.0 * safe_ratio(busbw_at(p, i, ip, n), busbw_at(ceil, i, ip, n));
                       }});
    print_table(f, b, paths,
                rs ? "busbw in % of bare-ce (the reduce-scatter's pushes alone, no reduction)"
                   : "busbw in % of the copy-engine ceiling",
                pct);
  }
}

// "policy changes the op by N %": the time ratios of each path summarised over every row.
void print_ratio_summary(FILE* f, const BenchReport& b,
                         const std::vector<const PathResult*>& cols) {
  const PathResult* kern = find_path(b, PathId::kNcclKernel);
  if (!kern || cols.size() < 2) return;
  fprintf(f,
          "#\n# Time against nccl-kernel (%s), every size and placement: median change "
          "(min .. max)\n",
          op_name(b.o->op));
  for (const PathResult* c : cols) {
    if (c == kern) continue;
    const RatioSummary s = time_ratio_summary(*c, *kern, b.nranks);
    if (s.rows == 0) {
      fprintf(f, "#   %-14s -\n", path_name(c->path));
      continue;
    }
    fprintf(f, "#   %-14s %+6.1f %% (%+.1f .. %+.1f %%) over %d rows\n", path_name(c->path),
            100.0 * (s.median - 1), 100.0 * (s.min - 1), 100.0 * (s.max - 1), s.rows);
  }
}

// Communicator creation and first collective, max over ranks, and their difference from
// nccl-kernel: the policy's (and the shim's) start-up cost.
void print_init_comparison(FILE* f, const BenchReport& b,
                           const std::vector<const PathResult*>& cols) {
  const PathResult* kern = find_path(b, PathId::kNcclKernel);
  bool any = false;
  for (const PathResult* c : cols) any |= !c->init.empty();
  if (!any) return;
  fprintf(f,
          "#\n# Communicator start, max over ranks (ms): init = ncclCommInitRank[Config], "
          "first op = the first %s (enqueue to synchronized)\n",
          op_nccl_call(b.o->op));
  fprintf(f, "#   %-14s %9s %10s %9s %10s\n", "path", "init", "vs kernel", "first op", "vs kernel");
  const double ki = kern ? kern->init_ms() : NAN, kf = kern ? kern->first_op_ms() : NAN;
  for (const PathResult* c : cols) {
    if (c->init.empty()) continue;
    const bool base = c == kern;
    fprintf(f, "#   %-14s %9.1f %10s %9.1f %10s\n", path_name(c->path), c->init_ms(),
            base ? "-" : signed_cell(c->init_ms() - ki, 10).c_str(), c->first_op_ms(),
            base ? "-" : signed_cell(c->first_op_ms() - kf, 10).c_str());
  }
}

}  // namespace

void print_comparison(FILE* f, const BenchReport& b) {
  std::vector<const PathResult*> cols;  // the first round's (print_rounds has every round)
  for (const PathResult& r : b.sweep)
    if (find_path(b, r.path) == &r) cols.push_back(&r);
  if (cols.empty()) return;
  if (b.o->rounds > 1) fprintf(f, "#\n# The tables below: round 1 of %d\n", b.o->rounds);
  print_comparison_tables(f, b, cols);
  print_ratio_summary(f, b, cols);
  print_init_comparison(f, b, cols);
  fflush(f);
}

}  // namespace zcb
