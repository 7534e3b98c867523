// The contention study's output: a line per run (status and the GPUs' clocks, power and
// temperature around it), then one table per placement with every metric as the median over
// the repeats and, on the line below, its min..max.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "report.h"

namespace zcb {

namespace {

constexpr int kCell = 14;

// Enough digits to compare paths, few enough to keep the spread in one cell.
std::string number(double v, const char* unit) {
  char buf[32];
  if (!std::isfinite(v)) return "-";
  if (strcmp(unit, "%") == 0)
    snprintf(buf, sizeof(buf), "%.1f", v);
  else if (strcmp(unit, "x") == 0 || unit[0] == '\0')
    snprintf(buf, sizeof(buf), "%.2f", v);
  else if (std::fabs(v) < 10)
    snprintf(buf, sizeof(buf), "%.3f", v);
  else if (std::fabs(v) < 100)
    snprintf(buf, sizeof(buf), "%.2f", v);
  else if (std::fabs(v) < 1000)
    snprintf(buf, sizeof(buf), "%.1f", v);
  else
    snprintf(buf, sizeof(buf), "%.0f", v);
  return buf;
}

std::string pad(const std::string& s, int width) {
  return s.size() >= static_cast<size_t>(width) ? s : std::string(width - s.size(), ' ') + s;
}

// Line `line` (0 or 1) of a two-line header, or the unit on line 2.
std::string header_part(const ContentionMetric& m, int line) {
  const std::string h = m.header;
  const size_t nl = h.find('\n');
  if (line == 0) return h.substr(0, nl);
  if (line == 1) return nl == std::string::npos ? "" : h.substr(nl + 1);
  return m.unit[0] ? std::string("(") + m.unit + ")" : "";
}

void print_header(FILE* f) {
  for (int line = 0; line < 3; ++line) {
    std::string s = "#  " + std::string(14, ' ');
    if (line == 0) s = "#  path          ";
    for (const ContentionMetric& m : contention_metrics()) s += pad(header_part(m, line), kCell);
    s += line == 0 ? "     N  runs" : "";
    fprintf(f, "%s\n", s.c_str());
  }
}

void print_path_rows(FILE* f, const ContentionResult& r, bool in_place, int nranks, int repeats) {
  const std::vector<ContentionSample> samples = r.samples(in_place, nranks);
  std::string med = "   " + std::string(path_name(r.path));
  med.resize(17, ' ');
  std::string spread(17, ' ');
  for (const ContentionMetric& m : contention_metrics()) {
    std::vector<double> v;
    for (const ContentionSample& s : samples) v.push_back(s.*m.field);
    const Spread sp = spread_of(v);
    med += pad(number(sp.median, m.unit), kCell);
    spread += pad(sp.n ? number(sp.min, m.unit) + ".." + number(sp.max, m.unit) : "", kCell);
  }
  std::vector<double> ops;
  bool covered = true;
  for (const ContentionSample& s : samples) {
    ops.push_back(s.ag_ops);
    covered = covered && s.covered;
  }
  char tail[160];
  snprintf(tail, sizeof(tail), "  %4.0f  %d/%d %s", spread_of(ops).median, r.runs_ok(), repeats,
           r.status().c_str());
  med += tail;
  if (!samples.empty() && !covered) med += " (all-gathers ended before the GEMMs)";
  const std::string err = r.first_error();
  if (!err.empty()) med += " " + err;
  fprintf(f, "%s\n", med.c_str());
  if (!samples.empty()) fprintf(f, "%s\n", spread.c_str());
}

}  // namespace

void print_contention_run(FILE* f, const ContentionResult& r, const ContentionRun& run,
                          int repeats) {
  fprintf(f, "# Contention %s, run %d/%d (position %d): %s (%.1f s)%s%s\n", path_name(r.path),
          run.repeat + 1, repeats, run.position + 1, run.status.c_str(), run.seconds,
          run.error.empty() ? "" : ": ", run.error.c_str());
  fprintf(f, "#   GPUs before -> after: %s\n", format_telemetry(run.before, run.after).c_str());
  fflush(f);
}

void print_contention(FILE* f, const BenchReport& b) {
  if (b.contention.empty()) return;
  const Options& o = *b.o;
  const bool fixed = o.contention_mode == ContentionMode::kFixed;
  const bool rs = o.contention_op() == CollOp::kReduceScatter;
  const char* ops = rs ? "reduce-scatters" : "all-gathers";
  for (bool in_place : contention_placements(o.contention_placement)) {
    fprintf(f,
            "#\n# Contention, %s %s (%s mode): cuBLAS bf16 GEMM %dx%dx%d "
            "(CUBLAS_COMPUTE_32F) x%d on one stream, %s %s of %s (%s) on "
            "another, buffers --alloc %s.\n",
            in_place ? "in-place" : "out-of-place", ops, contention_mode_name(o.contention_mode),
            o.gemm_m, o.gemm_n, o.gemm_k, o.gemm_iters,
            fixed ? std::to_string(o.contention_ops).c_str() : "back-to-back", ops,
            format_size(o.contention_total_bytes(b.nranks)).c_str(),
            rs ? (std::string("total input, ") + o.dtype.name + " " + o.redop_label()).c_str()
               : "total output",
            alloc_name(o.alloc));
    fprintf(f,
            "# Worst rank per run; each path's median over its runs, min..max below. sum = M "
            "GEMMs + N %s alone, max = the larger of the two, gain share = (sum - "
            "makespan) / (sum - max): 1 = perfect overlap. bare-ce is the floor.%s\n",
            ops, rs ? " The ag columns are the reduce-scatters (bare-ce: their pushes alone)." : "");
    print_header(f);
    for (const ContentionResult& r : b.contention)
      print_path_rows(f, r, in_place, b.nranks, o.repeats);
  }
  fflush(f);
}

}  // namespace zcb
