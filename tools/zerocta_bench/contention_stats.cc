#include "contention_stats.h"

#include <algorithm>

namespace zcb {

bool contention_sample(const std::vector<ContentionMsg>& msgs, bool in_place, int nranks,
                       ContentionSample* out) {
  std::vector<bool> seen(static_cast<size_t>(nranks), false);
  ContentionSample s;
  s.covered = true;
  double ga = 0, go = 0, aa = 0, ao = 0, mk = 0;
  for (const ContentionMsg& m : msgs) {
    if ((m.in_place != 0) != in_place) continue;
    if (m.rank < 0 || m.rank >= nranks || seen[m.rank]) return false;
    seen[m.rank] = true;
    s.gemm_iters = std::max(s.gemm_iters, m.gemm_iters);
    s.ag_ops = std::max(s.ag_ops, m.ag_ops);
    s.covered = s.covered && m.covered != 0;
    ga = std::max(ga, m.gemm_alone_ms);
    go = std::max(go, m.gemm_overlap_ms);
    aa = std::max(aa, m.ag_alone_ms);
    ao = std::max(ao, m.ag_overlap_ms);
    mk = std::max(mk, m.makespan_ms);
  }
  if (std::count(seen.begin(), seen.end(), true) != nranks) return false;
  s.gemm_alone_ms = ga;
  s.gemm_overlap_ms = go;
  s.gemm_slowdown_pct = ga > 0 ? (go / ga - 1.0) * 100.0 : NAN;
  s.ag_alone_ms = aa;
  s.ag_overlap_ms = ao;
  s.ag_overlap_vs_alone = aa > 0 ? ao / aa : NAN;
  s.makespan_ms = mk;
  const double gemms = s.gemm_iters * ga, ags = s.ag_ops * aa;
  s.sum_alone_ms = gemms + ags;
  s.max_alone_ms = std::max(gemms, ags);
  const double possible = s.sum_alone_ms - s.max_alone_ms;
  s.gain_share = possible > 0 ? (s.sum_alone_ms - mk) / possible : NAN;
  *out = s;
  return true;
}

Spread spread_of(const std::vector<double>& values) {
  std::vector<double> v;
  for (double x : values)
    if (std::isfinite(x)) v.push_back(x);
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = static_cast<int>(v.size());
  s.min = v.front();
  s.max = v.back();
  const size_t mid = v.size() / 2;
  s.median = v.size() % 2 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
  return s;
}

const std::vector<ContentionMetric>& contention_metrics() {
  static const std::vector<ContentionMetric> m = {
      {"gemm_alone_ms", "gemm\nalone", "ms", &ContentionSample::gemm_alone_ms},
      {"gemm_overlap_ms", "gemm\noverlap", "ms", &ContentionSample::gemm_overlap_ms},
      {"gemm_slowdown_pct", "gemm\nslowdown", "%", &ContentionSample::gemm_slowdown_pct},
      {"ag_alone_ms", "ag\nalone", "ms", &ContentionSample::ag_alone_ms},
      {"ag_overlap_ms", "ag\noverlap", "ms", &ContentionSample::ag_overlap_ms},
      {"ag_overlap_vs_alone", "ag ovl\n/alone", "x", &ContentionSample::ag_overlap_vs_alone},
      {"makespan_ms", "makespan\n", "ms", &ContentionSample::makespan_ms},
      {"sum_alone_ms", "sum\nalone", "ms", &ContentionSample::sum_alone_ms},
      {"max_alone_ms", "max\nalone", "ms", &ContentionSample::max_alone_ms},
      {"gain_share", "gain\nshare", "", &ContentionSample::gain_share},
  };
  return m;
}

}  // namespace zcb
