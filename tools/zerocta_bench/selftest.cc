// --self-test: CPU checks of everything in the bench that can be wrong without a GPU: option
// parsing, sizes and buffers per op, bandwidth math, the reductions' test data, aggregation
// over ranks (first ops on fresh buffers included), init times and time ratios, route tags,
// the workers' environment, the JSON writer and the rows' JSON, cumem chunking, the contention
// statistics and run order, nvidia-smi parsing, grouped window registration. Prints "N passed,
// M failed" and exits non-zero on any failure.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "coll_op.h"
#include "contention.h"
#include "contention_stats.h"
#include "cumem_buffer.h"
#include "gpu_telemetry.h"
#include "host_barrier.h"
#include "json_writer.h"
#include "launcher.h"
#include "nccl_ranks.h"
#include "options.h"
#include "premul_op.h"
#include "reduce_pattern.h"
#include "report.h"
#include "rs_kernels.h"
#include "timing.h"

namespace zcb {

namespace {

int g_pass = 0, g_fail = 0;

void expect(bool ok, const char* what, int line) {
  if (ok) {
    ++g_pass;
  } else {
    ++g_fail;
    fprintf(stderr, "self-test FAILED (line %d): %s\n", line, what);
  }
}
#define EXPECT(cond) expect((cond), #cond, __LINE__)

bool parse(std::vector<std::string> args, Options* o, std::string* err = nullptr) {
  std::vector<char*> argv = {const_cast<char*>("zerocta-bench")};
  for (std::string& a : args) argv.push_back(&a[0]);
  bool help = false;
  std::string e;
  bool ok = parse_options(static_cast<int>(argv.size()), argv.data(), o, &help, &e);
  if (err) *err = e;
  return ok;
}

bool has(const std::vector<std::string>& env, const std::string& entry) {
  for (const std::string& e : env)
    if (e == entry) return true;
  return false;
}

bool has_prefix(const std::vector<std::string>& env, const std::string& prefix) {
  for (const std::string& e : env)
    if (e.rfind(prefix, 0) == 0) return true;
  return false;
}

void test_sizes() {
  uint64_t v = 0;
  EXPECT(parse_size("1M", &v) && v == (1ull << 20));
  EXPECT(parse_size("256MiB", &v) && v == (256ull << 20));
  EXPECT(parse_size("1G", &v) && v == (1ull << 30));
  EXPECT(parse_size("4096", &v) && v == 4096);
  EXPECT(parse_size("2k", &v) && v == 2048);
  EXPECT(!parse_size("", &v));
  EXPECT(!parse_size("-1M", &v));
  EXPECT(!parse_size("1X", &v));
  EXPECT(!parse_size("99999999999T", &v));
  EXPECT(format_size(1ull << 20) == "1 MiB");
  EXPECT(format_size(3ull << 29) == "1.5 GiB");

  Options o;
  EXPECT(parse({}, &o));
  std::vector<uint64_t> s = sweep_sizes(o);  // 1M..1G by 4: 1M 4M 16M 64M 256M 1G
  EXPECT(s.size() == 6 && s.front() == (1ull << 20) && s.back() == (1ull << 30));
  Options one;
  EXPECT(parse({"-b", "8M", "-e", "8M"}, &one) && sweep_sizes(one).size() == 1);
  EXPECT(per_rank_count(1ull << 20, 2, 4) == 131072);
  EXPECT(per_rank_count(6, 4, 4) == 0);
  EXPECT(per_rank_count(1000, 3, 2) == 166);  // rounds down like nccl-tests
}

void test_options() {
  Options o;
  EXPECT(parse(
      {"-g",     "4",     "-b", "2M", "-e", "512M", "-f",       "2",       "-n",
       "7",      "-w",    "1",  "-c", "0",  "-d",   "bfloat16", "--paths", "zerocta,nccl-kernel",
       "--json", "x.json"},
      &o));
  EXPECT(o.ngpus == 4 && o.min_bytes == (2ull << 20) && o.max_bytes == (512ull << 20));
  EXPECT(o.step_factor == 2 && o.iters == 7 && o.warmups == 1 && !o.check);
  EXPECT(o.dtype.nccl == ncclBfloat16 && o.dtype.bytes == 2);
  // -g is nccl-tests' GPUs of one thread (one process); --procs a process per rank; -t only 1.
  EXPECT(o.one_process && o.ranks_option == "-g");
  {
    Options p, q, t;
    EXPECT(parse({"--procs", "2", "-t", "1"}, &p) && p.ngpus == 2 && !p.one_process &&
           p.ranks_option == "--procs");
    EXPECT(!parse({"-g", "2", "--procs", "2"}, &q));
    EXPECT(!parse({"-t", "2"}, &t));
  }
  // Canonical run order, whatever order the list had.
  EXPECT(o.paths.size() == 2 && o.paths[0] == PathId::kNcclKernel &&
         o.paths[1] == PathId::kZerocta);
  EXPECT(o.json_path == "x.json");

  Options q;
  EXPECT(parse({"-n", "9", "--quick"}, &q));  // explicit flags beat the preset in any order
  EXPECT(q.quick && q.iters == 9 && q.max_bytes == (64ull << 20) && q.gemm_m == 4096);

  Options all;
  EXPECT(parse({"--paths", "all"}, &all) && all.paths.size() == 7);
  Options none;
  EXPECT(parse({"--paths", "none", "--contention"}, &none) && none.paths.empty());
  EXPECT(none.contention && none.contention_paths.size() == 4);
  Options cp;
  EXPECT(parse({"--contention-paths", "bare-ce,zerocta-auto", "--gemm=1024,2048,512"}, &cp));
  EXPECT(cp.contention && cp.contention_paths.size() == 2 && cp.gemm_n == 2048 && cp.gemm_k == 512);
  EXPECT(cp.contention_total_bytes(4) == (1ull << 30));  // 256 MiB per rank
  std::string err;
  Options bad;
  EXPECT(!parse({"--paths", "ceiling,bogus"}, &bad, &err) &&
         err.find("bogus") != std::string::npos);
  EXPECT(!parse({"--paths", "bare-ce"}, &bad));  // contention-only path
  EXPECT(!parse({"-d", "float128"}, &bad));
  EXPECT(!parse({"-b", "1G", "-e", "1M"}, &bad));
  EXPECT(!parse({"-n"}, &bad, &err) && err.find("needs a value") != std::string::npos);
  EXPECT(!parse({"--frobnicate"}, &bad));
  Options w;
  EXPECT(parse({"--worker-path", "zerocta", "--worker-mode", "sweep", "--worker-rank", "1",
                "--worker-nranks", "2", "--worker-fds", "5,8"},
               &w));
  EXPECT(w.is_worker() && w.worker_rank == 1 && w.worker_in_fd == 5 && w.worker_out_fd == 8);
  EXPECT(!parse({"--worker-path", "zerocta"}, &bad));  // incomplete worker flags
}

void test_op_options() {
  CollOp op;
  EXPECT(parse_op("allreduce", &op) && op == CollOp::kAllReduce);
  EXPECT(parse_op("reducescatter", &op) && op == CollOp::kReduceScatter);
  EXPECT(parse_op("broadcast", &op) && op == CollOp::kBroadcast);
  EXPECT(!parse_op("all_reduce", &op) && !parse_op("", &op));
  EXPECT(std::string(op_nccl_call(CollOp::kReduceScatter)) == "ncclReduceScatter");
  EXPECT(op_shim_counter(CollOp::kBroadcast) == zerocta_op_broadcast);
  EXPECT(op_reduces(CollOp::kAllReduce) && !op_reduces(CollOp::kBroadcast));

  Options ag;
  EXPECT(parse({}, &ag) && ag.op == CollOp::kAllGather);
  EXPECT(ag.paths.size() == 7 && ag.paths[0] == PathId::kNcclKernel &&
         ag.paths[1] == PathId::kNcclPolicy && ag.paths[2] == PathId::kZeroctaPolicy &&
         ag.paths[6] == PathId::kCeiling);
  Options ar;
  EXPECT(parse({"--op", "allreduce"}, &ar) && ar.op == CollOp::kAllReduce);
  EXPECT(ar.paths.size() == 3 && ar.paths[0] == PathId::kNcclKernel &&
         ar.paths[1] == PathId::kNcclPolicy && ar.paths[2] == PathId::kZeroctaPolicy);
  Options bc;  // --paths before --op: resolved once the op is known
  EXPECT(parse({"--paths", "all", "--op=broadcast"}, &bc) && bc.paths.size() == 5);
  for (PathId p : bc.paths) EXPECT(p != PathId::kNcclCe && p != PathId::kCeiling);
  Options rs;
  EXPECT(parse({"--paths", "zerocta-policy,zerocta,nccl-kernel", "--op", "reducescatter"}, &rs));
  EXPECT(rs.paths.size() == 3 && rs.paths[0] == PathId::kNcclKernel &&
         rs.paths[1] == PathId::kZeroctaPolicy && rs.paths[2] == PathId::kZerocta);
  std::string err;
  Options bad1, bad2, bad3, bad4, bad5;  // fresh each: parse_options fills in its defaults once
  EXPECT(!parse({"--paths", "nccl-kernel,nccl-ce", "--op", "allreduce"}, &bad1, &err) &&
         err.find("nccl-ce") != std::string::npos &&
         err.find("does not apply to --op allreduce") != std::string::npos);
  EXPECT(!parse({"--op", "broadcast", "--paths", "ceiling"}, &bad2, &err) &&
         err.find("ceiling") != std::string::npos);
  EXPECT(!parse({"--op", "allreduce", "--contention"}, &bad3, &err) &&
         err.find("--contention") != std::string::npos);
  Options rsc;  // reduce-scatters under contention are allowed now
  EXPECT(parse({"--op", "reducescatter", "--contention"}, &rsc) && rsc.contention);
  EXPECT(!parse({"--op", "alltoall"}, &bad4));
  EXPECT(!parse({"--paths", ""}, &bad5));

  EXPECT(path_uses_shim(PathId::kZeroctaPolicy) && !path_uses_shim(PathId::kNcclPolicy));
  EXPECT(std::string(path_allgather_mode(PathId::kZeroctaPolicy)) == "nccl");
  EXPECT(path_allgather_mode(PathId::kNcclPolicy) == nullptr);
  EXPECT(path_sets_zero_policy(PathId::kNcclPolicy) && path_sets_zero_policy(PathId::kNcclCe));
  EXPECT(!path_sets_zero_policy(PathId::kNcclKernel) &&
         !path_sets_zero_policy(PathId::kZeroctaPolicy));
  PathId id;
  EXPECT(parse_path_name("nccl-policy", &id) && id == PathId::kNcclPolicy);
  EXPECT(parse_path_name("zerocta-policy", &id) && id == PathId::kZeroctaPolicy);
}

void test_shapes() {
  const uint64_t m = 1ull << 20;
  CollShape s = coll_shape(CollOp::kAllGather, m, 4, 4);  // output 1 MiB, 64 Ki floats per rank
  EXPECT(s.count == 65536 && s.bytes == m && s.send_bytes == m / 4 && s.recv_bytes == m);
  s = coll_shape(CollOp::kReduceScatter, m, 4, 4);  // input 1 MiB
  EXPECT(s.count == 65536 && s.bytes == m && s.send_bytes == m && s.recv_bytes == m / 4);
  s = coll_shape(CollOp::kAllReduce, m, 4, 4);
  EXPECT(s.count == 262144 && s.bytes == m && s.send_bytes == m && s.recv_bytes == m);
  s = coll_shape(CollOp::kBroadcast, m, 4, 2);
  EXPECT(s.count == 524288 && s.bytes == m && s.send_bytes == m && s.recv_bytes == m);
  // Rounded down to whole elements and whole per-rank pieces, like nccl-tests.
  s = coll_shape(CollOp::kReduceScatter, 1000, 3, 2);
  EXPECT(s.count == 166 && s.bytes == 996 && s.recv_bytes == 332);
  s = coll_shape(CollOp::kAllReduce, 1001, 3, 2);
  EXPECT(s.count == 500 && s.bytes == 1000);
  s = coll_shape(CollOp::kAllGather, 6, 4, 4);  // too small: nothing at all
  EXPECT(s.count == 0 && s.bytes == 0 && s.send_bytes == 0 && s.recv_bytes == 0);

  Options o;
  EXPECT(parse({"--op", "reducescatter", "-b", "1M", "-e", "4M"}, &o));
  EXPECT(sweep_shape(o, 4 * m, 2).send_bytes == 4 * m && sweep_shape(o, 4 * m, 2).count == m / 2);

  char a[64], b[64];
  s = coll_shape(CollOp::kAllGather, 16, 4, 1);  // 4 bytes per rank
  Placement p = place_buffers(CollOp::kAllGather, false, 2, s, a, b);
  EXPECT(p.send == a && p.recv == b);
  p = place_buffers(CollOp::kAllGather, true, 2, s, a, b);  // sends its own piece of the output
  EXPECT(p.recv == b && p.send == b + 8);
  s = coll_shape(CollOp::kReduceScatter, 16, 4, 1);
  p = place_buffers(CollOp::kReduceScatter, true, 3, s, a, b);  // receives into its input piece
  EXPECT(p.send == a && p.recv == a + 12);
  s = coll_shape(CollOp::kAllReduce, 16, 4, 1);
  p = place_buffers(CollOp::kAllReduce, true, 1, s, a, b);
  EXPECT(p.send == b && p.recv == b);
  p = place_buffers(CollOp::kBroadcast, true, 0, s, a, b);
  EXPECT(p.send == b && p.recv == b);

  EXPECT(std::fabs(bus_factor(CollOp::kAllGather, 4) - 0.75) < 1e-12);
  EXPECT(std::fabs(bus_factor(CollOp::kReduceScatter, 4) - 0.75) < 1e-12);
  EXPECT(std::fabs(bus_factor(CollOp::kAllReduce, 4) - 1.5) < 1e-12);
  EXPECT(std::fabs(bus_factor(CollOp::kAllReduce, 2) - 1.0) < 1e-12);
  EXPECT(bus_factor(CollOp::kBroadcast, 8) == 1.0);
}

// Every partial sum NCCL can form (any subset of the ranks) must stay exactly representable.
bool partial_sums_exact(ncclDataType_t type, int nranks) {
  const ReducePattern p = make_reduce_pattern(type, nranks, 12345);
  const int64_t limit =
      static_cast<int64_t>(std::min<uint64_t>(exact_integer_limit(type), 1ull << 62));
  const bool unsig = is_unsigned_type(type);
  for (uint64_t i = 0; i < 200; ++i) {
    int64_t pos = 0, neg = 0;  // the extreme subset sums: all positive or all negative values
    for (int r = 0; r < nranks; ++r) {
      const int64_t v = reduce_input_value(p, i, r);
      if (unsig && v < 0) return false;
      (v > 0 ? pos : neg) += v;
    }
    if (pos > limit || -neg > limit) return false;
  }
  return true;
}

void test_reduce_pattern() {
  // The brief's formula at full amplitude: ((7i + 13r) mod 17) - 8.
  ReducePattern p;
  EXPECT(p.amplitude == 8 && p.offset == 0 && p.shift == 0);
  EXPECT(reduce_input_value(p, 3, 1) == ((21 + 13) % 17) - 8);
  EXPECT(reduce_input_value(p, 0, 0) == -8 && reduce_input_value(p, 1, 0) == -1);
  EXPECT(reduce_expected_sum(p, 5, 3) ==
         reduce_input_value(p, 5, 0) + reduce_input_value(p, 5, 1) + reduce_input_value(p, 5, 2));
  EXPECT(make_reduce_pattern(ncclFloat32, 8, 0).amplitude == 8);
  EXPECT(make_reduce_pattern(ncclBfloat16, 64, 0).amplitude == 4);   // 256 / 64
  EXPECT(make_reduce_pattern(ncclFloat8e5m2, 2, 0).amplitude == 4);  // 8 / 2
  EXPECT(make_reduce_pattern(ncclFloat8e5m2, 16, 0).amplitude == 0);
  EXPECT(make_reduce_pattern(ncclFloat8e4m3, 4, 0).amplitude == 4);  // 16 / 4
  EXPECT(make_reduce_pattern(ncclInt8, 8, 0).amplitude == 8);        // sums within -64..64
  const ReducePattern u = make_reduce_pattern(ncclUint8, 32, 0);     // 255 / 64
  EXPECT(u.amplitude == 3 && u.offset == 3);
  const ReducePattern zero = make_reduce_pattern(ncclFloat8e5m2, 16, 99);
  EXPECT(reduce_input_value(zero, 7, 5) == 0 && reduce_expected_sum(zero, 7, 16) == 0);
  // A new size or placement shifts the pattern, so a stale output cannot pass.
  EXPECT(make_reduce_pattern(ncclFloat32, 2, 4).shift !=
         make_reduce_pattern(ncclFloat32, 2, 5).shift);
  const ncclDataType_t types[] = {ncclInt8,    ncclUint8,    ncclInt32,      ncclUint32,
                                  ncclInt64,   ncclUint64,   ncclFloat16,    ncclFloat32,
                                  ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
  for (ncclDataType_t t : types) {
    EXPECT(exact_integer_limit(t) > 0);
    for (int n : {2, 3, 4, 8, 16, 64}) EXPECT(partial_sums_exact(t, n));
  }
  // Ranks differ (else a reduction that used one rank's data twice would pass).
  bool differ = false;
  for (uint64_t i = 0; i < 17; ++i)
    differ |= reduce_input_value(p, i, 0) != reduce_input_value(p, i, 1);
  EXPECT(differ);
}

void test_init_and_ratios() {
  PathResult k, pol;
  k.path = PathId::kNcclKernel;
  pol.path = PathId::kNcclPolicy;
  EXPECT(std::isnan(k.init_ms()) && init_summary(k).empty());
  InitTimesMsg t{};
  t.rank = 0;
  t.init_ms = 300;
  t.first_op_ms = 41;
  EXPECT(!add_init(&k, t, 2));
  t.rank = 1;
  t.init_ms = 307;
  t.first_op_ms = 40;
  EXPECT(add_init(&k, t, 2));
  EXPECT(k.init_ms() == 307 && k.first_op_ms() == 41);  // max over ranks, field by field
  EXPECT(init_summary(k) == "init: max over ranks 307.0 ms, first op 41.0 ms");

  k.rows.resize(3);
  pol.rows.resize(3);
  RowMsg m{};
  m.bytes = 1 << 20;
  for (int size = 0; size < 3; ++size) {
    m.size_index = size;
    for (int rank = 0; rank < 2; ++rank) {
      m.rank = rank;
      m.oop.mean_us = 100;
      m.ip.mean_us = 200;
      add_row(&k, m, 2, CollOp::kAllReduce);
      m.oop.mean_us = size == 2 ? 90 : 110;  // policy: +10 %, +10 %, -10 % out of place
      m.ip.mean_us = 200;                    // and unchanged in place
      if (size != 1) add_row(&pol, m, 2, CollOp::kAllReduce);  // size 1 missing
    }
  }
  EXPECT(std::fabs(k.rows[0].oop.busbw - k.rows[0].oop.algbw) < 1e-12);  // 2(n-1)/n = 1 at n=2
  EXPECT(std::fabs(time_ratio(&pol, &k, 0, false, 2) - 1.1) < 1e-12);
  EXPECT(std::isnan(time_ratio(&pol, &k, 1, false, 2)));
  EXPECT(std::isnan(time_ratio(&pol, nullptr, 0, false, 2)));
  const RatioSummary rs = time_ratio_summary(pol, k, 2);
  EXPECT(rs.rows == 4 && std::fabs(rs.min - 0.9) < 1e-12 && std::fabs(rs.max - 1.1) < 1e-12);
  EXPECT(std::fabs(rs.median - 1.0) < 1e-12);  // {0.9, 1, 1, 1.1}
  EXPECT(format_row(k.rows[0], CollOp::kAllReduce, "float", false).find(" sum ") !=
         std::string::npos);
  const std::string bc = format_row(k.rows[0], CollOp::kBroadcast, "float", false);
  EXPECT(bc.find(" none ") != std::string::npos && bc.find(" 0  ") != std::string::npos);
}

void test_bandwidth_and_rows() {
  double alg = 0, bus = 0;
  coll_bw(CollOp::kAllGather, 1000000000ull, 1000000.0, 4, &alg, &bus);  // 1 GB in 1 s
  EXPECT(std::fabs(alg - 1.0) < 1e-12 && std::fabs(bus - 0.75) < 1e-12);
  coll_bw(CollOp::kAllReduce, 1000000000ull, 1000000.0, 4, &alg, &bus);
  EXPECT(std::fabs(alg - 1.0) < 1e-12 && std::fabs(bus - 1.5) < 1e-12);
  coll_bw(CollOp::kBroadcast, 1000000000ull, 500000.0, 4, &alg, &bus);
  EXPECT(std::fabs(alg - 2.0) < 1e-12 && std::fabs(bus - 2.0) < 1e-12);

  PathResult r;
  r.path = PathId::kZerocta;
  r.rows.resize(2);
  RowMsg a{}, b{};
  a.rank = 0;
  a.size_index = 1;
  a.bytes = 1 << 20;
  a.count = 1 << 17;
  a.oop = {100.0, 90.0, 0, {0, 26, 0}, -1};
  a.ip = {80.0, 70.0, 2, {0, 26, 0}, -1};
  a.first = {0.3, 0.5, {0, 1, 0}, 7.5};  // {call_ms, ms, routes, windows_ms}
  b = a;
  b.rank = 1;
  b.first = {0.2, 2.5, {1, 0, 0}, 6.0};  // one process's first op went to NCCL
  b.oop = {120.0, 80.0, 0, {1, 25, 0}, -1};
  b.ip = {60.0, 75.0, -1, {0, 26, 0}, -1};
  EXPECT(!add_row(&r, a, 2, CollOp::kAllGather));
  EXPECT(!r.complete(1, 2));
  EXPECT(add_row(&r, b, 2, CollOp::kAllGather));
  const RowAgg& row = r.rows[1];
  EXPECT(row.oop.time_us == 120.0 && row.oop.median_us == 90.0);  // max over ranks
  EXPECT(row.ip.time_us == 80.0 && row.ip.median_us == 75.0);
  EXPECT(row.oop.wrong == 0 && row.ip.wrong == -1);  // one unchecked rank: not checked
  EXPECT(row.oop.routes[zerocta_route_ce] == 51 && row.oop.routes[zerocta_route_passthrough] == 1);
  // The first op: max over ranks of each time, its routes summed and checked like the others.
  EXPECT(row.first.ms == 2.5 && row.first.call_ms == 0.3 && row.first.windows_ms == 7.5);
  EXPECT(row.first.routes[zerocta_route_ce] == 1 &&
         row.first.routes[zerocta_route_passthrough] == 1);
  EXPECT(r.non_ce_calls() == 2);
  EXPECT(std::fabs(row.oop.busbw - (1 << 20) / 120e3 / 2) < 1e-9);
  EXPECT(route_tag(row.ip.routes) == "ce");
  EXPECT(route_tag(row.oop.routes) == "passthrough:1,ce:51");
  const uint64_t zero[zerocta_route_count] = {};
  EXPECT(route_tag(zero) == "-");
  std::string line = format_row(row, CollOp::kAllGather, "float", true);
  EXPECT(line.find("1048576") == 0 || line.find(" 1048576 ") != std::string::npos);
  EXPECT(line.find("N/A") != std::string::npos &&
         line.find("passthrough:1,ce:51|ce first:passthrough:1,ce:1") != std::string::npos);
  EXPECT(line.find("     2.500  ") != std::string::npos);  // the first-op column, before route
  EXPECT(r.wrong_total() == 0);

  // In the JSON, per row: the first op's times (max over ranks) and, on a shim path, its routes.
  Options o;
  BenchReport rep;
  rep.o = &o;
  rep.nranks = 2;
  rep.sizes = {1 << 19, 1 << 20};
  r.status = "OK";
  rep.sweep.push_back(r);
  const std::string json = report_json(rep);
  EXPECT(json.find("\"first_op_ms\": 2.5,") != std::string::npos);
  EXPECT(json.find("\"first_op_call_ms\": 0.3,") != std::string::npos);
  std::string flat = json;  // without the writer's indentation
  flat.erase(std::remove_if(flat.begin(), flat.end(), [](char c) { return c == ' ' || c == '\n'; }),
             flat.end());
  EXPECT(flat.find("\"first_op_routes\":{\"passthrough\":1,\"ce\":1,\"nccl_ce\":0}") !=
         std::string::npos);
  EXPECT(json.find("first_op_windows_ms") == std::string::npos);  // only nccl-ce registers
  rep.sweep.back().path = PathId::kNcclKernel;  // no shim: no routes, still the times
  const std::string kernel_json = report_json(rep);
  EXPECT(kernel_json.find("\"first_op_ms\": 2.5,") != std::string::npos &&
         kernel_json.find("first_op_routes") == std::string::npos);
  rep.sweep.back().path = PathId::kNcclCe;  // its windows' registration, max over ranks
  EXPECT(report_json(rep).find("\"first_op_windows_ms\": 7.5,") != std::string::npos);
  // Single-row line with no route column still prints the first op.
  EXPECT(format_row(row, CollOp::kAllGather, "float", false).find("     2.500") !=
         std::string::npos);
  RowMsg bad = a;
  bad.size_index = 7;  // out of range: ignored, not a crash
  EXPECT(!add_row(&r, bad, 2, CollOp::kAllGather));
}

void test_environment() {
  std::vector<std::string> base = {"PATH=/bin", "LD_PRELOAD=/x/libzerocta.so:/y/libother.so",
                                   "NCCL_NVLS_ENABLE=1", "ZEROCTA_LOG=info"};
  // Without --multicast-off the caller's NCCL/TORCH settings reach the workers unchanged.
  for (PathId p : {PathId::kNcclKernel, PathId::kZerocta, PathId::kCeiling}) {
    std::vector<std::string> e = worker_environment(base, p, "/b/libzerocta.so", false);
    EXPECT(has(e, "NCCL_NVLS_ENABLE=1") && !has(e, "NCCL_NVLS_ENABLE=0"));
    EXPECT(!has_prefix(e, "TORCH_SYMM_MEM_DISABLE_MULTICAST="));
  }
  std::vector<std::string> plain =
      worker_environment({"PATH=/bin"}, PathId::kNcclKernel, "/l.so", false);
  EXPECT(plain == std::vector<std::string>{"PATH=/bin"});
  // --multicast-off: multicast off, whatever the caller had.
  std::vector<std::string> k =
      worker_environment(base, PathId::kNcclKernel, "/b/libzerocta.so", true);
  EXPECT(has(k, "LD_PRELOAD=/y/libother.so"));  // the shim stripped from a no-shim path
  EXPECT(has(k, "NCCL_NVLS_ENABLE=0") && !has(k, "NCCL_NVLS_ENABLE=1"));
  EXPECT(has(k, "TORCH_SYMM_MEM_DISABLE_MULTICAST=1") && has(k, "PATH=/bin"));
  EXPECT(!has_prefix(k, "ZEROCTA_ALLGATHER="));
  for (const char* kv : kMulticastOffEnv) EXPECT(has(k, kv));
  std::vector<std::string> z =
      worker_environment(base, PathId::kZerocta, "/b/libzerocta.so", false);
  EXPECT(has(z, "LD_PRELOAD=/b/libzerocta.so:/y/libother.so"));  // prepended, never twice
  EXPECT(has(z, "ZEROCTA_ALLGATHER=zerocta") && has(z, "ZEROCTA_LOG=info"));
  std::vector<std::string> za = worker_environment({"A=1"}, PathId::kZeroctaAuto, "/l.so", false);
  EXPECT(has(za, "LD_PRELOAD=/l.so") && has(za, "ZEROCTA_ALLGATHER=auto"));
  std::vector<std::string> c =
      worker_environment({"LD_PRELOAD=libzerocta.so"}, PathId::kCeiling, "/l.so", false);
  EXPECT(!has_prefix(c, "LD_PRELOAD="));
  // zerocta-policy: the shim, but only its policy; nccl-policy: no shim at all.
  std::vector<std::string> zp =
      worker_environment(base, PathId::kZeroctaPolicy, "/b/libzerocta.so", false);
  EXPECT(has(zp, "LD_PRELOAD=/b/libzerocta.so:/y/libother.so") &&
         has(zp, "ZEROCTA_ALLGATHER=nccl"));
  std::vector<std::string> np =
      worker_environment({"LD_PRELOAD=/x/libzerocta.so", "ZEROCTA_ALLGATHER=zerocta"},
                         PathId::kNcclPolicy, "/l.so", true);
  EXPECT(!has_prefix(np, "LD_PRELOAD=") && has(np, "NCCL_NVLS_ENABLE=0"));
  Options o;
  EXPECT(parse({}, &o) && !o.multicast_off);
  EXPECT(parse({"--multicast-off"}, &o) && o.multicast_off);
  Options former;
  EXPECT(parse({"--test-host"}, &former) && former.multicast_off);  // its former name
}

// --help names every path the bench knows, and says which environment --multicast-off sets.
void test_help_lists_every_path() {
  const std::string help = usage_text("zerocta-bench");
  for (int i = 0;; ++i) {
    const char* name = path_name(static_cast<PathId>(i));
    if (std::string(name) == "?") break;
    const std::string row = std::string("\n  ") + name + " ";
    EXPECT(help.find(row) != std::string::npos);
    if (help.find(row) == std::string::npos) fprintf(stderr, "  (--help lacks path %s)\n", name);
  }
  EXPECT(help.find("--multicast-off") != std::string::npos);
  EXPECT(help.find("--test-host") == std::string::npos);
  for (const char* kv : kMulticastOffEnv)
    EXPECT(help.find(std::string(kv).substr(0, 10)) != std::string::npos);
}

void test_gpu_count() {
  Options any, two, one;
  two.ngpus = 2;
  one.ngpus = 1;
  std::string m;
  // Without -g: no GPU or one GPU is "nothing to measure", status 0.
  EXPECT(check_gpu_count(any, 0, "no driver", &m) == kExitOk &&
         m.find("no GPU found (no driver)") != std::string::npos);
  EXPECT(check_gpu_count(any, 1, "", &m) == kExitOk);
  EXPECT(check_gpu_count(any, 2, "", &m) == -1 && check_gpu_count(any, 8, "", &m) == -1);
  // 2 ranks asked for: without GPUs it is an error, never a quiet 0.
  EXPECT(check_gpu_count(two, 0, "no driver", &m) == kExitUsage &&
         m.find("-g 2 but only 0 GPU(s) visible (no driver)") != std::string::npos);
  EXPECT(check_gpu_count(two, 1, "", &m) == kExitUsage);
  EXPECT(check_gpu_count(two, 2, "", &m) == -1 && check_gpu_count(two, 4, "", &m) == -1);
  EXPECT(check_gpu_count(one, 4, "", &m) == kExitUsage &&
         m.find("at least 2 ranks") != std::string::npos);
}

void test_json_and_misc() {
  JsonWriter w;
  w.begin_object().kv("a", 1).kv("s", "q\"\\\n\x01").key("arr").begin_array();
  w.value(1.5).value(NAN).null().end_array().key("e").begin_object().end_object().end_object();
  const std::string& s = w.str();
  EXPECT(s.find("\"s\": \"q\\\"\\\\\\n\\u0001\"") != std::string::npos);
  EXPECT(s.find("1.5,") != std::string::npos && s.find("null,") != std::string::npos);
  EXPECT(s.find("\"e\": {}") != std::string::npos && s.back() == '}');
  EXPECT(median_of({3, 1, 2}) == 2 && median_of({4, 1, 3, 2}) == 2.5 && median_of({}) == 0);
  EXPECT(overlap_op_count(50, 1.4, 1.0) == 142 && overlap_op_count(50, 1.0, 0) == 4000);
  EXPECT(overlap_op_count(1, 0.001, 10) == 4);
  EXPECT(nccl_version_string(22809) == "2.28.9" && nccl_version_string(2708) == "2.7.8");
  EXPECT(cuda_version_string(13000) == "13.0");
}

void test_new_options() {
  Options d;
  EXPECT(parse({}, &d));
  EXPECT(d.alloc == BufferAlloc::kCudaMalloc && !d.one_process);
  EXPECT(d.contention_mode == ContentionMode::kFixed && d.contention_ops == 40);
  EXPECT(d.repeats == 5 && d.gemm_iters == 20 && d.contention_placement == "both");
  EXPECT(!d.contention);
  Options q;
  EXPECT(parse({"--quick"}, &q) && q.repeats == 3 && q.contention_ops == 10);
  Options o;
  EXPECT(parse({"--alloc", "cumem", "--one-process", "--contention-mode=saturate",
                "--contention-ops", "12", "--repeats", "7", "--contention-placement", "in"},
               &o));
  EXPECT(o.alloc == BufferAlloc::kCuMem && o.one_process && o.contention);
  EXPECT(!o.graph);
  Options g;
  EXPECT(parse({"--graph"}, &g) && g.graph && !g.one_process);
  Options it;
  EXPECT(parse({"--iter-times"}, &it) && it.iter_times && !g.iter_times);
  Options chunk, chunk0;  // PyTorch's 20 MiB segments unless asked
  EXPECT(g.cumem_chunk_bytes == (20ull << 20));
  EXPECT(parse({"--cumem-chunk", "1G"}, &chunk) && chunk.cumem_chunk_bytes == (1ull << 30));
  EXPECT(!parse({"--cumem-chunk", "0"}, &chunk0));
  Options props, props_bad;  // PyTorch's properties unless asked; ncclMemAlloc's one by one
  EXPECT(cumem_props_name(g.cumem_props) == "none");
  EXPECT(parse({"--cumem-props", "peers,rdma"}, &props) && props.cumem_props.rdma &&
         props.cumem_props.peer_access && !props.cumem_props.recommended);
  EXPECT(cumem_props_name(props.cumem_props) == "rdma,peers");
  EXPECT(parse({"--cumem-props", "recommended"}, &props) && props.cumem_props.recommended &&
         !props.cumem_props.rdma && !props.cumem_props.peer_access);
  EXPECT(parse({"--cumem-props", "none"}, &props) && cumem_props_name(props.cumem_props) == "none");
  for (const char* bad : {"", "rdma,", ",rdma", "fabric", "rdma,,peers", "RDMA"})
    EXPECT(!parse({"--cumem-props", bad}, &props_bad));
  EXPECT(o.contention_mode == ContentionMode::kSaturate && o.contention_ops == 12);
  EXPECT(o.repeats == 7 && o.contention_placement == "in");
  EXPECT(std::string(alloc_name(o.alloc)) == "cumem");
  EXPECT(std::string(contention_mode_name(o.contention_mode)) == "saturate");
  EXPECT(contention_placements("in") == std::vector<bool>{true});
  EXPECT(contention_placements("out") == std::vector<bool>{false});
  EXPECT((contention_placements("both") == std::vector<bool>{false, true}));
  Options bad1, bad2, bad3, bad4, bad5;
  EXPECT(!parse({"--alloc", "malloc"}, &bad1));
  Options nm;
  EXPECT(parse({"--alloc", "ncclmem"}, &nm) && nm.alloc == BufferAlloc::kNcclMem);
  EXPECT(std::string(alloc_name(nm.alloc)) == "ncclmem");
  EXPECT(path_alloc_label(PathId::kZerocta, BufferAlloc::kNcclMem) == "ncclmem");
  EXPECT(path_alloc_label(PathId::kNcclCe, BufferAlloc::kNcclMem) == "ncclMemAlloc+window");
  EXPECT(!parse({"--contention-mode", "fast"}, &bad2));
  EXPECT(!parse({"--contention-placement", "inplace"}, &bad3));
  EXPECT(!parse({"--repeats", "0"}, &bad4));
  EXPECT(!parse({"--contention-ops", "0"}, &bad5));
  // bare-ce, the floor, is always in the contention set, last.
  Options one;
  EXPECT(parse({"--contention-paths", "nccl-kernel"}, &one));
  EXPECT((one.contention_paths == std::vector<PathId>{PathId::kNcclKernel, PathId::kBareCe}));
  Options all;
  EXPECT(parse({"--contention-paths", "all"}, &all) && all.contention_paths.size() == 7);
  EXPECT(all.contention_paths[1] == PathId::kNcclPolicy &&
         all.contention_paths.back() == PathId::kBareCe);
  Options dflt;
  EXPECT(parse({"--contention"}, &dflt) && dflt.contention_paths.back() == PathId::kBareCe);
  // Processes per path and where --alloc applies.
  EXPECT(path_process_count(PathId::kNcclKernel, false, 4) == 4);
  EXPECT(path_process_count(PathId::kNcclKernel, true, 4) == 1);
  EXPECT(path_process_count(PathId::kZerocta, true, 4) == 1);
  EXPECT(path_process_count(PathId::kCeiling, false, 4) == 1);
  EXPECT(path_honours_alloc(PathId::kNcclKernel) && path_honours_alloc(PathId::kZeroctaAuto));
  EXPECT(path_honours_alloc(PathId::kNcclPolicy) && path_honours_alloc(PathId::kZeroctaPolicy));
  EXPECT(!path_honours_alloc(PathId::kNcclCe) && !path_honours_alloc(PathId::kBareCe));
  EXPECT(path_alloc_label(PathId::kZerocta, BufferAlloc::kCuMem) == "cumem");
  EXPECT(path_alloc_label(PathId::kNcclCe, BufferAlloc::kCuMem) == "ncclMemAlloc+window");
  EXPECT(path_alloc_label(PathId::kCeiling, BufferAlloc::kCuMem) == "cudamalloc (peer)");
  Options w;
  EXPECT(parse({"--worker-path", "bare-ce", "--worker-mode", "contention", "--worker-rank", "-1",
                "--worker-nranks", "2", "--worker-fds", "5,8", "--worker-repeat", "3"},
               &w));
  EXPECT(w.worker_repeat == 3 && w.worker_rank == -1);
}

void test_run_order() {
  const std::vector<PathId> p = {PathId::kNcclKernel, PathId::kZerocta, PathId::kBareCe};
  EXPECT(rotated_run_order(p, 0) == p);
  EXPECT((rotated_run_order(p, 1) ==
          std::vector<PathId>{PathId::kZerocta, PathId::kBareCe, PathId::kNcclKernel}));
  EXPECT(rotated_run_order(p, 3) == p);
  // Over n repeats every path runs once at every position.
  for (size_t pos = 0; pos < p.size(); ++pos) {
    std::vector<int> seen(p.size(), 0);
    for (int rep = 0; rep < 3; ++rep) {
      const PathId at = rotated_run_order(p, rep)[pos];
      ++seen[std::find(p.begin(), p.end(), at) - p.begin()];
    }
    EXPECT(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  }
  EXPECT(rotated_run_order({}, 2).empty());
}

// A path result of one complete in-place all-gather row on 2 ranks taking `ip_us` per op.
PathResult one_row_result(PathId p, int round, double ip_us) {
  PathResult r;
  r.path = p;
  r.round = round;
  r.status = "OK";
  r.rows.resize(1);
  RowMsg m{};
  m.bytes = 1 << 26;
  m.count = 1 << 23;
  m.oop = {ip_us, ip_us, 0, {0, 0, 0}, -1};
  m.ip = {ip_us, ip_us, 0, {0, 0, 0}, -1};
  for (int rank = 0; rank < 2; ++rank) {
    m.rank = rank;
    add_row(&r, m, 2, CollOp::kAllGather);
  }
  return r;
}

void test_rounds() {
  Options o;
  EXPECT(parse({"--rounds", "5"}, &o) && o.rounds == 5);
  Options bad;
  EXPECT(!parse({"--rounds", "0"}, &bad));
  Options dflt;
  EXPECT(parse({}, &dflt) && dflt.rounds == 1);

  // Three rounds: NCCL CE drifts from 100 to 110 us an op; zerocta is 1 % faster, 1 % slower
  // and level in the same rounds. Paired, the drift cancels.
  o.rounds = 3;
  o.paths = {PathId::kNcclCe, PathId::kZerocta};
  BenchReport rep;
  rep.o = &o;
  rep.nranks = 2;
  rep.sizes = {1 << 26};
  const double ce_us[3] = {100, 105, 110}, zc_us[3] = {99, 106.05, 110};
  for (int round = 0; round < 3; ++round) {
    rep.sweep.push_back(one_row_result(PathId::kNcclCe, round, ce_us[round]));
    rep.sweep.push_back(one_row_result(PathId::kZerocta, round, zc_us[round]));
  }
  PathId base = PathId::kNcclKernel;
  EXPECT(rounds_baseline(rep, &base) && base == PathId::kNcclCe);
  EXPECT(find_path(rep, PathId::kZerocta, 2) == &rep.sweep[5]);
  EXPECT(find_path(rep, PathId::kZerocta) == &rep.sweep[1]);  // round 0
  const RoundsCell c = rounds_cell(rep, PathId::kZerocta, base, 0, true);
  EXPECT(c.busbw.n == 3 && c.ratio.n == 3);
  EXPECT(std::fabs(c.ratio.median - 1.0) < 1e-12);
  EXPECT(std::fabs(c.ratio.max - 100.0 / 99) < 1e-12 &&
         std::fabs(c.ratio.min - 105 / 106.05) < 1e-12);
  EXPECT(c.at_least_base == 2);  // the faster round and the level one
  // A round in which the baseline did not run pairs with nothing; it stays the baseline.
  rep.sweep[0].status = "SKIPPED";
  EXPECT(rounds_baseline(rep, &base) && base == PathId::kNcclCe);
  const RoundsCell d = rounds_cell(rep, PathId::kZerocta, base, 0, true);
  EXPECT(d.busbw.n == 3 && d.ratio.n == 2 && d.at_least_base == 1);
  // Without NCCL CE the baseline is nccl-kernel; with neither there is no table.
  std::vector<PathResult> zc_only = {rep.sweep[1]};
  rep.sweep = zc_only;
  EXPECT(!rounds_baseline(rep, &base));
  rep.sweep.push_back(one_row_result(PathId::kNcclKernel, 0, 120));
  EXPECT(rounds_baseline(rep, &base) && base == PathId::kNcclKernel);
  // The JSON says which round each path result is.
  EXPECT(report_json(rep).find("\"round\": 0,") != std::string::npos);
}

void test_cumem_chunks() {
  const size_t mib = 1ull << 20;
  EXPECT((cumem_chunk_sizes(50 * mib, kCumemChunkBytes, 2 * mib) ==
          std::vector<size_t>{20 * mib, 20 * mib, 10 * mib}));
  EXPECT((cumem_chunk_sizes(41 * mib, kCumemChunkBytes, 2 * mib) ==
          std::vector<size_t>{20 * mib, 20 * mib, 2 * mib}));  // the remainder rounded up
  EXPECT((cumem_chunk_sizes(40 * mib, kCumemChunkBytes, 2 * mib) ==
          std::vector<size_t>{20 * mib, 20 * mib}));
  EXPECT(cumem_chunk_sizes(1, kCumemChunkBytes, 2 * mib) == std::vector<size_t>{2 * mib});
  EXPECT((cumem_chunk_sizes(30 * mib, kCumemChunkBytes, 3 * mib) ==
          std::vector<size_t>{21 * mib, 9 * mib}));  // the chunk rounded up too
  EXPECT(cumem_chunk_sizes(0, kCumemChunkBytes, 2 * mib).empty());
  EXPECT(kCumemChunkBytes == 20 * mib);
}

ContentionMsg contention_msg(int rank, bool in_place, double ga, double go, double aa, double ao,
                             double mk) {
  ContentionMsg m{};
  m.rank = rank;
  m.in_place = in_place;
  m.gemm_iters = 10;
  m.ag_ops = 20;
  m.covered = 1;
  m.gemm_alone_ms = ga;
  m.gemm_overlap_ms = go;
  m.ag_alone_ms = aa;
  m.ag_overlap_ms = ao;
  m.makespan_ms = mk;
  return m;
}

void test_contention_stats() {
  // Rank 1 is the worst in GEMM, rank 0 in all-gathers; each time is its worst rank's.
  std::vector<ContentionMsg> msgs = {
      contention_msg(0, false, 0.9, 1.1, 0.5, 0.6, 11.0),
      contention_msg(1, false, 1.0, 1.2, 0.4, 0.5, 12.0),
      contention_msg(0, true, 5.0, 5.0, 5.0, 5.0, 99.0),  // the other placement
      contention_msg(1, true, 5.0, 5.0, 5.0, 5.0, 99.0),
  };
  ContentionSample s;
  EXPECT(contention_sample(msgs, false, 2, &s));
  EXPECT(s.gemm_alone_ms == 1.0 && s.gemm_overlap_ms == 1.2 && s.ag_alone_ms == 0.5);
  EXPECT(s.ag_overlap_ms == 0.6 && s.makespan_ms == 12.0 && s.covered);
  EXPECT(std::fabs(s.gemm_slowdown_pct - 20.0) < 1e-9);
  EXPECT(std::fabs(s.ag_overlap_vs_alone - 1.2) < 1e-9);
  // sum = 10 x 1.0 + 20 x 0.5 = 20, max = 10: a 12 ms makespan gains 8 of the possible 10.
  EXPECT(std::fabs(s.sum_alone_ms - 20.0) < 1e-9 && std::fabs(s.max_alone_ms - 10.0) < 1e-9);
  EXPECT(std::fabs(s.gain_share - 0.8) < 1e-9);
  EXPECT(contention_sample(msgs, true, 2, &s) && s.makespan_ms == 99.0);
  std::vector<ContentionMsg> missing = {msgs[0]};
  EXPECT(!contention_sample(missing, false, 2, &s));
  std::vector<ContentionMsg> twice = {msgs[0], msgs[0]};
  EXPECT(!contention_sample(twice, false, 2, &s));
  // Serial execution gains nothing; the sum is the makespan.
  std::vector<ContentionMsg> serial = {contention_msg(0, false, 1.0, 1.0, 0.5, 0.5, 20.0)};
  EXPECT(contention_sample(serial, false, 1, &s) && std::fabs(s.gain_share) < 1e-9);

  Spread sp = spread_of({3, 1, NAN, 2});
  EXPECT(sp.n == 3 && sp.median == 2 && sp.min == 1 && sp.max == 3);
  sp = spread_of({4, 1, 3, 2});
  EXPECT(sp.n == 4 && sp.median == 2.5);
  sp = spread_of({});
  EXPECT(sp.n == 0 && std::isnan(sp.median));
  EXPECT(contention_metrics().size() == 10);
  EXPECT(std::string(contention_metrics().back().key) == "gain_share");

  // A path's status over its runs; samples only from the OK ones.
  ContentionResult r;
  r.path = PathId::kZerocta;
  EXPECT(r.status() == "NOT RUN");
  for (int rep = 0; rep < 3; ++rep) {
    r.runs.emplace_back();
    r.runs.back().repeat = rep;
    r.runs.back().status = "OK";
    r.runs.back().msgs = {msgs[0], msgs[1]};
  }
  EXPECT(r.status() == "OK" && r.runs_ok() == 3 && r.samples(false, 2).size() == 3);
  EXPECT(r.samples(true, 2).empty());  // no in-place messages in these runs
  r.runs[1].status = "FAILED";
  r.runs[1].error = "rank 1: boom";
  EXPECT(r.status() == "FAILED" && r.runs_ok() == 2 && r.samples(false, 2).size() == 2);
  EXPECT(r.first_error() == "repeat 2: rank 1: boom");
  r.runs[1].status = "SKIPPED";  // the deadline: fewer samples, not a failure
  EXPECT(r.status() == "OK" && r.runs_ok() == 2);
  for (ContentionRun& run : r.runs) run.status = "SKIPPED";
  EXPECT(r.status() == "SKIPPED" && r.samples(false, 2).empty());
}

void test_telemetry() {
  GpuTelemetry t = parse_gpu_telemetry("0, 1980, 2619, 412.35, 51\n1, 1755, 2619, [N/A], 58\n");
  EXPECT(t.available && t.gpus.size() == 2);
  EXPECT(t.gpus[0].index == 0 && t.gpus[0].sm_mhz == 1980 && t.gpus[0].power_w == 412.35);
  EXPECT(t.gpus[1].temp_c == 58 && std::isnan(t.gpus[1].power_w));
  EXPECT(!parse_gpu_telemetry("").available);
  EXPECT(!parse_gpu_telemetry("NVIDIA-SMI has failed\n").available);
  EXPECT(!parse_gpu_telemetry("0, 1980, 2619\n").available);
  GpuTelemetry none;
  EXPECT(format_telemetry(none, none) == "unavailable");
  const std::string line = format_telemetry(t, t);
  EXPECT(line.find("GPU0 1980/2619 MHz 412 W 51 C -> 1980/2619 MHz 412 W 51 C") == 0);
  EXPECT(line.find("GPU1 1755/2619 MHz ? W 58 C") != std::string::npos);
  EXPECT(std::string(kTelemetryQuery).find("clocks.sm,clocks.mem,power.draw,temperature.gpu") !=
         std::string::npos);
}

// NCCL 2.28's window registration without a GPU: outside a group the call fills the window at
// once; inside one it only queues the caller's pointer, and ncclGroupEnd writes the window
// through it (src/group.cc, ncclCommGroupRegisterSymmetric).
struct FakeNccl {
  int depth = 0, starts = 0, calls = 0;
  std::vector<std::pair<ncclWindow_t*, ncclWindow_t>> queued;
} g_nccl;

ncclWindow_t fake_window(ncclComm_t comm) { return reinterpret_cast<ncclWindow_t>(comm); }

ncclResult_t fake_group_start() {
  ++g_nccl.depth;
  ++g_nccl.starts;
  return ncclSuccess;
}
ncclResult_t fake_register(ncclComm_t comm, void*, size_t, ncclWindow_t* win, int flags) {
  ++g_nccl.calls;
  if (flags != NCCL_WIN_COLL_SYMMETRIC) return ncclInvalidArgument;
  if (g_nccl.depth == 0)
    *win = fake_window(comm);
  else
    g_nccl.queued.emplace_back(win, fake_window(comm));
  return ncclSuccess;
}
ncclResult_t fake_group_end() {
  if (--g_nccl.depth == 0)
    for (const auto& q : g_nccl.queued) *q.first = q.second;
  g_nccl.queued.clear();
  return ncclSuccess;
}

void test_window_registration() {
  const WindowCalls fake = {fake_group_start, fake_register, fake_group_end};
  char mem[2];
  std::vector<ncclComm_t> comms = {reinterpret_cast<ncclComm_t>(0x1000),
                                   reinterpret_cast<ncclComm_t>(0x2000)};
  // --one-process: both in one group, and each window lands in its own slot after it.
  std::vector<ncclWindow_t> wins = register_windows(fake, comms, {&mem[0], &mem[1]}, 1 << 20);
  EXPECT(g_nccl.starts == 1 && g_nccl.calls == 2 && g_nccl.depth == 0);
  EXPECT(wins.size() == 2 && wins[0] == fake_window(comms[0]) && wins[1] == fake_window(comms[1]));
  // One rank per process: the plain call, no group.
  g_nccl = FakeNccl();
  wins = register_windows(fake, {comms[1]}, {&mem[1]}, 1 << 20);
  EXPECT(g_nccl.starts == 0 && g_nccl.calls == 1);
  EXPECT(wins.size() == 1 && wins[0] == fake_window(comms[1]));
}

// The ceiling's per-op barrier: no thread passes round r before every thread has written r,
// and none writes r+1 before every thread has read round r's values.
void test_spin_barrier() {
  constexpr int kThreads = 4, kRounds = 3000;
  SpinBarrier barrier(kThreads);
  std::vector<std::atomic<int>> slot(kThreads);
  for (std::atomic<int>& v : slot) v = -1;
  std::atomic<int> torn{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        slot[t].store(r, std::memory_order_relaxed);
        barrier.wait();
        for (const std::atomic<int>& v : slot)
          if (v.load(std::memory_order_relaxed) != r) torn.fetch_add(1);
        barrier.wait();
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT(torn.load() == 0);
}

}  // namespace

namespace {

// --redop premul and premul-dev: reduce-scatters only, their names in the columns, and no
// sum-kernel path (it launches the kernel with one scale for every rank).
void test_premul_options() {
  Options p, d;
  EXPECT(parse({"--op", "reducescatter", "--redop", "premul"}, &p));
  EXPECT(p.reduction() == RedOp::kPreMul && std::string(p.redop_label()) == "premul");
  EXPECT(parse({"--redop=premul-dev", "--op=reducescatter", "--paths", "all"}, &d));
  EXPECT(d.reduction() == RedOp::kPreMulDev && std::string(d.redop_label()) == "premul-dev");
  EXPECT(d.paths.size() == 6 &&
         std::find(d.paths.begin(), d.paths.end(), PathId::kSumKernel) == d.paths.end());
  EXPECT(redop_is_premul(RedOp::kPreMul) && redop_is_premul(RedOp::kPreMulDev) &&
         !redop_is_premul(RedOp::kAvg) && !redop_is_premul(RedOp::kSum));
  EXPECT(std::string(redop_reference_name(RedOp::kPreMulDev)).find("scalar") != std::string::npos);
  std::string err;
  Options b1, b2, b3;
  EXPECT(
      !parse({"--op", "reducescatter", "--redop", "premul", "--paths", "sum-kernel"}, &b1, &err) &&
      err.find("does not apply to --op reducescatter --redop premul") != std::string::npos);
  EXPECT(!parse({"--op", "allreduce", "--redop", "premul-dev"}, &b2, &err) &&
         err.find("--redop premul-dev applies to --op reducescatter") != std::string::npos);
  EXPECT(!parse({"--op", "reducescatter", "--redop", "premulsum"}, &b3, &err) &&
         err.find("premul-dev") != std::string::npos);
}

// Rank r of n: (r + 1) / (n + 1) rounded to float, then to the type.
void test_premul_scalars() {
  EXPECT(premul_scalar_bits(ncclFloat32, 0, 2) == 0x3EAAAAABu);  // 1/3
  EXPECT(premul_scalar_bits(ncclFloat32, 1, 2) == 0x3F2AAAABu);  // 2/3
  EXPECT(premul_scalar_bits(ncclFloat32, 2, 3) == 0x3F400000u);  // 3/4, exact
  EXPECT(premul_scalar_bits(ncclFloat16, 0, 2) == 0x3555u);
  EXPECT(premul_scalar_bits(ncclFloat16, 1, 2) == 0x3955u);
  EXPECT(premul_scalar_bits(ncclBfloat16, 0, 2) == 0x3EABu);
  EXPECT(premul_scalar_bits(ncclBfloat16, 1, 2) == 0x3F2Bu);
}

// A stand-in for NCCL's two calls: what they were given, and the scalar's bytes as they were
// during the create call (a host scalar must not be needed after it).
struct PreMulLog {
  int creates = 0, destroys = 0;
  void* scalar = nullptr;
  unsigned char bytes[4] = {};
  ncclDataType_t type = ncclFloat32;
  ncclScalarResidence_t residence = ncclScalarDevice;
  ncclComm_t comm = nullptr;
  ncclRedOp_t destroyed = ncclSum;
};
PreMulLog g_premul;
constexpr ncclRedOp_t kFakePreMulOp = static_cast<ncclRedOp_t>(ncclNumOps + 3);
ncclResult_t fake_premul_create(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                ncclScalarResidence_t residence, ncclComm_t comm) {
  ++g_premul.creates;
  g_premul.scalar = scalar;
  if (residence == ncclScalarHostImmediate)
    memcpy(g_premul.bytes, scalar, type == ncclFloat32 ? 4 : 2);
  g_premul.type = type;
  g_premul.residence = residence;
  g_premul.comm = comm;
  *op = kFakePreMulOp;
  return ncclSuccess;
}
ncclResult_t fake_premul_destroy(ncclRedOp_t op, ncclComm_t comm) {
  ++g_premul.destroys;
  g_premul.destroyed = op;
  EXPECT(comm == g_premul.comm);
  return ncclSuccess;
}

// CallRedOp: sum and avg make nothing; premul makes the op with this rank's scalar from the
// host, premul-dev with the device pointer, and either is destroyed when the call's scope ends.
void test_premul_call_lifetime() {
  const PreMulCalls fake = {fake_premul_create, fake_premul_destroy};
  ncclComm_t comm = reinterpret_cast<ncclComm_t>(&g_premul);  // never dereferenced
  {
    const CallRedOp sum(fake, RedOp::kSum, ncclFloat32, 0, 2, comm, nullptr);
    const CallRedOp avg(fake, RedOp::kAvg, ncclFloat32, 0, 2, comm, nullptr);
    EXPECT(sum.get() == ncclSum && avg.get() == ncclAvg);
  }
  EXPECT(g_premul.creates == 0 && g_premul.destroys == 0);
  {
    const CallRedOp host(fake, RedOp::kPreMul, ncclFloat16, 1, 2, comm, nullptr);
    EXPECT(host.get() == kFakePreMulOp && g_premul.creates == 1 && g_premul.destroys == 0);
    EXPECT(g_premul.residence == ncclScalarHostImmediate && g_premul.type == ncclFloat16);
    uint16_t bits = 0;
    memcpy(&bits, g_premul.bytes, sizeof bits);
    EXPECT(bits == premul_scalar_bits(ncclFloat16, 1, 2));
  }
  EXPECT(g_premul.destroys == 1 && g_premul.destroyed == kFakePreMulOp);
  int device_slot = 0;  // stands for the device memory: only its address is passed
  {
    const CallRedOp dev(fake, RedOp::kPreMulDev, ncclBfloat16, 0, 2, comm, &device_slot);
    EXPECT(g_premul.residence == ncclScalarDevice && g_premul.scalar == &device_slot);
  }
  EXPECT(g_premul.creates == 2 && g_premul.destroys == 2);
}

}  // namespace

// --op reducescatter: data types, reductions, the floors' paths, contention, the workers'
// ZEROCTA_REDUCESCATTER, the redop and maxdiff columns and the JSON fields.
void test_reduce_scatter() {
  Options d;
  EXPECT(parse({"--op", "reducescatter"}, &d));
  EXPECT(d.redop == RedOp::kSum && d.dtype.nccl == ncclFloat32 && d.rs_ctas == 16);
  EXPECT(std::string(d.redop_label()) == "sum" && d.reduction() == RedOp::kSum);
  EXPECT(d.paths.size() == 3);  // the default is still the policy comparison
  Options a;
  EXPECT(
      parse({"--dtype", "bf16", "--redop", "avg", "--rs-ctas", "8", "--op", "reducescatter"}, &a));
  EXPECT(a.dtype.nccl == ncclBfloat16 && std::string(a.dtype.name) == "bf16");
  EXPECT(a.redop == RedOp::kAvg && a.reduction() == RedOp::kAvg && a.rs_ctas == 8);
  EXPECT(std::string(a.redop_label()) == "avg");
  Options h;
  EXPECT(parse({"--op=reducescatter", "--dtype=half"}, &h) && h.dtype.nccl == ncclFloat16);
  std::string err;
  Options b1, b2, b3, b4, b5, b6;
  EXPECT(!parse({"--op", "reducescatter", "--dtype", "int32"}, &b1, &err) &&
         err.find("float, bf16 or half") != std::string::npos);
  EXPECT(!parse({"--redop", "avg"}, &b2, &err) && err.find("reducescatter") != std::string::npos);
  EXPECT(!parse({"--op", "reducescatter", "--redop", "max"}, &b3));
  EXPECT(!parse({"--op", "reducescatter", "--rs-ctas", "0"}, &b4));
  EXPECT(!parse({"--paths", "sum-kernel"}, &b5, &err) &&  // all-gathers have no sum-kernel
         err.find("does not apply") != std::string::npos);
  EXPECT(!parse({"--op", "reducescatter", "--paths", "ceiling"}, &b6));
  Options allop;  // all-reduces keep summing, whatever --redop says by default
  EXPECT(parse({"--op", "allreduce"}, &allop) && allop.reduction() == RedOp::kSum &&
         std::string(allop.redop_label()) == "sum");
  Options bc;
  EXPECT(parse({"--op", "broadcast"}, &bc) && std::string(bc.redop_label()) == "none");

  // Paths: every one, the floors last; bare-ce and sum-kernel run in one process.
  Options all;
  EXPECT(parse({"--paths", "all", "--op", "reducescatter"}, &all));
  EXPECT(all.paths.size() == 7 && all.paths[3] == PathId::kZerocta &&
         all.paths[4] == PathId::kZeroctaAuto && all.paths[5] == PathId::kBareCe &&
         all.paths[6] == PathId::kSumKernel);
  Options floors;
  EXPECT(parse({"--op", "reducescatter", "--paths", "sum-kernel,bare-ce,zerocta,nccl-kernel"},
               &floors));
  EXPECT(floors.paths == std::vector<PathId>({PathId::kNcclKernel, PathId::kZerocta,
                                              PathId::kBareCe, PathId::kSumKernel}));
  EXPECT(std::string(path_name(PathId::kSumKernel)) == "sum-kernel");
  PathId id;
  EXPECT(parse_path_name("sum-kernel", &id) && id == PathId::kSumKernel);
  EXPECT(path_is_single_process(PathId::kSumKernel) && !path_runs_nccl(PathId::kSumKernel));
  EXPECT(path_process_count(PathId::kSumKernel, false, 4) == 1);
  EXPECT(!path_honours_alloc(PathId::kSumKernel) && !path_uses_shim(PathId::kSumKernel));
  EXPECT(path_alloc_label(PathId::kSumKernel, BufferAlloc::kCuMem) == "cudamalloc (one GPU)");
  EXPECT(path_routes_op(PathId::kZerocta, CollOp::kReduceScatter) &&
         path_routes_op(PathId::kZeroctaAuto, CollOp::kAllGather) &&
         !path_routes_op(PathId::kZerocta, CollOp::kAllReduce) &&
         !path_routes_op(PathId::kZeroctaPolicy, CollOp::kReduceScatter));
  EXPECT(std::string(path_reducescatter_mode(PathId::kZerocta)) == "zerocta" &&
         std::string(path_reducescatter_mode(PathId::kZeroctaAuto)) == "auto" &&
         std::string(path_reducescatter_mode(PathId::kZeroctaPolicy)) == "nccl" &&
         path_reducescatter_mode(PathId::kNcclKernel) == nullptr);

  // Contention: nccl-kernel, zerocta and the floor by default; nccl-ce does not apply; the op
  // and its size follow --op (the total input, 256 MiB per rank by default).
  Options c;
  EXPECT(parse({"--contention", "--op", "reducescatter"}, &c));
  EXPECT(c.contention_op() == CollOp::kReduceScatter &&
         c.contention_paths ==
             std::vector<PathId>({PathId::kNcclKernel, PathId::kZerocta, PathId::kBareCe}));
  EXPECT(c.contention_total_bytes(2) == (512ull << 20));
  Options c2;  // the list before --op: resolved once the op is known
  EXPECT(parse({"--contention-paths", "zerocta-auto,nccl-kernel", "--op", "reducescatter"}, &c2));
  EXPECT(c2.contention_paths ==
         std::vector<PathId>({PathId::kNcclKernel, PathId::kZeroctaAuto, PathId::kBareCe}));
  Options c3, c4;
  EXPECT(!parse({"--op", "reducescatter", "--contention-paths", "nccl-ce"}, &c3, &err) &&
         err.find("nccl-ce") != std::string::npos);
  EXPECT(parse({"--contention-paths", "all", "--op", "reducescatter"}, &c4) &&
         c4.contention_paths.size() == 6);
  Options ag;
  EXPECT(parse({"--contention"}, &ag) && ag.contention_op() == CollOp::kAllGather &&
         ag.contention_paths.size() == 4 && ag.contention_paths[1] == PathId::kNcclCe);

  // The workers' environment: ZEROCTA_REDUCESCATTER beside ZEROCTA_ALLGATHER, for
  // reduce-scatters only.
  const std::vector<std::string> base = {"PATH=/bin", "ZEROCTA_REDUCESCATTER=off"};
  std::vector<std::string> z =
      worker_environment(base, PathId::kZerocta, "/l.so", false, CollOp::kReduceScatter);
  EXPECT(has(z, "ZEROCTA_REDUCESCATTER=zerocta") && !has(z, "ZEROCTA_REDUCESCATTER=off") &&
         has(z, "ZEROCTA_ALLGATHER=zerocta"));
  std::vector<std::string> za =
      worker_environment(base, PathId::kZeroctaAuto, "/l.so", false, CollOp::kReduceScatter);
  EXPECT(has(za, "ZEROCTA_REDUCESCATTER=auto"));
  std::vector<std::string> zp =
      worker_environment(base, PathId::kZeroctaPolicy, "/l.so", false, CollOp::kReduceScatter);
  EXPECT(has(zp, "ZEROCTA_REDUCESCATTER=nccl"));
  std::vector<std::string> zag = worker_environment(base, PathId::kZerocta, "/l.so", false);
  EXPECT(has(zag, "ZEROCTA_REDUCESCATTER=off"));  // all-gathers: the caller's, untouched
  std::vector<std::string> k =
      worker_environment(base, PathId::kNcclKernel, "/l.so", false, CollOp::kReduceScatter);
  EXPECT(!has_prefix(k, "LD_PRELOAD=") && has(k, "ZEROCTA_REDUCESCATTER=off"));

  // Rows: maxdiff is the max over ranks, -1 (N/A) when a rank has none; the redop and
  // maxdiff columns; the JSON's per-row and per-placement maxdiff and the options.
  PathResult r;
  r.path = PathId::kZerocta;
  r.status = "OK";
  r.rows.resize(1);
  RowMsg m{};
  m.bytes = 1 << 20;
  m.count = 1 << 17;
  m.oop = {100.0, 90.0, 0, {0, 26, 0}, 1.5e-7};
  m.ip = {80.0, 70.0, 0, {0, 26, 0}, 2.5e-7};
  EXPECT(!add_row(&r, m, 2, CollOp::kReduceScatter));
  m.rank = 1;
  m.oop.maxdiff = 3.0e-7;
  EXPECT(add_row(&r, m, 2, CollOp::kReduceScatter));
  const RowAgg& row = r.rows[0];
  EXPECT(row.oop.maxdiff == 3.0e-7 && row.ip.maxdiff == 2.5e-7 && row.maxdiff() == 3.0e-7);
  EXPECT(std::fabs(row.oop.busbw - (1 << 20) / 100e3 / 2) < 1e-9);  // size = input, (n-1)/n
  const std::string line = format_row(row, CollOp::kReduceScatter, "bf16", true, "avg");
  EXPECT(line.find("  bf16     avg  ") != std::string::npos);
  EXPECT(line.find("   3.00e-07      0.000  ce") != std::string::npos);
  EXPECT(format_row(row, CollOp::kAllGather, "float", false).find("e-07") == std::string::npos);
  RowAgg none = row;
  none.oop.maxdiff = none.ip.maxdiff = -1;
  EXPECT(format_row(none, CollOp::kReduceScatter, "float", false, "sum").find("  N/A") !=
         std::string::npos);
  PlaceResult one{1, 1, 0, {0, 0, 0}, 1e-3}, missing{1, 1, -1, {0, 0, 0}, -1};
  PathResult r2;
  r2.rows.resize(1);
  RowMsg m2{};
  m2.oop = one;
  m2.ip = one;
  add_row(&r2, m2, 2, CollOp::kReduceScatter);
  m2.rank = 1;
  m2.oop = missing;
  add_row(&r2, m2, 2, CollOp::kReduceScatter);
  EXPECT(r2.rows[0].oop.maxdiff == -1 && r2.rows[0].ip.maxdiff == 1e-3);

  BenchReport rep;
  rep.o = &a;
  rep.nranks = 2;
  rep.sizes = {1 << 20};
  rep.sweep.push_back(r);
  std::string flat = report_json(rep);
  flat.erase(
      std::remove_if(flat.begin(), flat.end(), [](char ch) { return ch == ' ' || ch == '\n'; }),
      flat.end());
  EXPECT(flat.find("\"op\":\"reducescatter\",\"redop\":\"avg\",\"rs_ctas\":8,") !=
         std::string::npos);
  EXPECT(flat.find("\"dtype\":\"bf16\"") != std::string::npos);
  EXPECT(flat.find("\"zerocta_reducescatter\":\"zerocta\"") != std::string::npos);
  EXPECT(flat.find("\"type\":\"bf16\",\"redop\":\"avg\",\"maxdiff\":3e-07") != std::string::npos);
  EXPECT(flat.find("\"wrong\":0,\"maxdiff\":2.5e-07") != std::string::npos);
  rep.o = &ag;  // all-gathers: no maxdiff, no zerocta_reducescatter
  const std::string agj = report_json(rep);
  EXPECT(agj.find("maxdiff") == std::string::npos &&
         agj.find("zerocta_reducescatter") == std::string::npos);
}

int run_self_test() {
  test_sizes();
  test_options();
  test_op_options();
  test_shapes();
  test_reduce_pattern();
  test_init_and_ratios();
  test_bandwidth_and_rows();
  test_environment();
  test_help_lists_every_path();
  test_gpu_count();
  test_json_and_misc();
  test_new_options();
  test_run_order();
  test_rounds();
  test_cumem_chunks();
  test_contention_stats();
  test_telemetry();
  test_window_registration();
  test_spin_barrier();
  test_reduce_scatter();
  test_premul_options();
  test_premul_scalars();
  test_premul_call_lifetime();
  printf("zerocta-bench self-test: %d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? kExitOk : kExitFailed;
}

}  // namespace zcb
