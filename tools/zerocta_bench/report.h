// The parent's results: rows aggregated over ranks as they arrive (max over ranks of the mean
// time, like nccl-tests; #wrong summed), init times (max over ranks), the nccl-tests style
// tables, the comparison (busbw, time ratios against nccl-kernel, init), the contention runs
// and tables and the JSON document.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "contention_stats.h"
#include "gpu_telemetry.h"
#include "options.h"
#include "probe.h"
#include "protocol.h"

namespace zcb {

const char* route_name(int route);  // same spelling as zerocta_route_name()

struct PlaceAgg {
  double time_us = 0;    // max over ranks of the per-rank mean
  double median_us = 0;  // max over ranks of the per-rank median
  int64_t wrong = 0;     // summed over ranks; -1 = not checked
  double maxdiff = -1;   // reduce-scatter: max over ranks of PlaceResult::maxdiff; -1 = none
  uint64_t routes[zerocta_route_count] = {};
  double algbw = 0;  // GB/s = bytes / time
  double busbw = 0;  // algbw * bus_factor(op, n)
};

// The first op on a size's fresh buffers (FirstOpResult) over ranks.
struct FirstOpAgg {
  double ms = 0;          // max over ranks: call to synchronized
  double call_ms = 0;     // max over ranks: the call alone
  double windows_ms = 0;  // max over ranks: nccl-ce's window registration before it
  uint64_t routes[zerocta_route_count] = {};
};

struct RowAgg {
  uint64_t bytes = 0;
  uint64_t count = 0;
  int reported = 0;  // ranks heard from
  FirstOpAgg first;
  PlaceAgg oop, ip;
  // The larger maxdiff of the two placements (-1 when neither has one).
  double maxdiff() const { return std::max(oop.maxdiff, ip.maxdiff); }
};

struct RankInfo {
  HelloMsg hello{};
};

struct PathResult {
  PathId path = PathId::kNcclKernel;
  int round = 0;                   // --rounds: which run of the path set (0-based)
  std::string status = "NOT RUN";  // OK | FAILED | SKIPPED | NOT RUN
  std::string error;
  double seconds = 0;
  int timeout_s = 0;
  std::vector<RankInfo> ranks;
  std::vector<InitTimesMsg> init;  // one per rank that reported (NCCL paths)
  std::vector<RowAgg> rows;        // indexed like the sweep sizes
  bool header_printed = false;
  // Shim counters summed over ranks (ShimTotalsMsg), for the run's op.
  int shim_reports = 0;
  uint64_t shim_op_calls[zerocta_route_count] = {};
  uint64_t comms_created = 0, comms_zero_policy = 0, comms_ce_ready = 0;

  bool complete(size_t i, int nranks) const { return rows[i].reported == nranks; }
  // Max over the ranks that reported; NaN when none did.
  double init_ms() const;
  double first_op_ms() const;
  int64_t wrong_total() const;  // over complete rows, -1 when nothing was checked
  double avg_busbw() const;     // over complete rows and both placements, like nccl-tests
  // zerocta path: all-gathers of the rows (first ops, checks, warm-ups, timed loops) that did
  // not take the ce route (summed over ranks); off_route_calls: those that did not take `route`.
  uint64_t non_ce_calls() const { return off_route_calls(zerocta_route_ce); }
  uint64_t off_route_calls(int route) const;
};

// One launch of a contention path: one repeat, every placement.
struct ContentionRun {
  int repeat = 0;
  int position = 0;                // its place in that repeat's (rotated) order
  std::string status = "NOT RUN";  // OK | FAILED | SKIPPED | NOT RUN
  std::string error;
  double seconds = 0;
  std::vector<ContentionMsg> msgs;  // every rank, every placement
  GpuTelemetry before, after;       // nvidia-smi right before and right after the run
};

// One contention path over every repeat.
struct ContentionResult {
  PathId path = PathId::kNcclKernel;
  std::vector<ContentionRun> runs;  // in repeat order

