// The parent's results: rows aggregated over ranks as they arrive (max over ranks of the mean
// time, like nccl-tests; #wrong summed), the nccl-tests style tables, the comparison table,
// the contention table and the JSON document.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "options.h"
#include "probe.h"
#include "protocol.h"

namespace zcb {

const char* route_name(int route);  // same spelling as zerocta_route_name()

struct PlaceAgg {
  double time_us = 0;    // max over ranks of the per-rank mean
  double median_us = 0;  // max over ranks of the per-rank median
  int64_t wrong = 0;     // summed over ranks; -1 = not checked
  uint64_t routes[zerocta_route_count] = {};
  double algbw = 0;  // GB/s = bytes / time
  double busbw = 0;  // algbw * (n-1)/n
};

struct RowAgg {
  uint64_t bytes = 0;
  uint64_t count = 0;
  int reported = 0;  // ranks heard from
  PlaceAgg oop, ip;
};

struct RankInfo {
  HelloMsg hello{};
};

struct PathResult {
  PathId path = PathId::kNcclKernel;
  std::string status = "NOT RUN";  // OK | FAILED | SKIPPED | NOT RUN
  std::string error;
  double seconds = 0;
  int timeout_s = 0;
  std::vector<RankInfo> ranks;
  std::vector<RowAgg> rows;  // indexed like the sweep sizes
  bool header_printed = false;
  // Shim counters summed over ranks (ShimTotalsMsg).
  int shim_reports = 0;
  uint64_t shim_allgather[zerocta_route_count] = {};
  uint64_t comms_created = 0, comms_zero_policy = 0, comms_ce_ready = 0;

  bool complete(size_t i, int nranks) const { return rows[i].reported == nranks; }
  int64_t wrong_total() const;  // over complete rows, -1 when nothing was checked
  double avg_busbw() const;     // over complete rows and both placements, like nccl-tests
  // zerocta path: timed all-gathers that did not take the ce route (summed over ranks).
  uint64_t non_ce_calls() const;
};

struct ContentionResult {
  PathId path = PathId::kNcclKernel;
  std::string status = "NOT RUN";
  std::string error;
  double seconds = 0;
  std::vector<ContentionMsg> ranks;

  // Worst rank (max over ranks) of each time; derived numbers from those.
  double gemm_alone_ms() const;
  double gemm_overlap_ms() const;
  double ag_alone_ms() const;
  double ag_overlap_ms() const;
  double makespan_ms() const;
  double sequential_ms() const;
  double slowdown_pct() const;  // GEMM, overlapped vs alone
  bool covered() const;         // every rank's all-gathers spanned its GEMM window
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

// Bandwidths of nccl-tests' all-gather: algbw = bytes / time, busbw = algbw * (n-1)/n.
void all_gather_bw(uint64_t bytes, double time_us, int nranks, double* algbw, double* busbw);

// Folds one rank's row in; returns true when every rank has reported that size.
bool add_row(PathResult* r, const RowMsg& m, int nranks);
void add_contention(ContentionResult* r, const ContentionMsg& m);

// "ce", "passthrough", "ce:25,passthrough:1", or "-" when nothing was counted.
std::string route_tag(const uint64_t* routes);

// Output, nccl-tests style.
void print_path_banner(FILE* f, const PathResult& r, const BenchReport& b);
void print_rank_line(FILE* f, const HelloMsg& h, const BenchReport& b);
void print_table_header(FILE* f, bool with_routes);
std::string format_row(const RowAgg& row, const char* type_name, bool with_routes);
void print_path_footer(FILE* f, const PathResult& r, const BenchReport& b);
void print_comparison(FILE* f, const BenchReport& b);
void print_contention(FILE* f, const BenchReport& b);

// The --json document.
std::string report_json(const BenchReport& b);

}  // namespace zcb
