// The contention study's numbers, from the ranks' messages to the table: the worst rank of
// one run and placement (a sample), and the median and spread of each metric over the
// repeats. Pure (no CUDA), so the self-test checks every formula.
#pragma once

#include <cmath>
#include <vector>

#include "protocol.h"

namespace zcb {

// One run and placement, worst rank: every time is the max over ranks, the derived numbers
// come from those maxima.
struct ContentionSample {
  int gemm_iters = 0;            // M
  int ag_ops = 0;                // N
  bool covered = false;          // every rank's all-gathers spanned its GEMM window
  double gemm_alone_ms = NAN;    // per GEMM
  double gemm_overlap_ms = NAN;  // per GEMM, overlapped
  double gemm_slowdown_pct = NAN;
  double ag_alone_ms = NAN;          // per all-gather
  double ag_overlap_ms = NAN;        // per all-gather, overlapped
  double ag_overlap_vs_alone = NAN;  // > 1: the all-gathers slowed down
  double makespan_ms = NAN;          // the overlapped run
  double sum_alone_ms = NAN;         // M * gemm alone + N * all-gather alone: no overlap
  double max_alone_ms = NAN;         // the larger of the two: perfect overlap
  double gain_share = NAN;           // (sum - makespan) / (sum - max): 1 = perfect overlap
};

// The sample of one placement from one run's messages; false unless each of nranks ranks
// sent exactly one message for it.
bool contention_sample(const std::vector<ContentionMsg>& msgs, bool in_place, int nranks,
                       ContentionSample* out);

// Median, min and max of the finite values; n = how many there were (0: all NaN).
struct Spread {
  int n = 0;
  double median = NAN, min = NAN, max = NAN;
};
Spread spread_of(const std::vector<double>& values);

// The metrics of the table and the JSON, in column order: one row each, so that both list the
// same numbers under the same names.
struct ContentionMetric {
  const char* key;     // JSON name
  const char* header;  // table column, two lines
  const char* unit;
  double ContentionSample::*field;
};
const std::vector<ContentionMetric>& contention_metrics();

}  // namespace zcb
