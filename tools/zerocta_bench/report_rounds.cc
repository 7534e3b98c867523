// The --rounds table: every path's busbw per size and placement over the rounds, and its ratio
// to the baseline's in the same round. One run of two paths that move the same bytes on the
// same engines differs by more than they do (the route in place at 64 MiB on 4 GPUs: 322.9 to
// 331.4 GB/s over three rounds of one run, docs/plots/ceiling-in-step-4xH200/in-step-4.log), so
// "at least the baseline" is a count of rounds, next to the median and spread of the ratio.
#include <algorithm>
#include <cmath>
#include <string>

#include "report.h"

namespace zcb {

RoundsCell rounds_cell(const BenchReport& b, PathId path, PathId base, size_t i, bool in_place) {
  std::vector<double> bw, ratio;
  int at_least = 0;
  for (int round = 0; round < b.o->rounds; ++round) {
    const double v = busbw_at(find_path(b, path, round), i, in_place, b.nranks);
    const double v0 = busbw_at(find_path(b, base, round), i, in_place, b.nranks);
    bw.push_back(v);
    const double q = safe_ratio(v, v0);
    if (!std::isfinite(q)) continue;
    ratio.push_back(q);
    at_least += q >= 1.0;
  }
  return {spread_of(bw), spread_of(ratio), at_least};
}

namespace {

bool ran_in_a_round(const BenchReport& b, PathId p) {
  for (int round = 0; round < b.o->rounds; ++round)
    if (find_path(b, p, round)) return true;
  return false;
}

std::string spread_text(const Spread& s, const char* fmt) {
  if (s.n == 0) return "-";
  char med[32], lo[32], hi[32], out[112];
  snprintf(med, sizeof med, fmt, s.median);
  snprintf(lo, sizeof lo, fmt, s.min);
  snprintf(hi, sizeof hi, fmt, s.max);
  snprintf(out, sizeof out, "%s (%s..%s)", med, lo, hi);
  return out;
}

}  // namespace

bool rounds_baseline(const BenchReport& b, PathId* base) {
  for (PathId p : {PathId::kNcclCe, PathId::kNcclKernel})
    if (ran_in_a_round(b, p)) {
      *base = p;
      return true;
    }
  return false;
}

void print_rounds(FILE* f, const BenchReport& b) {
  PathId base;
  if (b.o->rounds < 2 || !rounds_baseline(b, &base)) return;
  std::vector<PathId> others;
  for (PathId p : b.o->paths)
    if (p != base && ran_in_a_round(b, p)) others.push_back(p);
  fprintf(f,
          "#\n# Rounds: %d runs of the path set, the order rotated each round. busbw (GB/s), "
          "median (min..max) over the rounds;\n# x/%s: busbw / %s's in the same round, median "
          "(min..max), and in how many rounds it was >= 1\n",
          b.o->rounds, path_name(base), path_name(base));
  std::string h = "#  place          size  " + std::string(path_name(base));
  for (PathId p : others)
    h += "  |  " + std::string(path_name(p)) + "  x/" + path_name(base) + "  >=";
  fprintf(f, "%s\n", h.c_str());
  for (int ip = 0; ip < 2; ++ip)
    for (size_t i = 0; i < b.sizes.size(); ++i) {
      const RoundsCell c0 = rounds_cell(b, base, base, i, ip != 0);
      if (c0.busbw.n == 0) continue;
      std::string line = std::string("  ") + (ip ? "   ip" : "  oop") + "  ";
      char size[24];
      snprintf(size, sizeof size, "%12llu", static_cast<unsigned long long>(b.sizes[i]));
      line += size + std::string("  ") + spread_text(c0.busbw, "%.2f");
      for (PathId p : others) {
        const RoundsCell c = rounds_cell(b, p, base, i, ip != 0);
        line += "  |  " + spread_text(c.busbw, "%.2f") + "  " + spread_text(c.ratio, "%.3f") +
                "  " + std::to_string(c.at_least_base) + "/" + std::to_string(c.ratio.n);
      }
      fprintf(f, "%s\n", line.c_str());
    }
  fflush(f);
}

}  // namespace zcb