  // FAILED when a run failed; OK when at least one run was OK (the others SKIPPED); else
  // SKIPPED or NOT RUN.
  std::string status() const;
  std::string first_error() const;
  int runs_ok() const;
  // The worst-rank sample of every OK run for one placement, in repeat order.
  std::vector<ContentionSample> samples(bool in_place, int nranks) const;
};

struct BenchReport {
  const Options* o = nullptr;
  MachineInfo machine;
  int nranks = 0;
  std::vector<uint64_t> sizes;
  std::vector<PathResult> sweep;
  std::vector<ContentionResult> contention;
  std::vector<std::string> argv;
  std::string shim_lib;
  std::string started_at;  // ISO 8601, local time
  bool interrupted = false;

  bool ok() const;  // no path FAILED
};

// nccl-tests' bandwidths: algbw = bytes / time (GB/s), busbw = algbw * bus_factor(op, n).
void coll_bw(CollOp op, uint64_t bytes, double time_us, int nranks, double* algbw, double* busbw);

// Folds one rank's row in; returns true when every rank has reported that size.
bool add_row(PathResult* r, const RowMsg& m, int nranks, CollOp op);
// Records one rank's init times; returns true when the last of nranks ranks reported.
bool add_init(PathResult* r, const InitTimesMsg& m, int nranks);

// a / b, NaN when b is not positive.
double safe_ratio(double a, double b);
// The sweep result of path p in round `round` if it ran (not NOT RUN or SKIPPED), else nullptr.
const PathResult* find_path(const BenchReport& b, PathId p, int round = 0);
// busbw of row i of r (max-time based), NaN when r is null or the row is incomplete.
double busbw_at(const PathResult* r, size_t i, bool in_place, int nranks);

// Time of row i of r over the same row of base (mean times, max over ranks; > 1 = r is
// slower); NaN when either row is missing.
double time_ratio(const PathResult* r, const PathResult* base, size_t i, bool in_place, int nranks);
// time_ratio over every row both paths completed, both placements.
struct RatioSummary {
  int rows = 0;
  double median = NAN, min = NAN, max = NAN;
};
RatioSummary time_ratio_summary(const PathResult& r, const PathResult& base, int nranks);

// "ce", "passthrough", "ce:25,passthrough:1", or "-" when nothing was counted.
std::string route_tag(const uint64_t* routes);

// Output, nccl-tests style.
void print_path_banner(FILE* f, const PathResult& r, const BenchReport& b);
void print_rank_line(FILE* f, const HelloMsg& h, const BenchReport& b);
// with_maxdiff (reduce-scatters): a "maxdiff" column after ip-med, the row's largest
// |output - float64 reference|; redop: the redop column ("" = sum for reductions, else none).
void print_table_header(FILE* f, bool with_routes, bool with_maxdiff = false);
std::string format_row(const RowAgg& row, CollOp op, const char* type_name, bool with_routes,
                       const char* redop = "");
// "init: max over ranks X ms, first op Y ms", or "" when no rank reported.
std::string init_summary(const PathResult& r);
void print_path_footer(FILE* f, const PathResult& r, const BenchReport& b);
void print_comparison(FILE* f, const BenchReport& b);  // report_compare.cc
// The contention tables, one per placement (report_contention.cc).
void print_contention(FILE* f, const BenchReport& b);
// One run's status line with the GPU readings around it (report_contention.cc).
void print_contention_run(FILE* f, const ContentionResult& r, const ContentionRun& run,
                          int repeats);
// What a path's buffers are: "cudamalloc", "cumem", "ncclMemAlloc+window" (nccl-ce),
// "cudaMalloc (peer)" for the single-process peer paths.
std::string path_alloc_label(PathId p, BufferAlloc alloc);

// --rounds (report_rounds.cc): one path's busbw at one row over the rounds, and its ratio to the
// baseline's busbw in the same round (paired, so that a host's drift between rounds cancels).
struct RoundsCell {
  Spread busbw;           // over the rounds in which the path completed the row
  Spread ratio;           // path / baseline, over the rounds in which both did
  int at_least_base = 0;  // rounds in which the ratio was >= 1
};
RoundsCell rounds_cell(const BenchReport& b, PathId path, PathId base, size_t i, bool in_place);
// The rounds table's baseline: nccl-ce where it ran, else nccl-kernel; false when neither did.
bool rounds_baseline(const BenchReport& b, PathId* base);
// The rounds table (nothing with one round).
void print_rounds(FILE* f, const BenchReport& b);

// The --json document.
std::string report_json(const BenchReport& b);

}  // namespace zcb
