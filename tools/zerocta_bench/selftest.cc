// --self-test: CPU checks of everything in the bench that can be wrong without a GPU: option
// parsing, sizes, bandwidth math, aggregation over ranks, route tags, the workers' environment,
// the JSON writer. Prints "N passed, M failed" and exits non-zero on any failure.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "contention.h"
#include "json_writer.h"
#include "launcher.h"
#include "options.h"
#include "report.h"
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
  // Canonical run order, whatever order the list had.
  EXPECT(o.paths.size() == 2 && o.paths[0] == PathId::kNcclKernel &&
         o.paths[1] == PathId::kZerocta);
  EXPECT(o.json_path == "x.json");

  Options q;
  EXPECT(parse({"-n", "9", "--quick"}, &q));  // explicit flags beat the preset in any order
  EXPECT(q.quick && q.iters == 9 && q.max_bytes == (64ull << 20) && q.gemm_m == 4096);

  Options all;
  EXPECT(parse({"--paths", "all"}, &all) && all.paths.size() == 5);
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

void test_bandwidth_and_rows() {
  double alg = 0, bus = 0;
  all_gather_bw(1000000000ull, 1000000.0, 4, &alg, &bus);  // 1 GB in 1 s
  EXPECT(std::fabs(alg - 1.0) < 1e-12 && std::fabs(bus - 0.75) < 1e-12);

  PathResult r;
  r.path = PathId::kZerocta;
  r.rows.resize(2);
  RowMsg a{}, b{};
  a.rank = 0;
  a.size_index = 1;
  a.bytes = 1 << 20;
  a.count = 1 << 17;
  a.oop = {100.0, 90.0, 0, {0, 26, 0, 0}};
  a.ip = {80.0, 70.0, 2, {0, 26, 0, 0}};
  b = a;
  b.rank = 1;
  b.oop = {120.0, 80.0, 0, {1, 25, 0, 0}};
  b.ip = {60.0, 75.0, -1, {0, 26, 0, 0}};
  EXPECT(!add_row(&r, a, 2));
  EXPECT(!r.complete(1, 2));
  EXPECT(add_row(&r, b, 2));
  const RowAgg& row = r.rows[1];
  EXPECT(row.oop.time_us == 120.0 && row.oop.median_us == 90.0);  // max over ranks
  EXPECT(row.ip.time_us == 80.0 && row.ip.median_us == 75.0);
  EXPECT(row.oop.wrong == 0 && row.ip.wrong == -1);  // one unchecked rank: not checked
  EXPECT(row.oop.routes[zerocta_route_ce] == 51 && row.oop.routes[zerocta_route_passthrough] == 1);
  EXPECT(r.non_ce_calls() == 1);
  EXPECT(std::fabs(row.oop.busbw - (1 << 20) / 120e3 / 2) < 1e-9);
  EXPECT(route_tag(row.ip.routes) == "ce");
  EXPECT(route_tag(row.oop.routes) == "passthrough:1,ce:51");
  const uint64_t zero[zerocta_route_count] = {};
  EXPECT(route_tag(zero) == "-");
  std::string line = format_row(row, "float", true);
  EXPECT(line.find("1048576") == 0 || line.find(" 1048576 ") != std::string::npos);
  EXPECT(line.find("N/A") != std::string::npos &&
         line.find("passthrough:1,ce:51|ce") != std::string::npos);
  EXPECT(r.wrong_total() == 0);
  RowMsg bad = a;
  bad.size_index = 7;  // out of range: ignored, not a crash
  EXPECT(!add_row(&r, bad, 2));

  ContentionResult c;
  ContentionMsg m{};
  m.gemm_alone_ms = 1.0;
  m.gemm_overlap_ms = 1.3;
  m.covered = 1;
  add_contention(&c, m);
  m.gemm_alone_ms = 1.1;
  m.gemm_overlap_ms = 1.21;
  add_contention(&c, m);
  EXPECT(std::fabs(c.slowdown_pct() - (1.3 / 1.1 - 1) * 100) < 1e-9 && c.covered());
}

void test_environment() {
  std::vector<std::string> base = {"PATH=/bin", "LD_PRELOAD=/x/libzerocta.so:/y/libother.so",
                                   "NCCL_NVLS_ENABLE=1", "ZEROCTA_LOG=info"};
  std::vector<std::string> k = worker_environment(base, PathId::kNcclKernel, "/b/libzerocta.so");
  EXPECT(has(k, "LD_PRELOAD=/y/libother.so"));  // the shim stripped from a no-shim path
  EXPECT(has(k, "NCCL_NVLS_ENABLE=0") && !has(k, "NCCL_NVLS_ENABLE=1"));
  EXPECT(has(k, "TORCH_SYMM_MEM_DISABLE_MULTICAST=1") && has(k, "PATH=/bin"));
  EXPECT(!has_prefix(k, "ZEROCTA_ALLGATHER="));
  std::vector<std::string> z = worker_environment(base, PathId::kZerocta, "/b/libzerocta.so");
  EXPECT(has(z, "LD_PRELOAD=/b/libzerocta.so:/y/libother.so"));  // prepended, never twice
  EXPECT(has(z, "ZEROCTA_ALLGATHER=zerocta") && has(z, "ZEROCTA_LOG=info"));
  std::vector<std::string> za = worker_environment({"A=1"}, PathId::kZeroctaAuto, "/l.so");
  EXPECT(has(za, "LD_PRELOAD=/l.so") && has(za, "ZEROCTA_ALLGATHER=auto"));
  std::vector<std::string> c =
      worker_environment({"LD_PRELOAD=libzerocta.so"}, PathId::kCeiling, "/l.so");
  EXPECT(!has_prefix(c, "LD_PRELOAD="));
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

}  // namespace

int run_self_test() {
  test_sizes();
  test_options();
  test_bandwidth_and_rows();
  test_environment();
  test_json_and_misc();
  printf("zerocta-bench self-test: %d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? kExitOk : kExitFailed;
}

}  // namespace zcb
