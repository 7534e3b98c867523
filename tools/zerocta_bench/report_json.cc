// The --json document: machine, options, every path (init times, every row's first op on fresh
// buffers and its placements with the route counters and the time ratio against nccl-kernel)
// and the contention results.
// tools/zerocta-plot reads it.
#include <cmath>

#include "json_writer.h"
#include "report.h"

namespace zcb {

namespace {

void write_routes(JsonWriter& w, const uint64_t* routes, const char* key = "routes") {
  w.key(key).begin_object();
  for (int i = 0; i < zerocta_route_count; ++i) w.kv(route_name(i), routes[i]);
  w.end_object();
}

// NaN is written as null.
// rs: reduce-scatter, whose placements also have the largest difference from the float64
// reference ("maxdiff").
void write_place(JsonWriter& w, const char* name, const PlaceAgg& p, bool shim,
                 double time_vs_kernel, bool rs) {
  w.key(name).begin_object();
  w.kv("time_us", p.time_us).kv("median_us", p.median_us);
  w.kv("algbw_gbps", p.algbw).kv("busbw_gbps", p.busbw);
  w.kv("time_vs_nccl_kernel", time_vs_kernel);
  if (p.wrong < 0)
    w.key("wrong").null();
  else
    w.kv("wrong", p.wrong);
  if (rs) {
    if (p.maxdiff < 0)
      w.key("maxdiff").null();
    else
      w.kv("maxdiff", p.maxdiff);
  }
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
  w.kv("op", op_name(o.op)).kv("redop", o.redop_label());
  w.kv("rs_ctas", o.rs_ctas);
  w.kv("contention_op", op_name(o.contention_op()));
  w.kv("root", o.op == CollOp::kBroadcast ? kBroadcastRoot : -1);
  w.kv("min_bytes", o.min_bytes).kv("max_bytes", o.max_bytes).kv("step_factor", o.step_factor);
  w.kv("iters", o.iters).kv("warmups", o.warmups).kv("check", o.check);
  w.kv("events_every", events_every(o, o.iters)).kv("rounds", o.rounds);
  w.kv("dtype", o.dtype.name).kv("dtype_bytes", o.dtype.bytes);
  w.kv("quick", o.quick).kv("seed", o.seed).kv("zerocta_lib", b.shim_lib);
  w.kv("alloc", alloc_name(o.alloc)).kv("one_process", o.one_process).kv("graph", o.graph);
  w.kv("cumem_chunk_bytes", o.cumem_chunk_bytes).kv("cumem_props", cumem_props_name(o.cumem_props));
  w.kv("contention", o.contention);
  w.kv("contention_mode", contention_mode_name(o.contention_mode));
  w.kv("contention_ops", o.contention_ops).kv("repeats", o.repeats);
  w.kv("contention_placement", o.contention_placement);
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
  const PathResult* kern = find_path(b, PathId::kNcclKernel, r.round);
  const bool is_rs = b.o->op == CollOp::kReduceScatter;
  w.begin_object();
  w.kv("name", path_name(r.path)).kv("round", r.round).kv("status", r.status).kv("error", r.error);
  w.kv("seconds", r.seconds).kv("uses_shim", shim);
  w.kv("alloc", path_alloc_label(r.path, b.o->alloc));
  w.kv("processes", path_process_count(r.path, b.o->one_process, b.nranks));
  if (const char* mode = path_allgather_mode(r.path)) w.kv("zerocta_allgather", mode);
  if (const char* mode = path_reducescatter_mode(r.path);
      mode && b.o->op == CollOp::kReduceScatter)
    w.kv("zerocta_reducescatter", mode);
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
    w.kv("redop", b.o->redop_label());
    if (is_rs) {
      if (row.maxdiff() < 0)
        w.key("maxdiff").null();
      else
        w.kv("maxdiff", row.maxdiff());
    }
    // The first op on this size's fresh buffers, max over ranks.
    w.kv("first_op_ms", row.first.ms).kv("first_op_call_ms", row.first.call_ms);
    if (r.path == PathId::kNcclCe) w.kv("first_op_windows_ms", row.first.windows_ms);
    if (shim) write_routes(w, row.first.routes, "first_op_routes");
    write_place(w, "out_of_place", row.oop, shim, time_ratio(&r, kern, i, false, b.nranks), is_rs);
    write_place(w, "in_place", row.ip, shim, time_ratio(&r, kern, i, true, b.nranks), is_rs);
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

void write_telemetry(JsonWriter& w, const char* name, const GpuTelemetry& t) {
  if (!t.available) {
    w.kv(name, "unavailable");
    return;
  }
  w.key(name).begin_array();
  for (const GpuReading& g : t.gpus)
    w.begin_object()
        .kv("index", g.index)
        .kv("sm_mhz", g.sm_mhz)
        .kv("mem_mhz", g.mem_mhz)
        .kv("power_w", g.power_w)
        .kv("temp_c", g.temp_c)
        .end_object();
  w.end_array();
}

void write_run(JsonWriter& w, const ContentionRun& run, PathId path) {
  w.begin_object().kv("repeat", run.repeat).kv("position", run.position);
  w.kv("status", run.status).kv("error", run.error).kv("seconds", run.seconds);
  w.key("gpus").begin_object();
  write_telemetry(w, "before", run.before);
  write_telemetry(w, "after", run.after);
  w.end_object();
  w.key("per_rank").begin_array();
  for (const ContentionMsg& c : run.msgs) {
    w.begin_object().kv("rank", c.rank).kv("in_place", c.in_place != 0);
    w.kv("gemm_iters", c.gemm_iters).kv("ag_ops", c.ag_ops);
    w.kv("ag_in_window", c.ag_in_window).kv("covered", c.covered != 0);
    w.kv("gemm_alone_ms", c.gemm_alone_ms).kv("gemm_overlap_ms", c.gemm_overlap_ms);
    w.kv("ag_alone_ms", c.ag_alone_ms).kv("ag_overlap_ms", c.ag_overlap_ms);
    w.kv("makespan_ms", c.makespan_ms);
    if (path_uses_shim(path)) write_routes(w, c.route_calls);
    w.end_object();
  }
  w.end_array();
  w.end_object();
}

// Per metric: the value of every OK run (repeat order) and their median, min and max.
void write_placement(JsonWriter& w, const ContentionResult& r, bool in_place, int nranks) {
  const std::vector<ContentionSample> samples = r.samples(in_place, nranks);
  w.key(in_place ? "in_place" : "out_of_place").begin_object();
  w.kv("runs", static_cast<int>(samples.size()));
  for (const ContentionMetric& m : contention_metrics()) {
    std::vector<double> v;
    for (const ContentionSample& s : samples) v.push_back(s.*m.field);
    const Spread sp = spread_of(v);
    w.key(m.key).begin_object();
    w.key("repeats").begin_array();
    for (double x : v) w.value(x);
    w.end_array();
    w.kv("median", sp.median).kv("min", sp.min).kv("max", sp.max).end_object();
  }
  w.key("ag_ops").begin_array();
  for (const ContentionSample& s : samples) w.value(s.ag_ops);
  w.end_array();
  w.end_object();
}

void write_contention(JsonWriter& w, const ContentionResult& r, const BenchReport& b) {
  w.begin_object();
  w.kv("path", path_name(r.path)).kv("status", r.status()).kv("error", r.first_error());
  w.kv("op", op_name(b.o->contention_op()));
  w.kv("alloc", path_alloc_label(r.path, b.o->alloc));
  w.kv("processes", path_process_count(r.path, b.o->one_process, b.nranks));
  w.kv("runs_ok", r.runs_ok());
  w.key("placements").begin_object();
  for (bool in_place : contention_placements(b.o->contention_placement))
    write_placement(w, r, in_place, b.nranks);
  w.end_object();
  w.key("runs").begin_array();
  for (const ContentionRun& run : r.runs) write_run(w, run, r.path);
  w.end_array();
  w.end_object();
}

}  // namespace

std::string report_json(const BenchReport& b) {
  JsonWriter w;
  w.begin_object();
  w.kv("tool", "zerocta-bench").kv("format_version", 2).kv("started_at", b.started_at);
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
