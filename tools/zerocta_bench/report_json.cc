// The --json document: machine, options, every path (init times, every row per placement with
// the route counters and the time ratio against nccl-kernel) and the contention results.
// tools/zerocta-plot reads it.
#include <cmath>

#include "json_writer.h"
#include "report.h"

namespace zcb {

namespace {

void write_routes(JsonWriter& w, const uint64_t* routes) {
  w.key("routes").begin_object();
  for (int i = 0; i < zerocta_route_count; ++i) w.kv(route_name(i), routes[i]);
  w.end_object();
}

// NaN is written as null.
void write_place(JsonWriter& w, const char* name, const PlaceAgg& p, bool shim,
                 double time_vs_kernel) {
  w.key(name).begin_object();
  w.kv("time_us", p.time_us).kv("median_us", p.median_us);
  w.kv("algbw_gbps", p.algbw).kv("busbw_gbps", p.busbw);
  w.kv("time_vs_nccl_kernel", time_vs_kernel);
  if (p.wrong < 0)
    w.key("wrong").null();
  else
    w.kv("wrong", p.wrong);
  if (shim) write_routes(w, p.routes);
  w.end_object();
}

void write_machine(JsonWriter& w, const BenchReport& b) {
  const MachineInfo& m = b.machine;
  w.key("machine").begin_object();
  w.kv("hostname", m.hostname).kv("fake", m.fake);
  w.kv("driver_version", m.driver_version);
  w.kv("cuda_driver_api", cuda_version_string(m.cuda_driver_version));
  w.kv("cuda_runtime", cuda_version_string(m.cuda_runtime_version));
  w.kv("nccl_version", nccl_version_string(m.nccl_version)).kv("nccl_version_code", m.nccl_version);
  w.kv("gpu_count", m.gpu_count).kv("nranks", b.nranks);
  w.key("gpus").begin_array();
  for (size_t i = 0; i < m.gpus.size(); ++i) {
    w.begin_object().kv("index", static_cast<int>(i)).kv("name", m.gpus[i].name);
    w.kv("bus_id", m.gpus[i].bus_id).kv("memory_bytes", m.gpus[i].memory_bytes).end_object();
  }
  w.end_array();
  w.key("p2p_missing").begin_array();
  for (const std::string& s : m.p2p_missing) w.value(s);
  w.end_array();
  w.end_object();
}

void write_options(JsonWriter& w, const BenchReport& b) {
  const Options& o = *b.o;
  w.key("options").begin_object();
  w.kv("op", op_name(o.op)).kv("redop", op_reduces(o.op) ? "sum" : "none");
  w.kv("root", o.op == CollOp::kBroadcast ? kBroadcastRoot : -1);
  w.kv("min_bytes", o.min_bytes).kv("max_bytes", o.max_bytes).kv("step_factor", o.step_factor);
  w.kv("iters", o.iters).kv("warmups", o.warmups).kv("check", o.check);
  w.kv("dtype", o.dtype.name).kv("dtype_bytes", o.dtype.bytes);
  w.kv("quick", o.quick).kv("seed", o.seed).kv("zerocta_lib", b.shim_lib);
  w.kv("contention", o.contention);
  w.key("gemm").begin_array().value(o.gemm_m).value(o.gemm_n).value(o.gemm_k).end_array();
  w.kv("gemm_iters", o.gemm_iters);
  w.kv("contention_bytes", o.contention_total_bytes(b.nranks));
  w.key("argv").begin_array();
  for (const std::string& a : b.argv) w.value(a);
  w.end_array();
  w.end_object();
}

void write_init(JsonWriter& w, const PathResult& r) {
  w.kv("init_call", path_is_single_process(r.path)  ? "none"
                    : path_sets_zero_policy(r.path) ? "ncclCommInitRankConfig"
                                                    : "ncclCommInitRank");
  w.kv("init_ms", r.init_ms()).kv("first_op_ms", r.first_op_ms());  // max over ranks
  if (r.init.empty())
    w.key("first_op_bytes").null();
  else
    w.kv("first_op_bytes", r.init.front().first_op_bytes);
  w.key("init_per_rank").begin_array();
  for (const InitTimesMsg& t : r.init)
    w.begin_object()
        .kv("rank", t.rank)
        .kv("init_ms", t.init_ms)
        .kv("first_op_ms", t.first_op_ms)
        .end_object();
  w.end_array();
}

void write_path(JsonWriter& w, const PathResult& r, const BenchReport& b) {
  const bool shim = path_uses_shim(r.path);
  const PathResult* kern = find_path(b, PathId::kNcclKernel);
  w.begin_object();
  w.kv("name", path_name(r.path)).kv("status", r.status).kv("error", r.error);
  w.kv("seconds", r.seconds).kv("uses_shim", shim);
  if (const char* mode = path_allgather_mode(r.path)) w.kv("zerocta_allgather", mode);
  write_init(w, r);
  w.key("ranks").begin_array();
  for (const RankInfo& ri : r.ranks) {
    const HelloMsg& h = ri.hello;
    w.begin_object().kv("rank", h.rank).kv("device", h.device).kv("pid", h.pid);
    w.kv("gpu", h.gpu_name).kv("bus_id", h.bus_id);
    if (h.nccl_version > 0) w.kv("nccl_version", nccl_version_string(h.nccl_version));
    w.kv("shim_loaded", h.shim_loaded != 0);
    if (h.shim_loaded) w.kv("shim_version", h.shim_version);
    w.end_object();
  }
  w.end_array();
  w.key("rows").begin_array();
  for (size_t i = 0; i < r.rows.size(); ++i) {
    if (!r.complete(i, b.nranks)) continue;
    const RowAgg& row = r.rows[i];
    w.begin_object().kv("size", row.bytes).kv("count", row.count).kv("type", b.o->dtype.name);
    write_place(w, "out_of_place", row.oop, shim, time_ratio(&r, kern, i, false, b.nranks));
    write_place(w, "in_place", row.ip, shim, time_ratio(&r, kern, i, true, b.nranks));
    w.end_object();
  }
  w.end_array();
  const int64_t wrong = r.wrong_total();
  if (wrong < 0)
    w.key("wrong_total").null();
  else
    w.kv("wrong_total", wrong);
  w.kv("avg_busbw_gbps", r.avg_busbw());
  const RatioSummary rs = kern ? time_ratio_summary(r, *kern, b.nranks) : RatioSummary();
  if (rs.rows == 0) {
    w.key("time_vs_nccl_kernel").null();
  } else {
    w.key("time_vs_nccl_kernel").begin_object();
    w.kv("median", rs.median).kv("min", rs.min).kv("max", rs.max).kv("rows", rs.rows);
    w.end_object();
  }
  if (shim && r.shim_reports > 0) {
    w.key("shim_totals").begin_object();
    write_routes(w, r.shim_op_calls);
    w.kv("comms_created", r.comms_created).kv("comms_zero_policy", r.comms_zero_policy);
    w.kv("comms_ce_ready", r.comms_ce_ready).end_object();
  }
  w.end_object();
}

void write_contention(JsonWriter& w, const ContentionResult& r, const BenchReport& b) {
  const Options& o = *b.o;
  const double flop = 2.0 * o.gemm_m * o.gemm_n * static_cast<double>(o.gemm_k);
  auto tflops = [&](double ms) { return ms > 0 ? flop / (ms * 1e9) : NAN; };
  w.begin_object();
  w.kv("path", path_name(r.path)).kv("status", r.status).kv("error", r.error);
  w.kv("seconds", r.seconds);
  if (!r.ranks.empty()) {
    w.kv("ag_bytes", r.ranks.front().ag_bytes);
    w.kv("gemm_alone_ms", r.gemm_alone_ms()).kv("gemm_alone_tflops", tflops(r.gemm_alone_ms()));
    w.kv("gemm_overlap_ms", r.gemm_overlap_ms());
    w.kv("gemm_overlap_tflops", tflops(r.gemm_overlap_ms()));
    w.kv("gemm_slowdown_pct", r.slowdown_pct());
    w.kv("ag_alone_ms", r.ag_alone_ms()).kv("ag_overlap_ms", r.ag_overlap_ms());
    w.kv("ag_throughput_ratio", r.ag_overlap_ms() > 0 ? r.ag_alone_ms() / r.ag_overlap_ms() : NAN);
    w.kv("makespan_ms", r.makespan_ms()).kv("sequential_ms", r.sequential_ms());
    w.kv("covered", r.covered());
  }
  w.key("per_rank").begin_array();
  for (const ContentionMsg& c : r.ranks) {
    w.begin_object().kv("rank", c.rank).kv("gemm_iters", c.gemm_iters).kv("ag_ops", c.ag_ops);
    w.kv("ag_in_window", c.ag_in_window).kv("covered", c.covered != 0);
    w.kv("gemm_alone_ms", c.gemm_alone_ms).kv("gemm_overlap_ms", c.gemm_overlap_ms);
    w.kv("ag_alone_ms", c.ag_alone_ms).kv("ag_overlap_ms", c.ag_overlap_ms);
    w.kv("makespan_ms", c.makespan_ms).kv("sequential_ms", c.sequential_ms);
    if (path_uses_shim(r.path)) write_routes(w, c.route_calls);
    w.end_object();
  }
  w.end_array();
  w.end_object();
}

}  // namespace

std::string report_json(const BenchReport& b) {
  JsonWriter w;
  w.begin_object();
  w.kv("tool", "zerocta-bench").kv("format_version", 1).kv("started_at", b.started_at);
  w.kv("result", b.ok() ? "OK" : "FAILED").kv("interrupted", b.interrupted);
  write_machine(w, b);
  write_options(w, b);
  w.key("paths").begin_array();
  for (const PathResult& r : b.sweep) write_path(w, r, b);
  w.end_array();
  w.key("contention").begin_array();
  for (const ContentionResult& r : b.contention) write_contention(w, r, b);
  w.end_array();
  w.end_object();
  return w.str() + "\n";
}

}  // namespace zcb
