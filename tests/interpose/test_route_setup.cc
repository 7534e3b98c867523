// The copy-engine route's set-up (src/comms/route_setup.h: join, freeze, prepare, teardown) against
// the hazards it was rebuilt for, on the CPU: drivers/drv_route.cc under LD_PRELOAD of the
// shim, the fake NCCL (cross-process rendezvous, non-blocking model) and the fake CUDA driver
// with FAKE_CUDA_CE=1 (memfd-backed memory really shared between processes, copies run at
// once, FAKE_CUDA_WAIT_MS: a wait polls the flag a peer process writes, so a CE all-gather on
// two ranks moves real data and a route that diverged between ranks shows as "not_satisfied").
// The driver's all-gather buffers are cuMem allocations that a peer process imports, as the
// route requires; DRV_AG_MEM=host gives a rank buffers that no peer can reach.
//
// Every test gets its own channel directory (ZEROCTA_CHANNEL_DIR), rendezvous directory and
// unique id. Ranks are fork()ed by the driver and report as r<K>.<key>; the shim's log lines
// are told apart by pid.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm_key.h"
#include "harness.h"
#include "route_run.h"

namespace itest {
namespace {

// The decision lines ("route: rank ...") of one process.
std::vector<std::string> decisions(const RunResult& r, const std::string& pid) {
  std::vector<std::string> out;
  for (const std::string& line : shim_lines(r, pid, "INFO"))
    if (contains(line, "zerocta INFO route: rank ")) out.push_back(line);
  return out;
}

// Fake CUDA lines of one process for one entry point that succeeded.
// Integer count of the fake CUDA's lines for `fn` of process `pid` that succeeded and hold
// `needle` (an argument's value).
int cuda_calls_with(const RunResult& r, const std::string& fn, const std::string& pid,
                    const std::string& needle) {
  int n = 0;
  for (const std::string& line : r.log_lines())
    if (line.rfind("cuda " + fn + " ", 0) == 0 && contains(line, " pid=" + pid + " -> 0") &&
        contains(line, needle))
      ++n;
  return n;
}

int cuda_calls(const RunResult& r, const std::string& fn, const std::string& pid) {
  int n = 0;
  for (const std::string& line : r.log_lines())
    if (line.rfind("cuda " + fn + " ", 0) == 0 && contains(line, " pid=" + pid + " -> 0")) ++n;
  return n;
}

// The same, made by the application's threads only: not by the shim's housekeeping thread
// (housekeeping.h), whose calls the fake tags " thread=zerocta-hk".
int app_cuda_calls(const RunResult& r, const std::string& fn, const std::string& pid) {
  int n = 0;
  for (const std::string& line : r.log_lines())
    if (line.rfind("cuda " + fn + " ", 0) == 0 && contains(line, " pid=" + pid + " -> 0") &&
        !contains(line, " thread=zerocta-hk "))
      ++n;
  return n;
}

// Lines of the fake CUDA of one process for one entry point, whatever they returned.
int cuda_lines(const RunResult& r, const std::string& fn, const std::string& pid) {
  int n = 0;
  for (const std::string& line : r.log_lines())
    if (line.rfind("cuda " + fn + " ", 0) == 0 && contains(line, " pid=" + pid + " -> ")) ++n;
  return n;
}

int waits_not_satisfied(const RunResult& r) {
  int n = 0;
  for (const std::string& line : r.log_lines())
    if (line.rfind("cuda cuStreamWaitValue32 ", 0) == 0 && contains(line, " not_satisfied")) ++n;
  return n;
}

const std::vector<std::string> kCollectives = {
    "ncclAllGather", "ncclAllReduce", "ncclBroadcast", "ncclReduceScatter",
    "ncclReduce",    "ncclSend",      "ncclRecv",      "ncclAlltoAll",
    "ncclGather",    "ncclScatter",   "ncclBcast",     "ncclGroupEnd:launch"};

int nccl_collective_lines(const RunResult& r) {
  int n = 0;
  for (const std::string& line : r.log_lines()) {
    const std::string fn = log_fields(line)["fn"];
    if (std::find(kCollectives.begin(), kCollectives.end(), fn) != kCollectives.end()) ++n;
  }
  return n;
}

// Both ranks ran to the end, nothing left in the channel directory.
constexpr char kEngaged[] = "zero-copy all-gather engaged";

// How the two ranks of one routed op, in two processes, reached each other's buffers
// (op_exchange.h). The later rank always writes its chunk into the earlier one's receive
// buffer; when it does both it also reads the earlier one's send buffer; when each pushes, the
// earlier one writes into the later one's receive buffer. Every buffer is an allocation of its
// own (drv_route), so the imports per rank are (2, 0) or (0, 2) when the later rank does both
// and (1, 1) when each pushes; anything else is neither mode. Every import is of an allocation
// its owner exported, and each rank copies its own chunk once plus once per import.
void expect_pair_imports(const RunResult& r, int imports[2] = nullptr) {
  int in[2], ex[2], copies[2];
  for (int k = 0; k < 2; ++k) {
    const std::string pid = pid_of(r, k);
    in[k] = cuda_calls(r, "cuMemImportFromShareableHandle", pid);
    ex[k] = cuda_calls(r, "cuMemExportToShareableHandle", pid);
    copies[k] = cuda_calls(r, "cuMemcpyAsync", pid);
    if (imports) imports[k] = in[k];
  }
  const bool later_does_both = (in[0] == 2 && in[1] == 0) || (in[0] == 0 && in[1] == 2);
  const bool each_pushes = in[0] == 1 && in[1] == 1;
  EXPECT_TRUE(later_does_both || each_pushes)
      << "imports " << in[0] << " and " << in[1] << ": neither \"later does both\" nor \"each "
      << "pushes\"\n"
      << r.describe();
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_GE(ex[k], in[1 - k]) << "the peer imported an allocation this rank never exported";
    EXPECT_LE(ex[k], 2) << "an allocation exported twice";
    EXPECT_EQ(copies[k], 1 + in[k]) << r.describe();
  }
}

// Rank k's all-gathers: none failed, `ops` of them took the route, and every output was right.
void expect_rank_routed(const RunResult& r, int k, long long ops) {
  EXPECT_EQ(rnum(r, k, "ag.rc"), 0) << r.describe();
  EXPECT_EQ(rnum(r, k, "ag.ag_ce"), ops) << r.describe();
  EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1) << r.describe();
}

// The shim's own resources are gone at the end: its registration of the channel, its streams
// and events, the peers' allocations it imported (the driver freed its own).
void expect_nothing_left(const RunResult& r, int k) {
  SCOPED_TRACE("rank " + std::to_string(k));
  EXPECT_EQ(rnum(r, k, "end.pool_bytes"), 0);
  for (const char* kind : {"alloc", "reserve", "map", "stream", "event", "hostreg"})
    EXPECT_EQ(rnum(r, k, std::string("end.live_") + kind), 0) << kind << " left in the driver";
}

// A rank's ZEROCTA_STATS file written as <scratch>/stats-<pid>.json (at its teardown).
std::string stats_file(const Scratch& s, const std::string& pid) {
  std::ifstream file(s.dir() + "/stats-" + pid + ".json");
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// The number after "key": in a flat JSON text, -1 when absent.
long long json_number(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  return at == std::string::npos ? -1 : std::atoll(json.c_str() + at + key.size() + 3);
}

// The pairs a rank's ZEROCTA_STATS JSON says it settled, either way (each pushes, or it was the
// later rank and did both copies).
long long pairs_settled(const std::string& json) {
  return json_number(json, "pairs_each_pushes") + json_number(json, "pairs_later_does_both");
}

// Every rank committed and its all-gather took the route, moving real data between the two
// processes through imports of each other's buffers.
void expect_committed_pair(const RunResult& r, const std::string& ag = "ag") {
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_TRUE(any_contains(decisions(r, pid), "rank " + std::to_string(k) + "/2 dev " +
                                                    std::to_string(k) + ": " + kEngaged))
        << r.describe();
    EXPECT_EQ(warns(r, pid), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, ag + ".rc"), 0);
    EXPECT_EQ(rnum(r, k, ag + ".ag_ce"), 1);
    EXPECT_EQ(rnum(r, k, ag + ".ag_pass"), 0);
    EXPECT_EQ(rnum(r, k, ag + ".data_ok"), 1) << "the copy-engine all-gather moved wrong data";
    // The channel's op region, registered with CUDA (host memory, a few pages per rank), plus
    // the peer's allocations this rank imported (one 2 MiB granule each in the fake driver).
    const long long imported =
        2LL * (1 << 20) * cuda_calls(r, "cuMemImportFromShareableHandle", pid);
    EXPECT_GT(rnum(r, k, ag + ".pool_bytes") - imported, 0);
    EXPECT_LT(rnum(r, k, ag + ".pool_bytes") - imported, 1 << 20);
  }
  expect_pair_imports(r);
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

// Every rank passed through for a reason containing `why`, logged at INFO (and WARN if
// `warned`), and forwarded its all-gather to NCCL.
void expect_passthrough_pair(const RunResult& r, const std::string& why, bool warned) {
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_TRUE(any_contains(decisions(r, pid), "not engaged: ")) << r.describe();
    EXPECT_TRUE(any_contains(decisions(r, pid), why)) << "no decision naming \"" << why << "\"\n"
                                                      << r.describe();
    if (warned)
      EXPECT_TRUE(any_contains(warns(r, pid), why)) << r.describe();
    else
      EXPECT_EQ(warns(r, pid), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 0);
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 1);
    EXPECT_EQ(rnum(r, k, "init.ce_ready"), 0);
    EXPECT_EQ(rnum(r, k, "end.pool_bytes"), 0);
    EXPECT_EQ(rnum(r, k, "end.live_hostreg"), 0);
    EXPECT_EQ(cuda_calls(r, "cuMemcpyAsync", pid), 0) << "a copy-engine call on a pass-through";
  }
  EXPECT_EQ(static_cast<int>(log_calls(r, "ncclAllGather").size()), 2) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0);
}

// A two-rank world run with `args` (`extra` on top of the route's environment) in which both
// ranks pass through for a reason containing `why`, logged as expect_passthrough_pair says.
void expect_pair_passes_through(const std::vector<std::string>& args, const Env& extra,
                                const std::string& why, bool warned) {
  Scratch s, chan, rdv;
  RunResult r = run_route(args, with(route_env(chan, rdv, unique_id_text()), extra), s);
  expect_clean_pair(r, chan);
  expect_passthrough_pair(r, why, warned);
}

// ---- The fake CUDA driver ----

TEST(RouteSetup, FakeCudaOffersTheCopyEngineApiOnlyWithFakeCudaCe) {
  Scratch s, chan, rdv;
  Env env = route_env(chan, rdv, unique_id_text());
  // Host buffers: the driver's own cuMem calls would otherwise be in the log.
  RunResult off = run_route({"ranks", "2", "basic"},
                            with(env, {{"FAKE_CUDA_CE", "0"}, {"DRV_AG_MEM", "host"}}), s);
  expect_clean_pair(off, chan);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(decisions(off, pid_of(off, k)), std::vector<std::string>{}) << off.describe();
    EXPECT_EQ(rnum(off, k, "ag.ag_pass"), 1);
  }
  EXPECT_TRUE(contains(off.log,
                       "cuGetProcAddress symbol=cuMemHostRegister version=12000 flags=1 not_found"))
      << off.describe();
  EXPECT_FALSE(contains(off.log, "cuda cuMemCreate ")) << off.describe();
  EXPECT_FALSE(contains(off.log, "cuda cuMemHostRegister ")) << off.describe();
}

// ---- 1. The default mode makes no call of its own ----

// The fake's log without volatile parts: heap and stack addresses, config bytes (the policy
// patches them), ncclCommInitRank turned into ncclCommInitRankConfig (the policy's fresh
// config), the shim's ncclGetVersion. CUDA lines are left out (see the test of its own).
std::vector<std::string> normalized_nccl_log(const RunResult& r) {
  std::vector<std::string> out;
  for (std::string line : r.log_lines()) {
    if (line.rfind("cuda ", 0) == 0 || line.rfind("ncclGetVersion ", 0) == 0) continue;
    std::string norm;
    size_t at = 0;
    // Tokens "k=v": drop config fields, mask long hex values.
    while (at <= line.size()) {
      size_t sp = line.find(' ', at);
      if (sp == std::string::npos) sp = line.size();
      std::string tok = line.substr(at, sp - at);
      at = sp + 1;
      const size_t eq = tok.find('=');
      const std::string key = eq == std::string::npos ? "" : tok.substr(0, eq);
      if (key == "config" || key == "config_size" || key == "magic" || key == "version" ||
          key == "cta" || key == "blocking" || key == "hex")
        continue;
      if (eq != std::string::npos && tok.compare(eq + 1, 2, "0x") == 0 && tok.size() - eq - 3 >= 10)
        tok = key + "=ADDR";
      norm += (norm.empty() ? "" : " ") + tok;
    }
    if (norm.rfind("ncclCommInitRank ", 0) == 0) norm.replace(0, 16, "ncclCommInitRankConfig");
    out.push_back(norm);
  }
  return out;
}

// Lines outside [marker from, marker to).
std::vector<std::string> without_section(const std::vector<std::string>& lines,
                                         const std::string& from, const std::string& to,
                                         std::vector<std::string>* section) {
  std::vector<std::string> out;
  bool in = false;
  for (const std::string& l : lines) {
    if (l == "marker " + from) in = true;
    if (l == "marker " + to) in = false;
    (in ? *section : out).push_back(l);
  }
  return out;
}

void expect_same(const std::vector<std::string>& want, const std::vector<std::string>& got,
                 const std::string& what, const RunResult& r) {
  for (size_t i = 0; i < want.size() || i < got.size(); ++i) {
    const std::string a = i < want.size() ? want[i] : "<end of log>";
    const std::string b = i < got.size() ? got[i] : "<end of log>";
    if (a != b) {
      ADD_FAILURE() << what << ": line " << i + 1 << " differs\n  without shim: " << a
                    << "\n  with shim:    " << b << "\n"
                    << r.describe();
      return;
    }
  }
}

struct DefaultRuns {
  Scratch s0, s1, s2, chan;
  RunResult none, zero, keep;
  DefaultRuns() {
    const Env env = {{"FAKE_CUDA_CE", "1"},
                     {"FAKE_NCCL_NONBLOCKING", "1"},
                     {"FAKE_NCCL_COMM_ID", unique_id_text()},
                     {"ZEROCTA_CHANNEL_DIR", chan.dir()},
                     {"DRV_TIMEOUT_S", "20"}};
    none = run_route({"default-log"}, env, s0, /*preload=*/false);
    zero = run_route({"default-log"}, env, s1);
    keep = run_route({"default-log"}, with(env, {{"ZEROCTA_CTA_POLICY", "keep"}}), s2);
  }
};

const std::vector<std::string> kQueries = {"ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice"};
bool is_query(const std::string& line) {
  const std::string fn = log_fields(line)["fn"];
  return std::find(kQueries.begin(), kQueries.end(), fn) != kQueries.end();
}
std::vector<std::string> without_queries(std::vector<std::string> v) {
  v.erase(std::remove_if(v.begin(), v.end(), is_query), v.end());
  return v;
}

TEST(RouteSetup, DefaultModeForwardsEveryPathAsWithoutTheShim) {
  DefaultRuns d;
  ASSERT_EQ(d.none.exit_code, 0) << d.none.describe();
  ASSERT_EQ(d.zero.exit_code, 0) << d.zero.describe();
  EXPECT_EQ(d.zero.out.substr(0, d.zero.out.find("end.")),
            d.none.out.substr(0, d.none.out.find("end.")))
      << "results differ";
  // Queries are the next test's business; here everything else must match line for line.
  std::vector<std::string> initall_none, initall_zero;
  const auto base = without_section(without_queries(normalized_nccl_log(d.none)), "init-all",
                                    "split", &initall_none);
  const auto shim = without_section(without_queries(normalized_nccl_log(d.zero)), "init-all",
                                    "split", &initall_zero);
  expect_same(base, shim, "default mode (zero policy)", d.zero);
  // ncclCommInitAll is rebuilt from its parts to carry the policy (test_policy.cc): nothing else.
  for (const std::string& line : initall_zero) {
    const std::string fn = log_fields(line)["fn"];
    EXPECT_TRUE(fn == "marker" || fn == "ncclGetUniqueId" || fn == "ncclGroupStart" ||
                fn == "ncclCommInitRankConfig" || fn == "ncclGroupEnd")
        << line;
  }
}

TEST(RouteSetup, DefaultModeAsksNcclNoQueryOfItsOwn) {
  // The driver itself never calls ncclCommCount/UserRank/CuDevice. The shim may ask one thing:
  // a Split/Shrink child's size, once, at its first collective (to count all-gather bytes),
  // when the child exists for sure; never a rank or a device, never twice.
  DefaultRuns d;
  ASSERT_EQ(d.none.exit_code, 0) << d.none.describe();
  for (const RunResult* r : {&d.none, &d.zero, &d.keep}) {
    std::vector<std::string> queries;
    std::map<std::string, int> counts_per_comm;
    for (const std::string& line : r->log_lines()) {
      if (!is_query(line)) continue;
      auto f = log_fields(line);
      if (f["fn"] == "ncclCommCount" && ++counts_per_comm[f["comm"]] == 1) continue;
      queries.push_back(line);
    }
    EXPECT_EQ(queries, std::vector<std::string>{})
        << "NCCL calls of the shim's own in the default mode\n"
        << r->describe();
  }
}

TEST(RouteSetup, DefaultModeWithKeepPolicyLogIsIdentical) {
  DefaultRuns d;
  ASSERT_EQ(d.keep.exit_code, 0) << d.keep.describe();
  expect_same(without_queries(normalized_nccl_log(d.none)),
              without_queries(normalized_nccl_log(d.keep)), "default mode, keep policy", d.keep);
}

TEST(RouteSetup, DefaultModeWithKeepPolicyMakesNoCudaCall) {
  // Nothing of the shim needs the driver here: no policy to put on another device, no route.
  DefaultRuns d;
  auto cuda = [](const RunResult& r) {
    std::vector<std::string> v;
    for (const std::string& line : r.log_lines())
      if (line.rfind("cuda ", 0) == 0) v.push_back(line);
    return v;
  };
  expect_same(cuda(d.none), cuda(d.keep), "CUDA calls, keep policy", d.keep);
}

TEST(RouteSetup, DefaultModeLeavesNoChannelNoFdServiceNoMemory) {
  DefaultRuns d;
  for (const RunResult* r : {&d.zero, &d.keep}) {
    ASSERT_EQ(r->exit_code, 0) << r->describe();
    EXPECT_EQ(r->num("fd_threads"), 0) << "a zerocta-fd thread in the default mode";
    EXPECT_EQ(r->num("channel_files"), 0);
    EXPECT_EQ(r->num("end.ce_ready"), 0);
    EXPECT_EQ(r->num("end.pool_bytes"), 0);
    EXPECT_FALSE(contains(r->log, "cuda cuMemCreate ")) << r->describe();
    EXPECT_FALSE(contains(r->log, "cuda cuMemHostRegister ")) << r->describe();
    EXPECT_FALSE(contains(r->log, "cuda cuStreamCreate ")) << r->describe();
    EXPECT_FALSE(contains(r->err, "route: ")) << r->describe();
  }
  EXPECT_EQ(joined(files_in(d.chan.dir())), "");
}

// ---- 2. Two processes commit ----

TEST(RouteSetup, AutoOnTwoProcessesCommitsAndRoutesTheAllGather) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"}, route_env(chan, rdv, unique_id_text()), s);
  expect_clean_pair(r, chan);
  expect_committed_pair(r);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_EQ(rnum(r, k, "init.ce_ready"), 1) << "frozen when the blocking init returned";
    EXPECT_EQ(rnum(r, k, "init.channel_files"), 0) << "the name is unlinked at the freeze";
    // The join registered the channel's op region (host memory, for the flags), once.
    EXPECT_GT(rnum(r, k, "init.pool_bytes"), 0);
    EXPECT_LT(rnum(r, k, "init.pool_bytes"), 1 << 20);
    EXPECT_EQ(cuda_calls(r, "cuMemHostRegister", pid), 1) << r.describe();
    EXPECT_EQ(cuda_calls(r, "cuMemHostUnregister", pid), 1) << r.describe();
    // No GPU memory of the shim's own: the driver's two buffers are the only allocations.
    EXPECT_EQ(cuda_calls(r, "cuMemCreate", pid), 2) << r.describe();
    // Prepare: the route's 3 streams (plus the driver's) and 4 events, and the event after the
    // last op forwarded to NCCL (comm_order.h); the push issuer's context, and its stream and
    // event for the communicator (push_issuer.h); no peer access, since the peer is in another
    // process.
    EXPECT_EQ(cuda_calls(r, "cuStreamCreate", pid), 3 + 1 + 1);
    EXPECT_EQ(cuda_calls(r, "cuEventCreate", pid), 4 + 1 + 1);
    EXPECT_TRUE(any_contains(shim_lines(r, pid, "INFO"), "push issuer: a context of its own"))
        << r.describe();
    EXPECT_EQ(cuda_calls(r, "cuCtxEnablePeerAccess", pid), 0);
    EXPECT_EQ(rnum(r, k, "end.fd_threads"), 1) << "one fd service per process";
    expect_nothing_left(r, k);
  }
  // No NCCL call of the shim's own: the application's calls only.
  EXPECT_EQ(nccl_collective_lines(r), 0) << r.describe();
  for (const std::string& line : r.log_lines()) {
    if (line.rfind("cuda ", 0) == 0) continue;
    const std::string fn = log_fields(line)["fn"];
    EXPECT_TRUE(fn == "marker" || fn == "ncclGetUniqueId" || fn == "ncclGetVersion" ||
                fn == "ncclCommInitRankConfig" || fn == "ncclCommDestroy")
        << line;
  }
}

TEST(RouteSetup, ImportThatIsNotSharedFailsTheDataCheck) {
  // The control of the test above: imports that map fresh memory instead of the peer's. The
  // route has no check of its own here (the flags live in the channel, not in imports), so the
  // op looks as it should in every other respect; only the data shows it. Each rank's receive
  // buffer gets its peer's chunk through an import in either pair mode (the peer pushed through
  // its import of this buffer, or this rank pulled through its import of the peer's), so both
  // ranks see wrong data. Were data_ok blind to broken imports, this test would fail.
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic"},
      with(route_env(chan, rdv, unique_id_text()), {{"FAKE_CUDA_IMPORT_UNSHARED", "1"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_TRUE(any_contains(decisions(r, pid), kEngaged)) << r.describe();
    EXPECT_EQ(warns(r, pid), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 1);
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 0) << "data arrived through an unshared import\n"
                                           << r.describe();
  }
  int imports[2] = {};
  expect_pair_imports(r, imports);
  EXPECT_EQ(imports[0] + imports[1], 2) << "no import took place: the control tests nothing";
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

TEST(RouteSetup, ZeroctaModeRoutesAnySize) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic"},
                with(route_env(chan, rdv, unique_id_text()), {{"ZEROCTA_ALLGATHER", "zerocta"},
                                                              {"ZEROCTA_MIN_BYTES", "64M"},
                                                              {"DRV_AG_BYTES", "1000"}}),
                s);
  expect_clean_pair(r, chan);
  expect_committed_pair(r);
}

TEST(RouteSetup, AutoBelowMinBytesCommitsButForwards) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic"},
                with(route_env(chan, rdv, unique_id_text()), {{"ZEROCTA_MIN_BYTES", "64M"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(rnum(r, k, "init.ce_ready"), 1);
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 1);
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 0);
    // Nothing prepared (streams, events) and nothing posted (exports) without a routed op.
    EXPECT_EQ(cuda_calls(r, "cuEventCreate", pid_of(r, k)), 0) << "prepared without a routed op";
    EXPECT_EQ(cuda_calls(r, "cuMemExportToShareableHandle", pid_of(r, k)), 0);
  }
}

// ---- 3. The library or the mode on one rank only ----

void one_rank_differs(const std::string& var, const std::string& value) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic", "r1:" + var + "=" + value},
                          route_env(chan, rdv, unique_id_text()), s);
  expect_clean_pair(r, chan);
  const std::string pid0 = pid_of(r, 0);
  EXPECT_TRUE(any_contains(decisions(r, pid0), "not engaged: a rank on this host did not join"))
      << r.describe();
  EXPECT_TRUE(any_contains(warns(r, pid0), "did not join")) << r.describe();
  EXPECT_EQ(rnum(r, 0, "ag.ag_pass"), 1);
  EXPECT_EQ(rnum(r, 0, "end.pool_bytes"), 0);
  EXPECT_EQ(decisions(r, pid_of(r, 1)), std::vector<std::string>{}) << "rank 1 never joined";
  EXPECT_EQ(static_cast<int>(log_calls(r, "ncclAllGather").size()), 2) << r.describe();
}

TEST(RouteSetup, OneRankWithShimDisabledBothPassThrough) {
  one_rank_differs("ZEROCTA_ENABLE", "0");
}

TEST(RouteSetup, OneRankInNcclModeBothPassThrough) {
  one_rank_differs("ZEROCTA_ALLGATHER", "nccl");
}

// ---- 4. One thread, one group, two ranks ----

// The grouped-init scenario: one thread, both ranks of one communicator, all-gathers in one
// group. `extra`: more DRV_* settings. The fake's waits cannot make the first rank wait for the
// second (FAKE_CUDA_WAIT_MS=0: they are skipped), so where the ops go one by one the earlier
// rank leaves both copies to the later one, which runs second.
RunResult run_grouped_init(const Scratch& s, const Scratch& chan, const Scratch& rdv,
                           const Env& extra = {}) {
  const Env env = with({{"FAKE_CUDA_WAIT_MS", "0"}, {"ZEROCTA_STATS", s.dir() + "/stats-%p.json"}},
                       extra);
  return run_route({"grouped-init"}, with(route_env(chan, rdv, unique_id_text()), env), s);
}

TEST(RouteSetup, GroupedInitOfTwoCommsByOneThreadCommitsBoth) {
  Scratch s, chan, rdv;
  RunResult r = run_grouped_init(s, chan, rdv);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("in_group.rank1"), 0) << "the fake answers 0 until the group end";
  EXPECT_EQ(r.num("group_end"), 0);
  EXPECT_EQ(r.num("init.ce_ready"), 2) << r.describe();
  EXPECT_EQ(r.num("init.channel_files"), 0);
  const auto lines = r.err_lines();
  EXPECT_TRUE(any_contains(lines, std::string("route: rank 0/2 dev 0: ") + kEngaged))
      << r.describe();
  EXPECT_TRUE(any_contains(lines, std::string("route: rank 1/2 dev 1: ") + kEngaged))
      << r.describe();
  EXPECT_EQ(r.num("ag.ag_ce"), 2);
  EXPECT_EQ(r.num("ag0.data_ok"), 1) << r.describe();
  EXPECT_EQ(r.num("ag1.data_ok"), 1) << r.describe();
  // Peers in one process reach each other's buffers by address: peer access, no fd.
  EXPECT_GE(cuda_calls(r, "cuCtxEnablePeerAccess", r.kv()["pid"]), 1) << r.describe();
  EXPECT_FALSE(contains(r.log, "cuda cuMemExportToShareableHandle ")) << r.describe();
  EXPECT_FALSE(contains(r.log, "cuda cuMemImportFromShareableHandle ")) << r.describe();
  EXPECT_EQ(r.num("end.pool_bytes"), 0);
  for (const char* kind : {"alloc", "reserve", "map", "stream", "event", "hostreg"})
    EXPECT_EQ(r.num(std::string("end.live_") + kind), 0) << kind;
  EXPECT_EQ(joined(files_in(chan.dir())), "");
  EXPECT_EQ(nccl_collective_lines(r), 0) << r.describe();
}

// Both ranks' all-gathers in one thread's group go together, without the op exchange: each
// rank pushes its chunk into the other's buffer and copies its own (out of place), and the
// ranks hand over through the ring's flags: each writes its ready and its done, reads its ready
// back (direct_plan.cc) and waits for its peer's.
TEST(RouteSetup, OneThreadsGroupOverEveryRankGoesTogetherOnTheRingsFlags) {
  for (const char* in_place : {"0", "1"}) {
    SCOPED_TRACE(std::string("in place ") + in_place);
    const bool ip = std::string(in_place) == "1";
    Scratch s, chan, rdv;
    RunResult r = run_grouped_init(s, chan, rdv, {{"DRV_AG_IN_PLACE", in_place}});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const std::string pid = r.kv()["pid"];
    EXPECT_EQ(r.num("ag0.data_ok"), 1) << r.describe();
    EXPECT_EQ(r.num("ag1.data_ok"), 1) << r.describe();
    EXPECT_EQ(r.num("ag.ag_ce"), 2);
    const std::string json = stats_file(s, pid);
    EXPECT_EQ(json_number(json, "local_group_ops"), 2) << json;
    EXPECT_EQ(pairs_settled(json), 0) << json;
    EXPECT_EQ(cuda_lines(r, "cuStreamWriteValue32", pid), 4) << r.describe();
    EXPECT_EQ(cuda_lines(r, "cuStreamWaitValue32", pid), 6) << r.describe();
    // Two pushes, and out of place each rank's own chunk.
    EXPECT_EQ(cuda_calls(r, "cuMemcpyAsync", pid), ip ? 2 : 4) << r.describe();
    // Per rank the push stream waits for the start and the user's stream for the end; out of
    // place the local stream waits for the start and the push stream for the local copy.
    EXPECT_EQ(cuda_calls(r, "cuStreamWaitEvent", pid), ip ? 4 : 8) << r.describe();
    EXPECT_TRUE(any_contains(r.err_lines(), "issues every rank of the communicator in one group"))
        << r.describe();
  }
}

// cuMem buffers whose owner granted only its own GPU access: each is mapped a second time, open
// to the other GPU, and the group still goes as one plan; the second mappings go with the
// communicators (after the application freed the buffers, none is left).
TEST(RouteSetup, OneThreadsGroupReachesUngrantedCuMemThroughASecondMapping) {
  Scratch s, chan, rdv;
  RunResult r = run_grouped_init(s, chan, rdv, {{"DRV_AG_OWN_ACCESS", "1"}});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string pid = r.kv()["pid"];
  EXPECT_EQ(r.num("ag0.data_ok"), 1) << r.describe();
  EXPECT_EQ(r.num("ag1.data_ok"), 1) << r.describe();
  EXPECT_EQ(r.num("ag.ag_ce"), 2) << r.describe();
  EXPECT_EQ(json_number(stats_file(s, pid), "local_group_ops"), 2);
  // Each rank's receive buffer (one allocation each), retained and mapped once more.
  EXPECT_EQ(cuda_calls(r, "cuMemRetainAllocationHandle", pid), 2) << r.describe();
  for (const char* kind : {"alloc", "reserve", "map", "event"})
    EXPECT_EQ(r.num(std::string("end.live_") + kind), 0) << kind << "\n" << r.describe();
}

// Buffers freed after each group and allocated afresh for the next: the second mappings of the
// freed ones go at the next group's end, never reused for the new buffers at the same addresses
// (their allocations are new), and the data is right every round.
TEST(RouteSetup, SecondMappingsOfFreedBuffersGoAtTheNextGroup) {
  Scratch s, chan, rdv;
  RunResult r = run_grouped_init(s, chan, rdv, {{"DRV_AG_OWN_ACCESS", "1"}, {"DRV_AG_ROUNDS", "6"}});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  int ok = 0;
  for (const std::string& line : r.out_lines()) ok += line == "ag0.data_ok=1" || line == "ag1.data_ok=1";
  EXPECT_EQ(ok, 12) << r.describe();
  EXPECT_EQ(json_number(stats_file(s, r.kv()["pid"]), "local_group_ops"), 12);
  EXPECT_EQ(cuda_calls(r, "cuMemRetainAllocationHandle", r.kv()["pid"]), 12) << r.describe();
  // Only the last round's two, whose buffers were freed after the last group.
  EXPECT_EQ(r.num("rounds.live_reserve"), 2) << r.describe();
  EXPECT_EQ(r.num("end.live_reserve"), 0) << r.describe();
}

// Where the group's ops cannot go as one plan they go one by one, through the exchange: host
// memory, which no GPU reaches by address (the first rank's then sends the op to NCCL on both).
TEST(RouteSetup, OneThreadsGroupThatCannotGoAsOnePlanGoesOpByOp) {
  Scratch s, chan, rdv;
  RunResult r = run_grouped_init(s, chan, rdv, {{"DRV_AG_MEM", "host"}});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  // NCCL's (the fake moves no data): both launched at the group's end.
  int launched = 0;
  for (const std::string& line : r.log_lines())
    launched += line.rfind("ncclGroupEnd:launch ncclAllGather ", 0) == 0;
  EXPECT_EQ(launched, 2) << r.describe();
  EXPECT_EQ(r.num("ag.ag_ce"), 0) << r.describe();
  EXPECT_EQ(r.num("ag.ag_pass"), 2) << r.describe();
  EXPECT_EQ(json_number(stats_file(s, r.kv()["pid"]), "local_group_ops"), 0);
}

// Two all-gathers per rank in one group: the first of each rank's go together, then the second
// of each rank's.
TEST(RouteSetup, OneThreadsGroupWithTwoAllGathersPerRankIssuesTwoPlans) {
  Scratch s, chan, rdv;
  RunResult r = run_grouped_init(s, chan, rdv, {{"DRV_AG_GROUP_OPS", "2"}});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (const char* k : {"ag0.data_ok", "ag1.data_ok", "ag0b.data_ok", "ag1b.data_ok"})
    EXPECT_EQ(r.num(k), 1) << k << "\n" << r.describe();
  EXPECT_EQ(r.num("ag.ag_ce"), 4) << r.describe();
  const std::string pid = r.kv()["pid"];
  const std::string json = stats_file(s, pid);
  EXPECT_EQ(json_number(json, "local_group_ops"), 4) << json;
  EXPECT_EQ(json_number(json, "pairs_later_does_both"), 0) << json;
  // Two sets, each rank waiting for its own ready, its peer's and its peer's done in each.
  EXPECT_EQ(cuda_lines(r, "cuStreamWaitValue32", pid), 12) << r.describe();
}

// Every rank in one process: one thread's group over all of them goes as one plan; the same ops
// issued one by one go to NCCL on every rank (the exchange is not used there).
TEST(RouteSetup, RanksOfOneProcessGoAsOnePlanOrToNccl) {
  for (const char* n : {"2", "3"}) {
    SCOPED_TRACE(std::string(n) + " ranks");
    const int ranks = std::stoi(n);
    {
      Scratch s, chan, rdv;
      RunResult r = run_grouped_init(s, chan, rdv, {{"DRV_GROUPED_RANKS", n}});
      ASSERT_EQ(r.exit_code, 0) << r.describe();
      for (int i = 0; i < ranks; ++i)
        EXPECT_EQ(r.num("ag" + std::to_string(i) + ".data_ok"), 1) << i << "\n" << r.describe();
      EXPECT_EQ(r.num("ag.ag_ce"), ranks) << r.describe();
      EXPECT_EQ(json_number(stats_file(s, r.kv()["pid"]), "local_group_ops"), ranks);
    }
    {
      Scratch s, chan, rdv;
      RunResult r =
          run_grouped_init(s, chan, rdv, {{"DRV_GROUPED_RANKS", n}, {"DRV_AG_UNGROUPED", "1"}});
      ASSERT_EQ(r.exit_code, 0) << r.describe();
      EXPECT_EQ(r.num("ag.ag_ce"), 0) << r.describe();
      EXPECT_EQ(r.num("ag.ag_pass"), ranks) << r.describe();
      const std::string pid = r.kv()["pid"];
      EXPECT_EQ(cuda_lines(r, "cuStreamWaitValue32", pid), 0) << r.describe();
      EXPECT_TRUE(any_contains(r.err_lines(), "all-gathers come one by one")) << r.describe();
    }
  }
}

// Two processes of two ranks each, each process's ranks in one group of its thread (an MPI job
// of nccl-tests -g 2; drv_route ranks 2 grouped), with `extra` settings.
RunResult run_processes_of_two_ranks(const Scratch& s, const Scratch& chan, const Scratch& rdv,
                                     const Env& extra) {
  return run_route({"ranks", "2", "grouped"},
                   with(route_env(chan, rdv, unique_id_text()),
                        with({{"FAKE_CUDA_WAIT_MS", "0"},
                              {"ZEROCTA_STATS", s.dir() + "/stats-%p.json"}},
                             extra)),
                   s);
}

// Each process exited cleanly, both of its ranks gathered every rank's data, and its
// `routed` all-gathers all took the route.
void expect_each_process_gathered(const RunResult& r, long long routed) {
  for (int p = 0; p < 2; ++p) {
    const std::string k = "r" + std::to_string(p) + ".";
    EXPECT_EQ(r.num(k + "exit"), 0) << r.describe();
    for (int rank = 2 * p; rank < 2 * p + 2; ++rank)
      EXPECT_EQ(r.num(k + "ag" + std::to_string(rank) + ".data_ok"), 1)
          << rank << "\n" << r.describe();
    EXPECT_EQ(r.num(k + "ag.ag_ce"), routed) << r.describe();
    EXPECT_EQ(r.num(k + "ag.ag_pass"), 0) << r.describe();
  }
}

// A peer's abort is local, as NCCL's: PyTorch's test_abort_pg aborts rank 0 while rank 1's ops
// that do not need rank 0 go on. Rank 0's route had run all it queued (clean), so rank 1's
// all-reduce and its ncclCommGetAsyncError are NCCL's alone; an all-gather that would need rank 0
// fails at once (NCCL's would wait for ever). Before, the abort poisoned the communicator on
// every rank, and rank 1's all-reduce failed with ncclRemoteError.
TEST(RouteSetup, APeersCleanAbortFailsNothingThatNeedsNotThePeer) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "peerabort"}, route_env(chan, rdv, unique_id_text()), s);
  EXPECT_EQ(rnum(r, 0, "exit"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 1, "exit"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 0, "ag.data_ok"), 1) << r.describe();
  EXPECT_EQ(rnum(r, 0, "peer.abort"), 0);
  EXPECT_EQ(rnum(r, 1, "peer.async"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 1, "peer.ar_rc"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 1, "peer.async_after_ar"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 1, "peer.ag_rc"), 6) << r.describe();  // ncclRemoteError
}

// A rank that ran more ops ahead than the op ring holds waits for room in it; its peer aborts
// instead of catching up. The wait ends with an error when the peer leaves (NCCL's op would
// never complete either, but its call would return), rather than for ever. (The fake streams
// skip their waits here, so that the host runs ahead as a real one does.)
TEST(RouteSetup, ARankWaitingForRoomInTheRingReturnsWhenItsPeerAborts) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "peerabort"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"DRV_PEER_AHEAD", "40"}, {"DRV_PEER_ABORT_AFTER_MS", "500"},
                                {"FAKE_CUDA_WAIT_MS", "0"}, {"DRV_TIMEOUT_S", "20"}}),
                          s);
  EXPECT_EQ(rnum(r, 0, "exit"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 1, "exit"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 1, "peer.abort"), 0);
  EXPECT_EQ(rnum(r, 0, "ahead.rc"), 6) << r.describe();  // ncclRemoteError
  EXPECT_GE(rnum(r, 0, "ahead.failed_at"), 16) << "the ring holds 16 ops" << r.describe();
  EXPECT_LT(rnum(r, 0, "ahead.ms"), 5000) << r.describe();
  EXPECT_EQ(rnum(r, 0, "ahead.abort"), 0) << r.describe();
}

// An abort never waits for the route's streams: they may sit behind the application's stream,
// and that behind a kernel that never ends (another communicator's collective whose peer is
// gone). Here the streams never drain and a synchronization takes 5 s: the abort returns at
// once, and what the streams address (the channel's registered flags) stays until they have
// drained — freed at the next communicator's teardown.
TEST(RouteSetup, AbortNeverWaitsForTheRoutesStreams) {
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic"},
      with(route_env(chan, rdv, unique_id_text()),
           {{"DRV_END", "abort_busy"}, {"DRV_SECOND_WORLD", "1"}, {"DRV_TIMEOUT_S", "30"}}),
      s);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "world.abort"), 0);
    EXPECT_LT(rnum(r, k, "world.abort_ms"), 1000) << "the abort waited for a stream";
    EXPECT_EQ(rnum(r, k, "world.parked_hostreg"), 1) << "freed under streams still running";
    EXPECT_EQ(rnum(r, k, "again.data_ok"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "end.live_hostreg"), 0) << "parked for good";
  }
}

// A group over two communicators whose ranks name them in opposite orders, both all-gathers on
// one stream (NCCL completes it: it launches a group's communicators in the order of their
// hashes). Issued in program order, each rank's stream would wait for the other's flags of the
// op it holds second, for ever; the group's end orders them by the communicators' keys.
void expect_two_comms_routed(const std::string& order_of_rank1) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "twocomms", "r1:DRV_TWO_ORDER=" + order_of_rank1},
                          route_env(chan, rdv, unique_id_text()), s);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "two.rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "two.data_ok"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "two.ag_ce"), 2) << "both all-gathers on the route";
    EXPECT_EQ(rnum(r, k, "two.destroy"), 1);
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
  }
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

TEST(RouteSetup, GroupOverTwoCommsInTheSameOrderOnEveryRank) { expect_two_comms_routed("same"); }

TEST(RouteSetup, GroupOverTwoCommsInOppositeOrdersPerRankCompletes) {
  expect_two_comms_routed("reverse");
}

// Every op goes through the exchange, posted and claimed for both of a process's ranks before
// either waits for a later rank of the other process. One rank at a time, rank 0 waited for
// rank 3's claim while the other process's thread waited in rank 2 for rank 1's, which came
// only after rank 0's wait ran out: the pairs fell back to "later does both" (4xH100: 5 of 109
// pairs each pushed, 300 us a wait). In or out of place, several rounds on new buffers. The
// order is read from the debug log (how many pairs fall back depends on how the machine
// schedules the two processes).
TEST(RouteSetup, ProcessesOfSeveralRanksPostEveryRankBeforeWaiting) {
  for (const char* in_place : {"0", "1"}) {
    SCOPED_TRACE(std::string("in place ") + in_place);
    Scratch s, chan, rdv;
    RunResult r = run_processes_of_two_ranks(
        s, chan, rdv,
        {{"ZEROCTA_LOG", "debug"}, {"DRV_AG_ROUNDS", "4"}, {"DRV_AG_IN_PLACE", in_place}});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    expect_each_process_gathered(r, 8);
    EXPECT_TRUE(any_contains(r.err_lines(), "route: rank 0/4")) << r.describe();
    EXPECT_TRUE(any_contains(r.err_lines(), "this thread issues 2 ranks of the communicator"))
        << r.describe();
    long long each = 0, both = 0;
    for (int p = 0; p < 2; ++p) {
      const std::string pid = r.kv()["r" + std::to_string(p) + ".pid"];
      const std::string json = stats_file(s, pid);
      each += json_number(json, "pairs_each_pushes");
      both += json_number(json, "pairs_later_does_both");
      // In this process, op by op: both of its ranks posted before either waits.
      std::string order;
      for (const std::string& line : r.err_lines()) {
        if (line.find(":" + pid + ":") == std::string::npos) continue;
        if (line.find(" posted and its pairs") != std::string::npos) order += 'P';
        if (line.find(" settles its pairs with later") != std::string::npos) order += 'W';
      }
      EXPECT_EQ(order, "PPWWPPWWPPWWPPWW") << r.describe();
    }
    EXPECT_EQ(each + both, 24) << r.describe();  // 4 rounds x 6 pairs, each settled once
  }
}

// The same layout on host memory, which no peer reaches: each op of an exchange set goes to
// NCCL while the set's other op of the thread is still begun (its communicator's issue lock
// held), and the forwarded op adds no order of its own there (comm_order.h: inside the group
// end's NCCL group it would wait on that very lock).
TEST(RouteSetup, ProcessesOfSeveralRanksForwardWhatNoPeerReaches) {
  Scratch s, chan, rdv;
  RunResult r = run_processes_of_two_ranks(
      s, chan, rdv, {{"ZEROCTA_LOG", "debug"}, {"DRV_AG_ROUNDS", "2"}, {"DRV_AG_MEM", "host"}});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(any_contains(r.err_lines(), "this thread issues 2 ranks of the communicator"))
      << r.describe();
  for (int p = 0; p < 2; ++p) {
    const std::string k = "r" + std::to_string(p) + ".";
    EXPECT_EQ(r.num(k + "exit"), 0) << r.describe();
    EXPECT_EQ(r.num(k + "ag.ag_ce"), 0) << r.describe();
    EXPECT_EQ(r.num(k + "ag.ag_pass"), 4) << r.describe();
  }
  EXPECT_FALSE(any_contains(r.err_lines(), "comm order on rank")) << r.describe();
}

// The same with the buffers in symmetric windows on the legacy stream, where NCCL 2.28 would
// fail its CE path and the op goes to NCCL through a side stream (wrappers_collectives.cc).
// Forwarded while the exchange set's op still held its communicator's issue lock, the detour
// took that lock again and the process hung; and inside the group end's NCCL group no detour
// applies (NCCL launches the op only at that group's end).
TEST(RouteSetup, ProcessesOfSeveralRanksForwardWindowOpsOnTheLegacyStream) {
  Scratch s, chan, rdv;
  RunResult r = run_processes_of_two_ranks(s, chan, rdv,
                                           {{"DRV_AG_ROUNDS", "2"},
                                            {"DRV_AG_MEM", "host"},
                                            {"DRV_AG_WINDOWS", "1"},
                                            {"DRV_AG_LEGACY_STREAM", "1"},
                                            // NCCL's fake moves no data here: each rank's check
                                            // waits 2 s an op for bytes that never come (8 s),
                                            // which 10 s left too little room for on 2 busy cores.
                                            {"DRV_TIMEOUT_S", "30"}});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (int p = 0; p < 2; ++p) {
    const std::string k = "r" + std::to_string(p) + ".";
    EXPECT_EQ(r.num(k + "exit"), 0) << r.describe();
    EXPECT_EQ(r.num(k + "ag.ag_ce"), 0) << r.describe();
    EXPECT_EQ(r.num(k + "ag.ag_pass") + r.num(k + "ag.ag_nccl_ce"), 4) << r.describe();
  }
}

// The same layout on cuMem memory each rank opened to its own device only (PyTorch's expandable
// segments without peer access): the peers in the other process import it, the peer in the
// same process writes through a second mapping (local_aliases.h). Without that, the first
// rank's post was unreachable and every op went to NCCL.
TEST(RouteSetup, ProcessesOfSeveralRanksReachOwnAccessMemoryThroughSecondMappings) {
  for (const char* in_place : {"0", "1"}) {
    SCOPED_TRACE(std::string("in place ") + in_place);
    Scratch s, chan, rdv;
    RunResult r = run_processes_of_two_ranks(
        s, chan, rdv,
        {{"DRV_AG_ROUNDS", "3"}, {"DRV_AG_OWN_ACCESS", "1"}, {"DRV_AG_IN_PLACE", in_place}});
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    expect_each_process_gathered(r, 6);
    // Every mapping, the second ones included, is gone at the end.
    for (int p = 0; p < 2; ++p)
      EXPECT_EQ(r.num("r" + std::to_string(p) + ".end.live_reserve"), 0) << r.describe();
  }
}

// ---- 5. Non-blocking communicators ----

TEST(RouteSetup, NonBlockingCommFreezesInThePollThatSeesSuccess) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"FAKE_NCCL_NONBLOCKING", "1"}, {"DRV_NB", "1"}}),
                          s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(rnum(r, k, "init.rc"), 7) << "ncclInProgress";
    EXPECT_EQ(rnum(r, k, "init.ce_ready"), 0) << "frozen before NCCL said ready";
    EXPECT_GE(rnum(r, k, "poll.polls_in_progress"), 3) << "3, more while the peer is late";
    EXPECT_EQ(rnum(r, k, "poll.ready_before"), 0);
    EXPECT_EQ(rnum(r, k, "poll.ready_at"), 1) << "not frozen by the poll that saw ncclSuccess";
  }
  expect_committed_pair(r);
}

TEST(RouteSetup, NonBlockingCommPolledFromASecondThread) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic"},
                with(route_env(chan, rdv, unique_id_text()),
                     {{"FAKE_NCCL_NONBLOCKING", "1"}, {"DRV_NB", "1"}, {"DRV_POLL", "thread"}}),
                s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(rnum(r, k, "poll.ready_at"), 1) << r.describe();
  expect_committed_pair(r);
}

TEST(RouteSetup, PassThroughCommFrozenOnAnotherThreadFreesItsMemoryAtNextUse) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic", "r1:ZEROCTA_MIN_BYTES=1"},
                with(route_env(chan, rdv, unique_id_text()),
                     {{"FAKE_NCCL_NONBLOCKING", "1"}, {"DRV_NB", "1"}, {"DRV_POLL", "thread"}}),
                s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(any_contains(decisions(r, pid_of(r, k)), "fingerprint differs")) << r.describe();
    // The poll on another thread makes no CUDA call: the channel stays registered until the
    // application's thread uses the comm.
    EXPECT_GT(rnum(r, k, "ready.pool_bytes"), 0) << "unregistered in another thread's poll";
    EXPECT_EQ(rnum(r, k, "ag.pool_bytes"), 0) << "the registration outlived the first operation";
    EXPECT_EQ(cuda_calls(r, "cuMemHostUnregister", pid_of(r, k)), 1);
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 1);
  }
}

// An all-gather inside a group on a non-blocking comm that NCCL completed but nobody polled:
// the route is decided at the group end, alike on every rank whether it polled or not.
void expect_same_route(const RunResult& r) {
  EXPECT_EQ(rnum(r, 0, "ag.ag_ce"), rnum(r, 1, "ag.ag_ce")) << "the ranks took different routes "
                                                               "(a hang on GPUs)\n"
                                                            << r.describe();
  EXPECT_EQ(rnum(r, 0, "ag.ag_pass"), rnum(r, 1, "ag.ag_pass"));
  EXPECT_EQ(rnum(r, 0, "ag.rc"), 0);
  EXPECT_EQ(rnum(r, 1, "ag.rc"), 0);
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

TEST(RouteSetup, GroupedAllGatherBeforeAnyPollIsDecidedAtGroupEndAlikeOnEveryRank) {
  // Without FAKE_NCCL_NONBLOCKING the fake completes a non-blocking init at once (as NCCL may):
  // rank 0 polls (and freezes), rank 1 never polls; both all-gather inside a group.
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic", "r0:DRV_POLL=main", "r1:DRV_POLL=none"},
      with(route_env(chan, rdv, unique_id_text()), {{"DRV_NB", "1"}, {"DRV_AG_GROUP", "1"}}), s);
  expect_clean_pair(r, chan);
  expect_same_route(r);
}

TEST(RouteSetup, GroupedAllGatherOnUnpolledNonBlockingCommTakesTheRoute) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"DRV_NB", "1"}, {"DRV_AG_GROUP", "1"}, {"DRV_POLL", "none"}}),
                          s);
  expect_clean_pair(r, chan);
  expect_same_route(r);
  expect_committed_pair(r);
}

TEST(RouteSetup, InitAndAllGatherInOneGroupReachNccl) {
  // The nccl-tests pattern with a non-blocking comm: the all-gather is part of the init's
  // group; NCCL launches it at the group end.
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic"},
                with(route_env(chan, rdv, unique_id_text()), {{"FAKE_NCCL_NONBLOCKING", "1"},
                                                              {"DRV_NB", "1"},
                                                              {"DRV_INIT_GROUP_AG", "1"},
                                                              {"DRV_AG", "0"}}),
                s);
  expect_clean_pair(r, chan);
  int launched = 0;
  for (const std::string& line : r.log_lines())
    if (line.rfind("ncclGroupEnd:launch ncclAllGather ", 0) == 0 && contains(line, " -> 0"))
      ++launched;
  const long long ce = rnum(r, 0, "end.ag_ce") + rnum(r, 1, "end.ag_ce");
  EXPECT_EQ(launched + ce, 2) << "an all-gather of the application went missing\n" << r.describe();
  for (int k = 0; k < 2; ++k) EXPECT_EQ(rnum(r, k, "init_group_ag.rc"), 0);
}

TEST(RouteSetup, DestroyOfANeverPolledNonBlockingCommMakesNoNcclCallOfItsOwn) {
  // One process holding rank 0 of 2 (no rendezvous: the fake completes it alone).
  Scratch s, chan, rdv;
  Env env = with(route_env(chan, rdv, unique_id_text()), {{"FAKE_NCCL_NONBLOCKING", "1"},
                                                          {"DRV_NB", "1"},
                                                          {"DRV_NRANKS", "2"},
                                                          {"DRV_EARLY_DESTROY", "1"},
                                                          {"DRV_POLL", "none"},
                                                          {"DRV_AG", "0"},
                                                          {"DRV_END", "abort"}});
  env.erase(std::remove_if(env.begin(), env.end(),
                           [](const auto& e) { return e.first == "FAKE_NCCL_RENDEZVOUS_DIR"; }),
            env.end());
  RunResult r = run_route({"ranks", "1", "basic"}, env, s);
  EXPECT_EQ(rnum(r, 0, "exit"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 0, "early_destroy"), 4) << "NCCL refuses a comm in progress";
  std::vector<std::string> nccl;
  bool in = false;
  for (const std::string& line : r.log_lines()) {
    if (line == "marker r0.early-destroy") in = true;
    if (line == "marker r0.early-destroy-end") in = false;
    if (in && line.rfind("cuda ", 0) != 0 && line.rfind("marker ", 0) != 0) nccl.push_back(line);
  }
  EXPECT_EQ(nccl, std::vector<std::string>{"ncclCommDestroy comm=comm#1 -> 4"}) << r.describe();
  EXPECT_EQ(joined(files_in(chan.dir())), "");
}

TEST(RouteSetup, DestroyRefusedByNcclKeepsTheRanksOnOneRoute) {
  // Rank 0 calls ncclCommDestroy too early (NCCL answers ncclInvalidArgument: nothing
  // happened), then polls and uses the comm as usual, like rank 1.
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic", "r0:DRV_EARLY_DESTROY=1", "r0:DRV_SLEEP_AFTER_INIT_MS=300"},
                with(route_env(chan, rdv, unique_id_text()),
                     {{"FAKE_NCCL_NONBLOCKING", "1"}, {"DRV_NB", "1"}}),
                s);
  expect_clean_pair(r, chan);
  EXPECT_EQ(rnum(r, 0, "early_destroy"), 4);
  expect_same_route(r);
}

// ---- 6. Splits and shrinks ----

TEST(RouteSetup, GroupedSplitOfInitAllCommsCommitsTheChild) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"initall-split"},
                with(route_env(chan, rdv, unique_id_text()), {{"FAKE_CUDA_WAIT_MS", "0"}}), s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("initall.ce_ready"), 2);
  EXPECT_EQ(r.num("kid0.rank"), 1) << "keys reversed";
  EXPECT_EQ(r.num("kid1.rank"), 0);
  EXPECT_EQ(r.num("split.created"), 4) << "the children were never registered\n" << r.describe();
  EXPECT_EQ(r.num("split.ce_ready"), 4) << r.describe();
  EXPECT_TRUE(any_contains(r.err_lines(), std::string("route: rank 1/2 dev 0: ") + kEngaged))
      << r.describe();
  EXPECT_TRUE(any_contains(r.err_lines(), std::string("route: rank 0/2 dev 1: ") + kEngaged));
  EXPECT_EQ(r.num("ag.ag_ce"), 2);
  // The children's ranks are reversed: each buffer must still land at its rank's place.
  EXPECT_EQ(r.num("ag0.data_ok"), 1) << r.describe();
  EXPECT_EQ(r.num("ag1.data_ok"), 1) << r.describe();
  EXPECT_EQ(joined(files_in(chan.dir())), "");
}

TEST(RouteSetup, SplitOfInitAllCommsByTwoThreadsCommitsTheChild) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"initall-split"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"FAKE_CUDA_WAIT_MS", "0"}, {"DRV_SPLIT_THREADS", "1"}}),
                          s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("kid0.rank"), 1);
  EXPECT_EQ(r.num("kid1.rank"), 0);
  EXPECT_EQ(r.num("split.ce_ready"), 4) << r.describe();
  EXPECT_TRUE(any_contains(r.err_lines(), std::string("route: rank 1/2 dev 0: ") + kEngaged))
      << r.describe();
  EXPECT_TRUE(any_contains(r.err_lines(), std::string("route: rank 0/2 dev 1: ") + kEngaged));
  EXPECT_EQ(r.num("ag.ag_ce"), 2);
  // The children's ranks are reversed: each buffer must still land at its rank's place.
  EXPECT_EQ(r.num("ag0.data_ok"), 1) << r.describe();
  EXPECT_EQ(r.num("ag1.data_ok"), 1) << r.describe();
  EXPECT_EQ(r.num("end.pool_bytes"), 0);
  for (const char* kind : {"alloc", "reserve", "map", "stream", "event", "hostreg"})
    EXPECT_EQ(r.num(std::string("end.live_") + kind), 0) << kind;
  EXPECT_EQ(joined(files_in(chan.dir())), "");
}

TEST(RouteSetup, SplitAcrossProcessesWithReversedKeysCommits) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "split", "r0:DRV_KEY=1", "r1:DRV_KEY=0"},
                          route_env(chan, rdv, unique_id_text()), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "child.rank"), 1 - k);
    EXPECT_EQ(rnum(r, k, "child.count"), 2);
    EXPECT_EQ(rnum(r, k, "split.ce_ready"), 2) << "parent and child";
    EXPECT_TRUE(any_contains(
        decisions(r, pid_of(r, k)),
        "rank " + std::to_string(1 - k) + "/2 dev " + std::to_string(k) + ": " + kEngaged))
        << r.describe();
    EXPECT_EQ(rnum(r, k, "child_ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "child_ag.ag_ce"), 1);
    EXPECT_EQ(rnum(r, k, "child_ag.data_ok"), 1);
    EXPECT_EQ(rnum(r, k, "world_ag.data_ok"), 1);
    expect_nothing_left(r, k);
  }
  EXPECT_EQ(waits_not_satisfied(r), 0);
}

TEST(RouteSetup, NoColorSplitInAThreeProcessWorld) {
  // auto with ZEROCTA_AUTO_MAX_RANKS=2: the world of 3 never joins, the child of 2 commits.
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "3", "split", "r0:DRV_COLOR=nocolor", "r1:DRV_KEY=1", "r2:DRV_KEY=0"},
                with(route_env(chan, rdv, unique_id_text()),
                     {{"DRV_AG", "0"}, {"ZEROCTA_AUTO_MAX_RANKS", "2"}}),
                s);
  expect_clean_pair(r, chan, 3);
  EXPECT_EQ(rnum(r, 0, "split.child"), 0);
  // The world never joins, and says why (its only decision line).
  const std::vector<std::string> world = decisions(r, pid_of(r, 0));
  ASSERT_EQ(world.size(), 1u) << r.describe();
  EXPECT_NE(world[0].find("rank 0/3 dev 0: copy-engine all-gather not engaged: more ranks than "
                          "ZEROCTA_AUTO_MAX_RANKS"),
            std::string::npos)
      << world[0];
  EXPECT_EQ(rnum(r, 1, "child.rank"), 1);
  EXPECT_EQ(rnum(r, 2, "child.rank"), 0);
  for (int k : {1, 2}) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "child.count"), 2);
    EXPECT_EQ(rnum(r, k, "split.ce_ready"), 1) << "the child only";
    EXPECT_TRUE(any_contains(decisions(r, pid_of(r, k)), kEngaged)) << r.describe();
    EXPECT_EQ(rnum(r, k, "child_ag.ag_ce"), 1);
    EXPECT_EQ(rnum(r, k, "child_ag.data_ok"), 1);
  }
  EXPECT_EQ(waits_not_satisfied(r), 0);
}

TEST(RouteSetup, ShrinkWithAnExcludeListCommitsTheChild) {
  // auto with ZEROCTA_AUTO_MAX_RANKS=2: the world of 3 never joins, the child of 2 commits.
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "3", "shrink"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"DRV_EXCLUDE", "1"}, {"ZEROCTA_AUTO_MAX_RANKS", "2"}}),
                          s);
  expect_clean_pair(r, chan, 3);
  EXPECT_EQ(rnum(r, 0, "child.rank"), 0);
  EXPECT_EQ(rnum(r, 2, "child.rank"), 1);
  for (int k : {0, 2}) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "child.count"), 2);
    EXPECT_EQ(rnum(r, k, "shrink.ce_ready"), 1);
    EXPECT_EQ(rnum(r, k, "child_ag.ag_ce"), 1);
    EXPECT_EQ(rnum(r, k, "child_ag.data_ok"), 1);
  }
  // Rank 1 is excluded: its only decision line is its world's (3 ranks, never joined).
  const std::vector<std::string> excluded = decisions(r, pid_of(r, 1));
  ASSERT_EQ(excluded.size(), 1u) << r.describe();
  EXPECT_NE(excluded[0].find("not engaged: more ranks than ZEROCTA_AUTO_MAX_RANKS"),
            std::string::npos)
      << excluded[0];
  EXPECT_EQ(waits_not_satisfied(r), 0);
}

// PyTorch's shrink_group(shrink_flags=NCCL_SHRINK_ABORT) (test_shrink_group_flags): the excluded
// rank aborts the parent, the others shrink it with NCCL_SHRINK_ABORT and then poll the parent's
// asynchronous error, which NCCL leaves at ncclSuccess. The route releases its waits and leaves
// the parent's exchange, but reports no error of its own (it did: ncclRemoteError, and PyTorch
// raised "remote process exited").
TEST(RouteSetup, AShrinkThatAbortsTheParentLeavesItsAsyncErrorAlone) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "3", "shrink"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"DRV_EXCLUDE", "1"}, {"DRV_SHRINK_ABORT", "1"}}),
                          s);
  EXPECT_EQ(rnum(r, 1, "excluded.abort"), 0) << r.describe();
  for (int k : {0, 2}) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "shrink.ag_ce"), 1) << "the parent's all-gather took the route";
    EXPECT_EQ(rnum(r, k, "world_ag.data_ok"), 1);
    EXPECT_EQ(rnum(r, k, "shrink.rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "shrink.parent_async"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "child_ag.data_ok"), 1) << r.describe();
  }
}

// ---- 7. Failure paths ----

// A kernel before the op failed the context (PyTorch's NaN check raises a device-side assert:
// test_nan_assert expects the all-gather's call to fail, as NCCL's launch does at once). The
// fake's stand-in: every stream query of rank 0 reports an error. The routed op fails with
// ncclUnhandledCudaError before it reaches its peer rather than returning success over a dead
// context; rank 1, which posted, is released by the poison.
TEST(RouteSetup, AnOpAfterAKernelFailedTheContextFailsAsNcclsLaunchWould) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic", "r0:FAKE_CUDA_FAIL=cuStreamQuery"},
                          route_env(chan, rdv, unique_id_text()), s);
  EXPECT_EQ(rnum(r, 0, "exit"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 1, "exit"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 0, "ag.rc"), 1) << r.describe();  // ncclUnhandledCudaError
}


// Rank 1 cannot register the channel's op region with CUDA (where its streams' flags live):
// every rank passes through and says why. Both join orders: the failing rank last, then first
// (its peer then probes the fd service of a rank that failed; the verdict must still name the
// registration, not a network namespace).
TEST(RouteSetup, RegistrationFailureOnTheLaterRankPassesThroughEverywhere) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic", "r1:FAKE_CUDA_FAIL=cuMemHostRegister",
                           "r1:DRV_SLEEP_BEFORE_INIT_MS=200"},
                          route_env(chan, rdv, unique_id_text()), s);
  expect_clean_pair(r, chan);
  expect_passthrough_pair(r, "register the channel's flags", true);
  // Rank 1 hit the failure and has nothing to unregister; rank 0 released its registration.
  EXPECT_EQ(cuda_lines(r, "cuMemHostRegister", pid_of(r, 1)), 1) << r.describe();
  EXPECT_EQ(cuda_lines(r, "cuMemHostUnregister", pid_of(r, 1)), 0) << r.describe();
  EXPECT_EQ(cuda_calls(r, "cuMemHostUnregister", pid_of(r, 0)), 1) << r.describe();
}

TEST(RouteSetup, RegistrationFailureOnTheEarlierRankPassesThroughNamingTheRegistration) {
  expect_pair_passes_through({"ranks", "2", "basic", "r1:FAKE_CUDA_FAIL=cuMemHostRegister",
                              "r0:DRV_SLEEP_BEFORE_INIT_MS=200"},
                             {}, "register the channel's flags", true);
}

TEST(RouteSetup, OneHardwareQueueOnOneRankPassesThroughWithInfoOnly) {
  // CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM asks for it): one hardware queue for every
  // stream, where a flag wait would hold up all the work behind it. A setting of the
  // application, not a fault: INFO, no WARN.
  expect_pair_passes_through({"ranks", "2", "basic", "r1:CUDA_DEVICE_MAX_CONNECTIONS=1"}, {},
                             "CUDA_DEVICE_MAX_CONNECTIONS=1", /*warned=*/false);
}

TEST(RouteSetup, NoP2pPassesThroughNamingP2p) {
  expect_pair_passes_through({"ranks", "2", "basic"}, {{"FAKE_CUDA_NO_P2P", "1"}}, "P2P", true);
}

TEST(RouteSetup, NoP2pIsSeenWhenTheRanksJoinAtTheSameTime) {
  // Slow driver queries make both ranks read the members before either has published: each
  // pair of ranks must still be checked by one of them.
  expect_pair_passes_through({"ranks", "2", "basic"},
                             {{"FAKE_CUDA_NO_P2P", "1"}, {"FAKE_CUDA_DELAY", "cuDeviceGet:300"}},
                             "P2P", true);
}

TEST(RouteSetup, DifferentMinBytesPassesThroughNamingTheSettings) {
  expect_pair_passes_through({"ranks", "2", "basic", "r1:ZEROCTA_MIN_BYTES=1"}, {},
                             "different ZEROCTA_* settings", true);
}

// One GPU visible per process, as CUDA_VISIBLE_DEVICES=<rank> gives (SLURM's --gpu-bind): each
// rank sees its own GPU as device 0 and not its peer's. Across processes the route needs no
// ordinal (imports), so NVML decides: NVLink between the two GPUs, and the route engages.
TEST(RouteSetup, IsolatedRanksLinkedByNvlinkTakeTheRoute) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic", "r0:FAKE_CUDA_ISOLATED=0", "r1:FAKE_CUDA_ISOLATED=1"},
                with(route_env(chan, rdv, unique_id_text()), {{"DRV_DEVICE", "0"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_TRUE(any_contains(decisions(r, pid), kEngaged)) << r.describe();
    EXPECT_EQ(warns(r, pid), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 1);
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1) << r.describe();
    expect_nothing_left(r, k);
  }
  expect_pair_imports(r);
  // The rank that joined second checked the pair, through NVML.
  EXPECT_TRUE(contains(r.log, "nvml nvmlDeviceGetP2PStatus a=")) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

// The same without an NVLink path, and without NVML: both ranks pass through and say why at
// INFO.
TEST(RouteSetup, IsolatedRanksWithoutNvlinkPassThroughWithInfoOnly) {
  expect_pair_passes_through(
      {"ranks", "2", "basic", "r0:FAKE_CUDA_ISOLATED=0", "r1:FAKE_CUDA_ISOLATED=1"},
      {{"DRV_DEVICE", "0"}, {"FAKE_NVML_NVLINK", "0"}}, "not visible in this process",
      /*warned=*/false);
}

TEST(RouteSetup, IsolatedRanksWithoutNvmlPassThroughWithInfoOnly) {
  expect_pair_passes_through(
      {"ranks", "2", "basic", "r0:FAKE_CUDA_ISOLATED=0", "r1:FAKE_CUDA_ISOLATED=1"},
      {{"DRV_DEVICE", "0"}, {"FAKE_NVML_FAIL_INIT", "1"}}, "not visible in this process",
      /*warned=*/false);
}

// A peer GPU that NVML does not know either (here: of another host seed, in a channel both see).
TEST(RouteSetup, PeerGpuUnknownToNvmlPassesThroughWithInfoOnly) {
  expect_pair_passes_through({"ranks", "2", "basic", "r1:FAKE_CUDA_UUID_SEED=1"},
                             {{"FAKE_CUDA_DEVICES", "1"}, {"DRV_DEVICE", "0"}},
                             "not visible in this process", /*warned=*/false);
}

TEST(RouteSetup, RankOnAnotherHostPassesThroughWithInfoOnly) {
  // Two "hosts" of one GPU each: another channel directory, another UUID seed.
  Scratch s, chan, chan1, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic", "r1:ZEROCTA_CHANNEL_DIR=" + chan1.dir(), "r1:FAKE_CUDA_UUID_SEED=1"},
      with(route_env(chan, rdv, unique_id_text()),
           {{"FAKE_CUDA_DEVICES", "1"}, {"DRV_DEVICE", "0"}}),
      s);
  expect_clean_pair(r, chan);
  expect_passthrough_pair(r, "spans hosts", /*warned=*/false);
  EXPECT_EQ(joined(files_in(chan1.dir())), "");
}

// The channel name of a 2-rank world from FAKE_NCCL_COMM_ID `id`: rank 1 lists the directory
// while rank 0 waits in its init.
std::string channel_name_of(const std::string& id) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic", "r1:DRV_SLEEP_BEFORE_INIT_MS=300", "r1:DRV_LIST_CHANNEL=1"},
                with(route_env(chan, rdv, id), {{"DRV_AG", "0"}}), s);
  EXPECT_EQ(rnum(r, 1, "exit"), 0) << r.describe();
  const std::string name = r.kv()["r1.channel_before_init"];
  EXPECT_EQ(name.rfind("zerocta-", 0), 0u) << "no channel while rank 0 was in its init\n"
                                           << r.describe();
  EXPECT_EQ(name.size(), 8u + 32u) << name;
  return name;
}

TEST(RouteSetup, ForeignFileAtTheChannelNamePassesThrough) {
  const std::string id = unique_id_text();
  const std::string name = channel_name_of(id);
  ASSERT_FALSE(name.empty());
  Scratch s, chan, rdv;
  const std::string path = chan.path(name);
  const std::string text = "not a zerocta channel\n";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  chmod(path.c_str(), 0644);
  RunResult r = run_route({"ranks", "2", "basic"}, route_env(chan, rdv, id), s);
  EXPECT_FALSE(r.timed_out) << r.describe();
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 1);
    EXPECT_EQ(rnum(r, k, "init.ce_ready"), 0);
    std::vector<std::string> said = shim_lines(r, pid_of(r, k), "WARN");
    for (const std::string& l : shim_lines(r, pid_of(r, k), "INFO")) said.push_back(l);
    EXPECT_TRUE(any_contains(said, "foreign channel segment")) << r.describe();
  }
  EXPECT_EQ(read_file(path), text) << "the foreign file was changed";
  EXPECT_EQ(joined(files_in(chan.dir())), name) << "only the foreign file may remain";
}

// A rank of a job of `dead_nranks` ranks with FAKE_NCCL_COMM_ID `id`, killed in its init with
// its channel joined: its file stays in `chan` (nobody froze it).
void leave_killed_rank(const Scratch& chan, const std::string& id, int dead_nranks) {
  Scratch s, rdv;
  RunResult dead =
      run_route({"ranks", "1", "hang"},
                with(route_env(chan, rdv, id),
                     {{"DRV_NRANKS", std::to_string(dead_nranks)}, {"DRV_KILL_MS", "300"}}),
                s);
  EXPECT_EQ(rnum(dead, 0, "exit"), 128 + SIGKILL) << dead.describe();
  EXPECT_EQ(files_in(chan.dir()).size(), 1u) << "the joined segment stays: nobody froze it";
}

// The next job with the same unique id (NCCL_COMM_ID) removes the dead rank's file and routes.
TEST(RouteSetup, SegmentLeftByARankKilledDuringSetUpIsReplacedByTheNextJob) {
  const std::string id = unique_id_text();
  Scratch chan;
  ASSERT_NO_FATAL_FAILURE(leave_killed_rank(chan, id, 2));
  Scratch s, rdv;
  RunResult r = run_route({"ranks", "2", "basic"}, route_env(chan, rdv, id), s);
  expect_clean_pair(r, chan);
  expect_committed_pair(r);
}

// ... also when the next job has another size: the dead job's file is of another shape.
TEST(RouteSetup, SegmentOfAnotherSizeLeftByAKilledRankIsReplaced) {
  const std::string id = unique_id_text();
  Scratch chan;
  ASSERT_NO_FATAL_FAILURE(leave_killed_rank(chan, id, 3));
  Scratch s, rdv;
  RunResult r = run_route({"ranks", "2", "basic"}, route_env(chan, rdv, id), s);
  expect_clean_pair(r, chan);
  expect_committed_pair(r);
}

// Another local user sees a parent's channel name in the channel directory, computes its
// child's name from it with zerocta's own code and creates a file there first: the child's
// name is keyed by the job's secret (the unique id's bytes), so the child routes all the same.
TEST(RouteSetup, AChildsChannelCannotBeTakenFromItsParentsName) {
  const std::string id = unique_id_text();
  const std::string parent = channel_name_of(id);
  ASSERT_FALSE(parent.empty());
  zc::CommKey seen;
  seen.hi = strtoull(parent.substr(8, 16).c_str(), nullptr, 16);
  seen.lo = strtoull(parent.substr(24, 16).c_str(), nullptr, 16);
  ASSERT_EQ("zerocta-" + seen.hex(), parent);
  // The world's first split, color 0 (rank_split's default).
  const std::string guess = "zerocta-" + zc::key_for_split(seen, 0, 0).hex();
  Scratch s, chan, rdv;
  const std::string path = chan.path(guess);
  const std::string text = "taken first\n";
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  RunResult r = run_route({"ranks", "2", "split", "r0:DRV_KEY=1", "r1:DRV_KEY=0"},
                          route_env(chan, rdv, id), s);
  EXPECT_FALSE(r.timed_out) << r.describe();
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "split.ce_ready"), 2) << "parent and child\n" << r.describe();
    EXPECT_EQ(rnum(r, k, "child_ag.ag_ce"), 1);
    EXPECT_EQ(rnum(r, k, "child_ag.data_ok"), 1);
  }
  EXPECT_EQ(read_file(path), text) << "the other user's file was changed";
  EXPECT_EQ(joined(files_in(chan.dir())), guess) << "only the other user's file may remain";
}

TEST(RouteSetup, FullChannelDirectoryPassesThrough) {
  Scratch s, chan, rdv;
  if (mount("tmpfs", chan.dir().c_str(), "tmpfs", 0, "size=8k,mode=0700") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << strerror(errno);
  {
    int fd = open(chan.path("filler").c_str(), O_WRONLY | O_CREAT, 0600);
    char block[1024] = {};
    while (fd >= 0 && write(fd, block, sizeof block) == static_cast<ssize_t>(sizeof block)) {
    }
    if (fd >= 0) close(fd);
  }
  RunResult r = run_route({"ranks", "2", "basic"}, route_env(chan, rdv, unique_id_text()), s);
  EXPECT_FALSE(r.timed_out);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 1);
    EXPECT_TRUE(any_contains(warns(r, pid_of(r, k)), "no room")) << r.describe();
  }
  const std::vector<std::string> left = files_in(chan.dir());
  unlink(chan.path("filler").c_str());
  umount2(chan.dir().c_str(), MNT_DETACH);
  EXPECT_EQ(joined(left), "filler") << "a temporary segment was left behind";
}

TEST(RouteSetup, ZeroctaChannelDirIsAKnownVariable) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"}, route_env(chan, rdv, unique_id_text()), s);
  EXPECT_FALSE(contains(r.err, "ZEROCTA_CHANNEL_DIR is not a zerocta variable")) << r.err;
}

// ---- 8. fork() with live communicators ----

TEST(RouteSetup, ForkedChildHasNoFdServiceAndItsCommDoesNotHang) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "fork"}, route_env(chan, rdv, unique_id_text()), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    // The parent keeps its route across the fork.
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1);
    EXPECT_EQ(rnum(r, k, "after_fork_ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "after_fork.ag_ce"), 2) << r.describe();
    EXPECT_EQ(rnum(r, k, "after_fork_ag.data_ok"), 1);
    EXPECT_EQ(rnum(r, k, "child_exit"), 0) << r.describe();
    // The child: no service, none started, its own world passes through.
    EXPECT_EQ(rnum(r, k, "child.fd_threads_at_start"), 0);
    EXPECT_EQ(rnum(r, k, "child.init.rc"), 0);
    EXPECT_EQ(rnum(r, k, "child.end.fd_threads"), 0) << "the child started an fd service";
    EXPECT_EQ(rnum(r, k, "child.ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "child.ag.ag_pass"), 1);
    EXPECT_EQ(rnum(r, k, "child.ag.ag_ce"), 0);
    EXPECT_EQ(rnum(r, k, "child.end.channel_files"), 0);
    const std::string child_pid = r.kv()["r" + std::to_string(k) + ".child.pid"];
    EXPECT_TRUE(any_contains(decisions(r, child_pid), "fd service")) << r.describe();
  }
}

// ---- 9. Nothing left behind ----

TEST(RouteSetup, RankKilledAfterInitLeavesNoChannelFile) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic", "r1:DRV_KILL_AFTER_INIT_MS=0"},
                with(route_env(chan, rdv, unique_id_text()), {{"FAKE_CUDA_WAIT_MS", "200"}}), s);
  EXPECT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(rnum(r, 1, "exit"), 128 + SIGKILL);
  EXPECT_EQ(rnum(r, 0, "exit"), 0) << r.describe();
  EXPECT_EQ(r.kv()["r0.done"], "1");
  expect_nothing_left(r, 0);
  EXPECT_EQ(joined(files_in(chan.dir())), "");
}

TEST(RouteSetup, AbortLeavesNothingBehind) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(route_env(chan, rdv, unique_id_text()), {{"DRV_END", "abort"}}), s);
  expect_clean_pair(r, chan);
  expect_committed_pair(r);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(rnum(r, k, "world.abort"), 0);
    expect_nothing_left(r, k);
  }
}

TEST(RouteSetup, FinalizeThenDestroyLeavesNothingBehind) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic"},
                with(route_env(chan, rdv, unique_id_text()), {{"DRV_END", "finalize"}}), s);
  expect_clean_pair(r, chan);
  expect_committed_pair(r);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(rnum(r, k, "world.finalize"), 0);
    EXPECT_EQ(rnum(r, k, "world.destroy"), 0);
    expect_nothing_left(r, k);
  }
}

// ---- 10. Each op's verdict and agreement ----

constexpr long long kNcclInvalidUsage = 5, kNcclRemoteError = 6;  // nccl.h

// Calls of the copy engines and the flags by one process, whatever they returned.
int copy_engine_lines(const RunResult& r, const std::string& pid) {
  return cuda_lines(r, "cuMemcpyAsync", pid) + cuda_lines(r, "cuStreamWaitValue32", pid) +
         cuda_lines(r, "cuStreamWriteValue32", pid);
}

TEST(RouteSetup, HostBuffersOnEveryRankSendTheOpToNccl) {
  // A committed comm whose buffers no peer can reach (host memory here; cudaMalloc memory
  // across processes alike): the first rank to arrive sends the op to NCCL, and every rank
  // follows. Nothing of the route runs.
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic"},
                with(route_env(chan, rdv, unique_id_text()), {{"DRV_AG_MEM", "host"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_TRUE(any_contains(decisions(r, pid), kEngaged)) << r.describe();
    EXPECT_EQ(warns(r, pid), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 0);
    EXPECT_EQ(copy_engine_lines(r, pid), 0) << r.describe();
    EXPECT_EQ(cuda_lines(r, "cuMemExportToShareableHandle", pid), 0);
    EXPECT_EQ(cuda_lines(r, "cuMemImportFromShareableHandle", pid), 0);
    expect_nothing_left(r, k);
  }
  EXPECT_EQ(static_cast<int>(log_calls(r, "ncclAllGather").size()), 2) << r.describe();
}

// Rank 0's buffers are host memory, rank 1's cuMem: the op's verdict is the first arrival's.
TEST(RouteSetup, UnreachableBuffersOfTheFirstRankSendEveryRankToNccl) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic", "r0:DRV_AG_MEM=host", "r1:DRV_SLEEP_BEFORE_AG_MS=300"},
                route_env(chan, rdv, unique_id_text()), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_EQ(warns(r, pid), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 1)
        << "rank 1's reachable buffers overruled rank 0's verdict\n"
        << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 0);
    EXPECT_EQ(copy_engine_lines(r, pid), 0) << r.describe();
    EXPECT_EQ(cuda_lines(r, "cuMemImportFromShareableHandle", pid), 0);
  }
  EXPECT_EQ(static_cast<int>(log_calls(r, "ncclAllGather").size()), 2) << r.describe();
}

TEST(RouteSetup, UnreachableBuffersOfTheLaterRankStillTakeTheRoute) {
  // Rank 1 arrives first with reachable buffers: the route. Rank 0 comes later, so nobody needs
  // its buffers: it does both copies through its imports of rank 1's, and exports nothing.
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic", "r0:DRV_AG_MEM=host", "r0:DRV_SLEEP_BEFORE_AG_MS=300"},
                route_env(chan, rdv, unique_id_text()), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0);
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 0);
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1) << r.describe();
    expect_nothing_left(r, k);
  }
  int imports[2] = {};
  expect_pair_imports(r, imports);
  EXPECT_EQ(imports[0], 2) << "rank 0, the later one, reads and writes rank 1's buffers";
  EXPECT_EQ(imports[1], 0) << "rank 1 imported host memory of rank 0";
  EXPECT_EQ(cuda_lines(r, "cuMemExportToShareableHandle", pid_of(r, 0)), 0);
  EXPECT_EQ(nccl_collective_lines(r), 0) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

// N ranks in arrival order 0, 1, ... (each sleeps 120 ms x its rank before every op) whose
// ranks in `unreachable` use host memory, which no peer reaches: the first rank's reachable
// buffers send every op to the copy engines, so a later unreachable rank takes part through its
// stage when ranks arrive after it (stage_buffer.h), and does both copies of its pairs with the
// earlier ones. Every op moves the right bytes on every rank, and no rank warns.
RunResult run_ordered(int nranks, const std::vector<int>& unreachable, const Env& more,
                      const Scratch& s, const Scratch& chan, const Scratch& rdv) {
  std::vector<std::string> args = {"ranks", std::to_string(nranks), "basic"};
  for (int k = 1; k < nranks; ++k)
    args.push_back("r" + std::to_string(k) + ":DRV_SLEEP_EACH_AG_MS=" + std::to_string(120 * k));
  for (int k : unreachable) args.push_back("r" + std::to_string(k) + ":DRV_AG_MEM=host");
  // The ranks meet before every op with their buffers ready, so that the sleeps alone order
  // them: a rank still preparing its buffers on a loaded machine must not arrive out of turn.
  Env env =
      with(route_env(chan, rdv, unique_id_text()), {{"ZEROCTA_ALLGATHER", "zerocta"},
                                                    {"ZEROCTA_STATS", s.dir() + "/stats-%p.json"},
                                                    {"DRV_AG_BARRIER", "1"},
                                                    {"DRV_TIMEOUT_S", "40"}});
  return run_route(args, with(env, more), s);
}

void expect_every_op_routed(const RunResult& r, int nranks, int ops) {
  for (int k = 0; k < nranks; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), ops);
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 0);
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1) << r.describe();
    expect_nothing_left(r, k);
  }
  EXPECT_EQ(nccl_collective_lines(r), 0) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

TEST(RouteSetup, AnUnreachableRankBetweenOthersTakesPartThroughItsStage) {
  // Rank 1 of 3 arrives second with host memory. Before stages it was an error
  // (ncclInvalidUsage: "this rank's buffers cannot be reached by later peers").
  constexpr int kOps = 3;
  Scratch s, chan, rdv;
  RunResult r = run_ordered(3, {1}, {{"DRV_AG_REPEAT", std::to_string(kOps)}}, s, chan, rdv);
  expect_clean_pair(r, chan, 3);
  expect_every_op_routed(r, 3, kOps);
  const std::string staged = pid_of(r, 1);
  EXPECT_EQ(json_number(stats_file(s, staged), "staged_ops"), kOps) << r.describe();
  EXPECT_EQ(json_number(stats_file(s, pid_of(r, 0)), "staged_ops"), 0);
  EXPECT_EQ(json_number(stats_file(s, pid_of(r, 2)), "staged_ops"), 0);
  // One stage of the op's size, allocated once and exported once; only rank 2 imports it.
  EXPECT_EQ(cuda_calls(r, "cuMemCreate", staged), 1) << r.describe();
  EXPECT_EQ(cuda_calls(r, "cuMemExportToShareableHandle", staged), 1) << r.describe();
  // It does both copies with rank 0 through rank 0's two buffers, and its push issuer pushes
  // its chunk into rank 2, which claimed "each pushes".
  EXPECT_EQ(cuda_calls(r, "cuMemImportFromShareableHandle", staged), 3) << r.describe();
  EXPECT_EQ(cuda_calls_with(r, "cuMemImportFromShareableHandle", staged, " thread=zerocta-push "),
            1)
      << r.describe();
}

TEST(RouteSetup, StagesGrowWithTheOpAndTwoStagedRanksReachEachOther) {
  // Ranks 1 and 2 of 4 with host memory: both staged, rank 2 reaching rank 1 through rank 1's
  // stage. Every op is larger than the last (1, 2, 3, 4 MiB per rank, fresh buffers each): the
  // stages grow, and an outgrown one is released once the next op has started on the rank's
  // streams — seen at the latest after the op after that, before the teardown.
  constexpr int kOps = 4;
  Scratch s, chan, rdv;
  RunResult r = run_ordered(4, {1, 2},
                            {{"DRV_AG_REPEAT", std::to_string(kOps)},
                             {"DRV_AG_GROW", "1"},
                             {"DRV_AG_BYTES", std::to_string(1 << 20)}},
                            s, chan, rdv);
  expect_clean_pair(r, chan, 4);
  expect_every_op_routed(r, 4, kOps);
  for (int k : {1, 2}) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_EQ(json_number(stats_file(s, pid), "staged_ops"), kOps) << r.describe();
    EXPECT_EQ(cuda_calls(r, "cuMemCreate", pid), kOps) << "one stage per size\n" << r.describe();
    const std::vector<std::string> lines = r.log_lines();
    std::vector<std::string> handles;  // of the stages, in the order they were made
    for (const std::string& line : lines)
      if (line.rfind("cuda cuMemCreate ", 0) == 0 && contains(line, " pid=" + pid + " -> 0"))
        handles.push_back(log_fields(line)["handle"]);
    ASSERT_EQ(handles.size(), static_cast<size_t>(kOps));
    auto at = [&](const std::string& fn, const std::string& handle) {
      for (size_t i = 0; i < lines.size(); ++i)
        if (lines[i].rfind("cuda " + fn + " ", 0) == 0 && contains(lines[i], " pid=" + pid) &&
            log_fields(lines[i])["handle"] == handle)
          return static_cast<long>(i);
      return -1L;
    };
    const long first_released = at("cuMemRelease", handles[0]);
    EXPECT_GE(first_released, 0) << r.describe();
    EXPECT_LT(first_released, at("cuMemCreate", handles[kOps - 1]))
        << "the first stage was kept until the teardown\n"
        << r.describe();
  }
}

// `nranks` ranks create a communicator `cycles` times one after another, each with the same
// unique id (NCCL_COMM_ID), one routed all-gather, then end it (`more` says how). Between cycle
// 10 and the last, nothing of the route accumulates: open descriptors, threads (the fd
// service stays one), the driver's live objects, pinned registrations, channel files;
// resident memory grows by less than 2 MiB.
void expect_cycles_leave_nothing(int nranks, const std::vector<std::string>& rank_args,
                                 const Env& more, int cycles = 120) {
  const int kCycles = cycles;
  Scratch s, chan, rdv;
  std::vector<std::string> args = {"ranks", std::to_string(nranks), "cycles"};
  args.insert(args.end(), rank_args.begin(), rank_args.end());
  RunResult r = run_route(
      args,
      with(with(route_env(chan, rdv, unique_id_text()), {{"DRV_CYCLES", std::to_string(kCycles)},
                                                         {"DRV_CYCLES_WARM", "10"},
                                                         {"ZEROCTA_LOG", "warn"},
                                                         {"DRV_TIMEOUT_S", "60"}}),
           more),
      s);
  expect_clean_pair(r, chan, nranks);
  for (int k = 0; k < nranks; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "last.ag_ce"), kCycles) << "every cycle's all-gather took the route";
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1);
    // Descriptors and threads may include a peer's request to the fd service in flight when
    // sampled: 2 of slack (a leak is one or more per cycle).
    for (const char* what : {"fds", "threads"})
      EXPECT_LE(rnum(r, k, std::string("last.") + what),
                rnum(r, k, std::string("warm.") + what) + 2)
          << what << " grew over " << kCycles - 10 << " cycles\n"
          << r.describe();
    for (const char* what : {"pool_bytes", "live_alloc", "live_reserve", "live_map", "live_stream",
                             "live_event", "live_hostreg"})
      EXPECT_LE(rnum(r, k, std::string("last.") + what), rnum(r, k, std::string("warm.") + what))
          << what << " grew over " << kCycles - 10 << " cycles\n"
          << r.describe();
    EXPECT_EQ(rnum(r, k, "last.channel_files"), 0);
    EXPECT_EQ(rnum(r, k, "last.pool_bytes"), 0);
    EXPECT_LT(rnum(r, k, "last.rss_kib") - rnum(r, k, "warm.rss_kib"), 2048) << r.describe();
  }
}

TEST(RouteSetup, CreateAndDestroyCyclesLeaveNothingBehind) {
  // Exports of freed buffers used to be kept by the fd service of every communicator that
  // ended before its first export sweep, 64 ops in: 2 descriptors (and their memory) a cycle.
  expect_cycles_leave_nothing(2, {}, {});
}

TEST(RouteSetup, CreateAndAbortCyclesLeaveNothingBehind) {
  expect_cycles_leave_nothing(2, {}, {{"DRV_END", "abort"}});
}

TEST(RouteSetup, NonBlockingCyclesPolledByAnotherThreadLeaveNothingBehind) {
  // The freeze runs in the polling thread's ncclCommGetAsyncError, the route's preparation on
  // the main thread at the first all-gather.
  expect_cycles_leave_nothing(2, {}, {{"DRV_NB", "1"}, {"DRV_POLL", "thread"}});
}

TEST(RouteSetup, CyclesDestroyedOnASecondThreadLeaveNothingBehind) {
  // Process groups torn down in the background: each communicator destroyed by another
  // thread, up to 4 behind its creation (the GPU run measured RSS growth in this pattern, with
  // or without the library: docs/RELIABILITY.md). Nothing of the route may stay behind.
  expect_cycles_leave_nothing(2, {}, {{"DRV_CYCLES_DESTROY_LAG", "4"}});
}

TEST(RouteSetup, CyclesWithAStagedRankLeaveNothingBehind) {
  // Rank 1 of 3 with host memory arrives second every time (gaps wide enough for a loaded
  // machine: a first arrival with host memory would send the op to NCCL): a stage per
  // communicator.
  expect_cycles_leave_nothing(
      3, {"r1:DRV_SLEEP_EACH_AG_MS=60", "r2:DRV_SLEEP_EACH_AG_MS=120", "r1:DRV_AG_MEM=host"},
      {{"ZEROCTA_ALLGATHER", "zerocta"}}, 60);
}

TEST(RouteSetup, AnEarlierRankWaitsForNoPeerItsPushFollowsTheLaterRanksClaim) {
  // Rank 1 arrives long after rank 0. Rank 0's call does not wait for it (before the push
  // issuer it waited up to its pair wait's cap, then settled "later does both": imports 0 and 2):
  // its push issuer pushes rank 0's chunk once rank 1 claimed "each pushes".
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic", "r1:DRV_SLEEP_BEFORE_AG_MS=300"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"ZEROCTA_STATS", s.dir() + "/stats-%p.json"}}),
                          s);
  expect_clean_pair(r, chan);
  expect_committed_pair(r);
  int imports[2] = {};
  expect_pair_imports(r, imports);
  EXPECT_EQ(imports[0], 1) << r.describe();
  EXPECT_EQ(imports[1], 1) << r.describe();
  const std::string early = pid_of(r, 0);
  EXPECT_EQ(cuda_calls_with(r, "cuMemcpyAsync", early, " thread=zerocta-push "), 1)
      << r.describe();
  EXPECT_EQ(cuda_calls_with(r, "cuMemImportFromShareableHandle", early, " thread=zerocta-push "),
            1)
      << r.describe();
  EXPECT_EQ(json_number(stats_file(s, early), "host_pair_wait_micros"), 0) << r.describe();
  for (int k = 0; k < 2; ++k) expect_nothing_left(r, k);
}

// The comm-order hooks process `pid` logged (ZEROCTA_LOG=debug), in order: A, an op forwarded
// to NCCL waits for a routed all-gather; E, it marks its end; G, a routed all-gather waits for
// that mark (comm_order.h).
std::string comm_order_of(const RunResult& r, const std::string& pid) {
  std::string order;
  for (const std::string& line : r.err_lines()) {
    if (line.find(":" + pid + ":") == std::string::npos) continue;
    if (contains(line, "an op forwarded to NCCL waits for routed all-gather")) order += 'A';
    if (contains(line, "an op forwarded to NCCL marks its end")) order += 'E';
    if (contains(line, "waits for the op forwarded to NCCL before it")) order += 'G';
  }
  return order;
}

// Three all-gathers on 2 ranks, each with an all-reduce as DRV_AG_INTERLEAVE says: every
// all-gather routed, the data right, the hooks logged in the order `want` (comm_order_of).
void expect_comm_order(const char* interleave, const std::string& want) {
  SCOPED_TRACE(std::string("DRV_AG_INTERLEAVE=") + interleave);
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"ZEROCTA_LOG", "debug"},
                                {"DRV_AG_REPEAT", "3"},
                                {"DRV_AG_INTERLEAVE", interleave}}),
                          s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    expect_rank_routed(r, k, 3);
    EXPECT_EQ(comm_order_of(r, pid_of(r, k)), want) << r.describe();
    expect_nothing_left(r, k);
  }
}

TEST(RouteSetup, OpsForwardedToNcclKeepNcclsOrderWithTheRoutedAllGathers) {
  // NCCL runs a communicator's ops one after the other whatever their streams; the routed
  // all-gathers keep that order (comm_order.h). Each of 3 all-gathers is followed by an
  // all-reduce on another stream: the all-reduce waits for the all-gather before it, and the
  // next all-gather for the all-reduce — also where the all-reduce is in a group of its own
  // (its end marked after the group's end). Back-to-back all-gathers (no all-reduce) wait for
  // nothing of the kind.
  expect_comm_order("1", "AEGAEGAE");
  expect_comm_order("2", "AEGAEGAE");
  expect_comm_order("0", "");
}

TEST(RouteSetup, AGroupOfAnAllGatherAndAnOpForNcclRunsTheGroupsNcclOpFirst) {
  // One group holds an all-gather and an all-reduce on another stream. NCCL enqueues the
  // all-reduce at the group's end, where zerocta then issues the routed all-gather: the
  // all-reduce's end is marked once NCCL's end returned, and the all-gather waits for it; the
  // next group's all-reduce waits for that all-gather. (The first group's all-reduce comes
  // before the route is prepared, by the all-gather at that group's end: nothing to order.)
  expect_comm_order("3", "AEGAEG");
}

TEST(RouteSetup, ManyOpsOnTheSameBuffersWrapTheOpRing) {
  // 40 ops, more than twice the exchange's ring of 16 slots, on the same buffers: every slot is
  // reused, each op's data is checked, and each allocation of the peer is imported once at
  // most, whatever each op's pair settled on (the imports are cached by block id).
  constexpr int kOps = 40;
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic"},
      with(route_env(chan, rdv, unique_id_text()), {{"DRV_AG_REPEAT", std::to_string(kOps)},
                                                    {"ZEROCTA_STATS", s.dir() + "/stats-%p.json"}}),
      s);
  expect_clean_pair(r, chan);
  int copies = 0;
  long long pairs = 0;
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    expect_rank_routed(r, k, kOps);
    EXPECT_LE(cuda_calls(r, "cuMemImportFromShareableHandle", pid), 2) << r.describe();
    EXPECT_LE(cuda_calls(r, "cuMemExportToShareableHandle", pid), 2) << r.describe();
    copies += cuda_calls(r, "cuMemcpyAsync", pid);
    pairs += pairs_settled(stats_file(s, pid));
    expect_nothing_left(r, k);
  }
  // Per op: each rank's own chunk, and the two chunks that cross, whoever copies them.
  EXPECT_EQ(copies, 4 * kOps) << r.describe();
  // Per op one pair, settled and counted by its later rank.
  EXPECT_EQ(pairs, kOps) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

TEST(RouteSetup, EightProcessesRouteEveryAllGatherInAndOutOfPlace) {
  // One process per GPU of an 8-GPU host, which the GPU tests never had: auto stops at
  // ZEROCTA_AUTO_MAX_RANKS=4 until 8 GPUs are measured, so this asks for the route itself.
  // Every op of every rank takes it and gathers the right bytes, through the op ring's wrap
  // and buffers freed and made again, and each op is 28 pairs settled by their later ranks.
  constexpr int kRanks = 8, kOps = 20;
  for (const char* in_place : {"0", "1"}) {
    SCOPED_TRACE(std::string("DRV_AG_IN_PLACE=") + in_place);
    Scratch s, chan, rdv;
    RunResult r = run_route({"ranks", std::to_string(kRanks), "basic"},
                            with(route_env(chan, rdv, unique_id_text()),
                                 {{"FAKE_CUDA_DEVICES", std::to_string(kRanks)},
                                  {"ZEROCTA_ALLGATHER", "zerocta"},
                                  {"DRV_AG_REPEAT", std::to_string(kOps)},
                                  {"DRV_AG_FRESH_EVERY", "7"},
                                  {"DRV_AG_IN_PLACE", in_place},
                                  {"ZEROCTA_STATS", s.dir() + "/stats-%p.json"}}),
                            s);
    expect_clean_pair(r, chan, kRanks);
    long long pairs = 0;
    for (int k = 0; k < kRanks; ++k) {
      SCOPED_TRACE("rank " + std::to_string(k));
      expect_rank_routed(r, k, kOps);
      EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
      pairs += pairs_settled(stats_file(s, pid_of(r, k)));
      expect_nothing_left(r, k);
    }
    EXPECT_EQ(pairs, kOps * kRanks * (kRanks - 1) / 2) << r.describe();
    EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
  }
}

TEST(RouteSetup, ABufferAcrossSeveralAllocationsIsOneCopyPerPeer) {
  // Buffers laid across 2 MiB allocations mapped back to back (PyTorch's expandable segments
  // use 20 MiB ones): 5 MiB per rank, so each chunk a peer writes or reads lies in 3 of them.
  // A peer maps the allocations it imports back to back as they lie in their owner's address
  // space, so every chunk still moves in one copy — not one per allocation, each with its own
  // start-up cost — and ops on the same buffers import and map nothing more, and describe
  // them with one driver query per allocation.
  constexpr int kOps = 3;
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"DRV_AG_BYTES", std::to_string(5 << 20)},
                                {"DRV_AG_CHUNK", std::to_string(2 << 20)},
                                {"DRV_AG_REPEAT", std::to_string(kOps)}}),
                          s);
  expect_clean_pair(r, chan);
  int copies = 0;
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    expect_rank_routed(r, k, kOps);
    copies += cuda_calls(r, "cuMemcpyAsync", pid);
    // At most the peer's 3 allocations under the chunk it writes to and the 3 under the chunk it
    // reads, once each, whatever the later ops do.
    EXPECT_LE(cuda_calls(r, "cuMemImportFromShareableHandle", pid), 6) << r.describe();
    // Its own 3 + 5 allocations, and each import mapped once.
    EXPECT_EQ(cuda_calls(r, "cuMemMap", pid),
              8 + cuda_calls(r, "cuMemImportFromShareableHandle", pid))
        << r.describe();
    // Describing its buffers (8 allocations) for its peer: the first op learns and exports each
    // allocation (2 queries: its block id, then its mapping's four attributes at once), later
    // ops know it by its block id (1 query). (The housekeeping thread's queries, one per export
    // a period, are no op's.)
    EXPECT_LE(app_cuda_calls(r, "cuPointerGetAttribute", pid) +
                  app_cuda_calls(r, "cuPointerGetAttributes", pid),
              8 * 2 + (kOps - 1) * 8 + 4)
        << r.describe();
    expect_nothing_left(r, k);
  }
  // Per op: each rank's own chunk, and the two chunks that cross, whoever copies them.
  EXPECT_EQ(copies, 4 * kOps) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}


TEST(RouteSetup, FabricOnlyBuffersAreReachedThroughTheirFabricHandles) {
  // On an IMEX node PyTorch's expandable segments may export FABRIC handles only: no POSIX fd.
  // Their 64 bytes go through the owner's fd service as blobs, the peer imports them as FABRIC
  // handles, and the op takes the route as with descriptors; in place and out of place, over
  // allocations mapped back to back, with buffers freed and made anew between ops.
  constexpr int kOps = 6;
  for (const char* in_place : {"0", "1"}) {
    SCOPED_TRACE(std::string("in place ") + in_place);
    Scratch s, chan, rdv;
    RunResult r = run_route({"ranks", "2", "basic"},
                            with(route_env(chan, rdv, unique_id_text()),
                                 {{"DRV_AG_MEM", "fabric"},
                                  {"DRV_AG_IN_PLACE", in_place},
                                  {"DRV_AG_BYTES", std::to_string(5 << 20)},
                                  {"DRV_AG_CHUNK", std::to_string(2 << 20)},
                                  {"DRV_AG_FRESH_EVERY", "3"},
                                  {"DRV_AG_REPEAT", std::to_string(kOps)}}),
                            s);
    expect_clean_pair(r, chan);
    int all_imports = 0;
    for (int k = 0; k < 2; ++k) {
      SCOPED_TRACE("rank " + std::to_string(k));
      const std::string pid = pid_of(r, k);
      expect_rank_routed(r, k, kOps);
      const int imports = cuda_calls(r, "cuMemImportFromShareableHandle", pid);
      all_imports += imports;
      EXPECT_EQ(cuda_calls_with(r, "cuMemImportFromShareableHandle", pid, "type=8"), imports)
          << "every import a FABRIC handle";
      EXPECT_EQ(cuda_calls_with(r, "cuMemExportToShareableHandle", pid, "type=1"), 0);
      EXPECT_GT(cuda_calls_with(r, "cuMemExportToShareableHandle", pid, "type=8"), 0);
      expect_nothing_left(r, k);
    }
    // A rank that arrived first each time and left both copies to its peer imports nothing.
    EXPECT_GT(all_imports, 0) << r.describe();
  }
}

// The mappings of imported allocations one process unmapped within its routed ops: its
// fake-driver lines between two of its cuStreamIsCapturing calls (one a routed op); what
// follows its last op (teardown) is not counted, nor are the program's unmaps of its own memory,
// nor the housekeeping thread's (no op's host time; it unmaps while the copies are idle).
struct ImportUnmaps {
  int most_in_one_op = 0, within_ops = 0;
  int by_housekeeping = 0;  // the housekeeping thread's, between ops or after the last
};
ImportUnmaps import_unmaps_by_op(const RunResult& r, const std::string& pid) {
  auto field = [](const std::string& line, const std::string& key) {
    const size_t at = line.find(" " + key + "=");
    return at == std::string::npos ? std::string()
                                   : line.substr(at + key.size() + 2,
                                                 line.find(' ', at + key.size() + 2) - at -
                                                     key.size() - 2);
  };
  std::set<std::string> imported, mapped;
  ImportUnmaps u;
  int now = 0;
  for (const std::string& line : r.log_lines()) {
    if (!contains(line, " pid=" + pid + " -> 0")) continue;
    if (line.rfind("cuda cuStreamIsCapturing ", 0) == 0) {
      u.most_in_one_op = std::max(u.most_in_one_op, now);
      u.within_ops += now;
      now = 0;
    } else if (line.rfind("cuda cuMemImportFromShareableHandle ", 0) == 0) {
      imported.insert(field(line, "handle"));
    } else if (line.rfind("cuda cuMemMap ", 0) == 0 && imported.count(field(line, "handle"))) {
      mapped.insert(field(line, "ptr"));
    } else if (line.rfind("cuda cuMemUnmap ", 0) == 0 && mapped.erase(field(line, "ptr"))) {
      // Erased: the address may hold the program's own memory later.
      if (contains(line, " thread=zerocta-hk "))
        ++u.by_housekeeping;
      else
        ++now;
    }
  }
  return u;
}

// Driver calls that releasing peers' memory may make after one routed op (peer_memory.cc).
constexpr int kReleaseCallsPerOp = 4;

TEST(RouteSetup, ImportsOfBuffersTheirOwnerFreedAreReleased) {
  // New buffers every 10 ops, the old ones freed first (a caching allocator's empty_cache()):
  // 30 generations of allocations. A peer's import of a freed allocation would keep its memory
  // alive, out of its allocator's sight; the owner withdraws the export at its next sweep and
  // the importer, asking half a sweep (32 ops) later, releases the mapping once the ops that
  // used it are done. So at the end a rank holds the imports of the last few generations only
  // (up to 2 granules of 2 MiB each per generation), not of all 30 — and never imported an
  // allocation twice.
  constexpr int kOps = 300, kFreshEvery = 10, kGenerations = kOps / kFreshEvery;
  constexpr long long kGranule = 2LL << 20;
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"DRV_AG_REPEAT", std::to_string(kOps)},
                                {"DRV_AG_FRESH_EVERY", std::to_string(kFreshEvery)},
                                {"ZEROCTA_STATS", s.dir() + "/stats-%p.json"}}),
                          s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    expect_rank_routed(r, k, kOps);
    const int imports = cuda_calls(r, "cuMemImportFromShareableHandle", pid);
    EXPECT_GE(imports, kGenerations / 2) << r.describe();
    EXPECT_LE(imports, 2 * kGenerations) << "an allocation imported twice\n" << r.describe();
    // Held at the end: the last generations, whose frees no sweep has seen yet (at most 8).
    EXPECT_LE(rnum(r, k, "ag.pool_bytes"), 8 * 2 * kGranule + (1 << 20))
        << imports << " imports; the freed ones are still mapped\n"
        << r.describe();
    EXPECT_GE(cuda_calls(r, "cuMemUnmap", pid), imports - 16) << r.describe();
    // A few unmaps a routed op (each takes ~100 us of host time on a real driver), though a
    // sweep finds several generations freed at once.
    EXPECT_LE(import_unmaps_by_op(r, pid).most_in_one_op, kReleaseCallsPerOp) << r.describe();
    // The stats file (written at the communicator's teardown) counts the same mappings, and
    // the releases unmapped some of them.
    const std::string json = stats_file(s, pid);
    EXPECT_TRUE(contains(json, "\"peer_mappings\":" + std::to_string(imports) + ",")) << json;
    EXPECT_FALSE(contains(json, "\"peer_unmapped_bytes\":0,")) << json;
    // Every routed op's host time is counted, by phase.
    EXPECT_EQ(json_number(json, "host_ops"), kOps) << json;
    EXPECT_GT(json_number(json, "host_post_micros"), 0) << json;
    expect_nothing_left(r, k);
  }
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

TEST(RouteSetup, AFreedBufferOfManyAllocationsIsUnmappedAFewAllocationsPerOp) {
  // 12 MiB per rank in 2 MiB allocations (a 1 GiB tensor of PyTorch's 20 MiB chunks, scaled
  // down), new buffers every 64 ops: the view a peer mapped over each freed chunk spans 6 or 7
  // allocations. Unmapping them all within one op held a real host ~5 ms and made the
  // peers give up waiting for it; so no op unmaps more than a few, and yet every freed
  // generation's mappings go within the run.
  constexpr int kOps = 256, kFreshEvery = 64;
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(route_env(chan, rdv, unique_id_text()),
                               {{"DRV_AG_BYTES", std::to_string(12 << 20)},
                                {"DRV_AG_CHUNK", std::to_string(2 << 20)},
                                {"DRV_AG_REPEAT", std::to_string(kOps)},
                                {"DRV_AG_FRESH_EVERY", std::to_string(kFreshEvery)},
                                {"DRV_TIMEOUT_S", "60"}}),
                          s);
  expect_clean_pair(r, chan);
  // A rank that always arrived first and left both copies to its peer imports nothing (the
  // fake's copies are slow, its waits short): the counts are summed over both ranks.
  int imports = 0, before_teardown = 0;
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    expect_rank_routed(r, k, kOps);
    imports += cuda_calls(r, "cuMemImportFromShareableHandle", pid);
    const ImportUnmaps u = import_unmaps_by_op(r, pid);
    EXPECT_LE(u.most_in_one_op, kReleaseCallsPerOp) << r.describe();
    before_teardown += u.within_ops + u.by_housekeeping;
    expect_nothing_left(r, k);
  }
  EXPECT_GE(imports, 4 * 6) << r.describe();  // a view of each generation at least
  // (Whether the ops' own pace reaches 2 an op is not told any more: between ops, while the
  // copies are idle, the housekeeping thread may release a generation first.)
  // Of the four generations, the first three were freed (and their exports withdrawn and
  // noticed) early enough for their mappings to go before the teardown (how many each
  // generation's imports were varies with who copied: a third of them at least).
  EXPECT_GE(before_teardown, imports / 3) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

// NCCL's lines in the fake's log from the first <rank>.idle-begin marker to the last
// <rank>.idle-end one (drv_route's idle_watch: the ranks meet before and after it); -1 when a
// marker is missing.
int nccl_lines_while_idle(const RunResult& r, int nranks) {
  const std::vector<std::string> lines = r.log_lines();
  size_t first = lines.size(), last = 0;
  int markers = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    for (int k = 0; k < nranks; ++k) {
      const std::string rank = "marker r" + std::to_string(k) + ".";
      if (lines[i] == rank + "idle-begin") first = std::min(first, i), ++markers;
      if (lines[i] == rank + "idle-end") last = std::max(last, i), ++markers;
    }
  }
  if (markers != 2 * nranks) return -1;
  int n = 0;
  for (size_t i = first; i <= last; ++i) n += lines[i].rfind("nccl", 0) == 0;
  return n;
}

TEST(RouteSetup, FreedBuffersAreGivenBackWithNoFurtherNcclCall) {
  // Both ranks free every all-gather buffer (empty_cache(), an OOM retry, an evaluation or
  // checkpoint phase without all-gathers) and make no NCCL call. An export keeps its allocation
  // alive (the fd service's duplicate of its descriptor), and so does a peer's import: the
  // housekeeping thread of each rank withdraws its exports and releases its imports of the
  // peer's freed allocations within two periods of 200 ms (housekeeping.h). Watched for up to
  // 5 s (a loaded 2-core machine): nothing of the fake driver's memory is held any more on
  // either rank — no memfd descriptor, allocation handle, mapping or reservation — and no NCCL
  // call was made meanwhile. Before, all of it stayed until later routed all-gathers.
  constexpr int kOps = 3;
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic"},
      with(route_env(chan, rdv, unique_id_text()), {{"DRV_AG_BYTES", std::to_string(5 << 20)},
                                                    {"DRV_AG_CHUNK", std::to_string(2 << 20)},
                                                    {"DRV_AG_REPEAT", std::to_string(kOps)},
                                                    {"DRV_IDLE_WATCH_MS", "5000"}}),
      s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    expect_rank_routed(r, k, kOps);
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    // At least its exports were held when the watch began: something to give back.
    EXPECT_GT(rnum(r, k, "idle.memfds_start"), 0) << r.describe();
    EXPECT_GE(rnum(r, k, "idle.clean_ms"), 0)
        << "the freed buffers' memory is still held after 5 s\n"
        << r.describe();
    EXPECT_EQ(rnum(r, k, "idle.memfds"), 0);
    for (const char* kind : {"alloc", "map", "reserve"})
      EXPECT_EQ(rnum(r, k, std::string("idle.live_") + kind), 0) << kind;
    EXPECT_LT(rnum(r, k, "idle.pool_bytes"), 1 << 20) << "imports of the peer's memory are held";
  }
  EXPECT_EQ(nccl_lines_while_idle(r, 2), 0) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

// The route's environment for buffers of many small allocations: 64 KiB granules, `allocations`
// of them per rank's chunk (a send buffer of as many, a receive buffer of twice as many).
Env many_allocations(Env env, int allocations) {
  return with(std::move(env), {{"FAKE_CUDA_GRANULARITY", std::to_string(64 << 10)},
                               {"DRV_AG_CHUNK", std::to_string(64 << 10)},
                               {"DRV_AG_BYTES", std::to_string(allocations * (64 << 10))}});
}

// Rank k's shim said that it is short of descriptors (fd_headroom.h), at INFO.
bool told_descriptors_short(const RunResult& r, int k) {
  return any_contains(shim_lines(r, pid_of(r, k), "INFO"), "zerocta INFO descriptors: ");
}

TEST(RouteSetup, ADescriptorShortageOnEveryRankSendsTheOpsToNcclNeverAnError) {
  // Buffers of 100 + 200 allocations per rank, and a soft RLIMIT_NOFILE 340 above what each
  // rank has open once its buffers exist (in the fake driver each of its own mappings holds a
  // descriptor): exporting every allocation would leave too few for the peer's, so each rank
  // stops exporting while 64 are still free, posts its buffers as unreachable and says so, and
  // the first rank to arrive sends each op to NCCL on both. Never an error, a poison or a wait
  // left unsatisfied. (Before, both exported all 300 and the import of 100 of the peer's
  // descriptors at once was truncated: "descriptors truncated", the communicator poisoned.)
  // The fake NCCL moves no data: the ops NCCL ran are not data-checked.
  constexpr int kOps = 3;
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(many_allocations(route_env(chan, rdv, unique_id_text()), 100),
                               {{"DRV_AG_REPEAT", std::to_string(kOps)},
                                {"DRV_NOFILE_HEADROOM", "340"},
                                {"DRV_AG_CHECK", "1"}}),
                          s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "nofile_rc"), 0);
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    EXPECT_TRUE(told_descriptors_short(r, k)) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.async"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), kOps + 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 0);
  }
  EXPECT_EQ(static_cast<int>(log_calls(r, "ncclAllGather").size()), 2 * (kOps + 1));
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

TEST(RouteSetup, ALaterRankShortOfDescriptorsStillTakesPartInTheRoutedOp) {
  // Rank 1 has 55 descriptors to spare, fewer than the 64 a post needs, and arrives 300 ms after
  // rank 0, whose buffers (10 + 20 allocations) can be reached: rank 0's verdict sends the op to
  // the copy engines, and rank 1 must take part. It posted its buffers as unreachable and
  // exported nothing, so it does both copies of the pair, importing rank 0's 20 allocations a
  // batch its descriptors allow at a time: the op is right on both ranks, and the next one (a
  // verdict of whoever comes first) fails nowhere either. (Before, rank 1 exported its 30
  // allocations, and fetching rank 0's at once ran out: the communicator poisoned.)
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic", "r1:DRV_NOFILE_HEADROOM=55", "r1:DRV_SLEEP_BEFORE_AG_MS=300"},
      with(many_allocations(route_env(chan, rdv, unique_id_text()), 10), {{"DRV_AG_CHECK", "1"}}),
      s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1) << r.describe();
    EXPECT_GE(rnum(r, k, "ag.ag_ce"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.async"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_rc"), 0) << r.describe();
  }
  EXPECT_TRUE(told_descriptors_short(r, 1)) << r.describe();
  EXPECT_FALSE(told_descriptors_short(r, 0)) << r.describe();
  EXPECT_EQ(cuda_calls(r, "cuMemExportToShareableHandle", pid_of(r, 1)), 0) << r.describe();
  EXPECT_EQ(cuda_calls(r, "cuMemImportFromShareableHandle", pid_of(r, 1)), 20) << r.describe();
  EXPECT_EQ(cuda_calls(r, "cuMemImportFromShareableHandle", pid_of(r, 0)), 0) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

// Both ranks of a pair whose op differed (DRV_AG_CHECK=1): each saw an error — from its op, else
// from ncclCommGetAsyncError after it — and its next call fails too; one WARN names `why`; the
// earlier rank's wait was released by the poison, not by the fake's time limit.
void expect_error_on_both(const RunResult& r, const std::string& why) {
  bool warned = false;
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    warned = warned || any_contains(warns(r, pid_of(r, k)), why);
    long long seen = rnum(r, k, "ag.rc");
    if (seen == 0) seen = rnum(r, k, "ag.async");
    EXPECT_TRUE(seen == kNcclInvalidUsage || seen == kNcclRemoteError)
        << "no error after the op: " << seen << "\n"
        << r.describe();
    const long long next = rnum(r, k, "ag.next_rc");
    EXPECT_TRUE(next == kNcclInvalidUsage || next == kNcclRemoteError)
        << "the next call on a poisoned comm: " << next << "\n"
        << r.describe();
  }
  EXPECT_TRUE(warned) << r.describe();
  EXPECT_EQ(waits_not_satisfied(r), 0) << r.describe();
}

TEST(RouteSetup, RanksIssuingDifferentCountsAtOnePositionBothFail) {
  // An application bug (NCCL's behaviour is undefined there): the later rank finds the
  // mismatch, poisons the comm and releases every wait; the earlier one, whose stream waits for
  // the later one, is released and learns of it from ncclCommGetAsyncError and its next call.
  // No rank hangs, and no rank's error goes unreported.
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic", "r1:DRV_AG_BYTES=8192"},
                          with(route_env(chan, rdv, unique_id_text()), {{"DRV_AG_CHECK", "1"}}), s);
  expect_clean_pair(r, chan);
  expect_error_on_both(r, "ranks disagree on the op");
}

// One rank captures its all-gather into a graph where the other runs it eagerly (the mode tag):
// the later one (the capturing rank, held back) finds the mismatch; both ranks see an error and
// nobody hangs. (Had the capturing rank come first, it would learn of the error at its first
// call after the other rank found it.)
TEST(RouteSetup, OneRankCapturingWhereTheOtherRunsEagerlyBothFail) {
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic", "r1:FAKE_CUDA_CAPTURING=1", "r1:DRV_SLEEP_BEFORE_AG_MS=300"},
      with(route_env(chan, rdv, unique_id_text()), {{"DRV_AG_CHECK", "1"}}), s);
  expect_clean_pair(r, chan);
  expect_error_on_both(r, "captured a collective");
}

// A one-op drift between two all-gathers of the same size (an application bug NCCL cannot see):
// rank 1 makes one ncclAllReduce more between them, so its second all-gather would pair with
// rank 0's second. The posts carry each rank's call chain (call_chain.h), which differ: both
// ranks see an error, the rank that found it names the drift with the ranks' call counts, every
// rank's log has a WARN, nobody hangs — eagerly and with the all-gathers in groups (the chain
// captured at the call, issued at the group's end). The same calls on both ranks still route.
TEST(RouteSetup, RanksWhoseCallsDriftedApartFailAndRanksMakingTheSameCallsRoute) {
  for (const char* grouped : {"0", "1"}) {
    SCOPED_TRACE(std::string("DRV_AG_GROUP=") + grouped);
    const Env drift = {{"DRV_AG_REPEAT", "2"}, {"DRV_AG_CHECK", "1"}, {"DRV_AG_GROUP", grouped}};
    Scratch s, chan, rdv;
    RunResult r = run_route({"ranks", "2", "basic", "r1:DRV_AG_EXTRA_ALLREDUCE=1"},
                            with(route_env(chan, rdv, unique_id_text()), drift), s);
    expect_clean_pair(r, chan);
    EXPECT_EQ(rnum(r, 1, "ag.extra_rc"), 0) << r.describe();
    expect_error_on_both(r, "collective calls on this communicator differ");
    std::vector<std::string> said;
    for (int k = 0; k < 2; ++k) {
      const std::vector<std::string> w = warns(r, pid_of(r, k));
      EXPECT_FALSE(w.empty()) << "rank " << k << " logged no WARN\n" << r.describe();
      said.insert(said.end(), w.begin(), w.end());
    }
    // Before op 2, rank 0 made 1 collective call and rank 1 made 2; either may have found it.
    EXPECT_TRUE(any_contains(said, "calls before op 2: 1 on this rank (chain ") ||
                any_contains(said, "calls before op 2: 2 on this rank (chain "))
        << r.describe();
  }
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic"},
      with(route_env(chan, rdv, unique_id_text()),
           {{"DRV_AG_REPEAT", "2"}, {"DRV_AG_EXTRA_ALLREDUCE", "1"}, {"DRV_AG_CHECK", "1"}}),
      s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.extra_rc"), 0);
    expect_rank_routed(r, k, 3);  // both all-gathers, then DRV_AG_CHECK's
    EXPECT_EQ(rnum(r, k, "ag.next_data_ok"), 1);
  }
}

// The same calls with a pre-multiplied sum, made on the communicator just before its all-reduce:
// NCCL numbers such ops per communicator (the fake by rank, as NCCL mangles them by the
// communicator's address), so the ranks' call chains must compare them as one reduction, not by
// number, or the next all-gather would fail as a drift on every rank.
TEST(RouteSetup, APreMulSumNumberedPerRankLeavesTheCallChainsAlike) {
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic"},
      with(route_env(chan, rdv, unique_id_text()),
           {{"DRV_AG_REPEAT", "2"}, {"DRV_AG_EXTRA_ALLREDUCE", "2"}, {"DRV_AG_CHECK", "1"}}),
      s);
  expect_clean_pair(r, chan);
  std::set<std::string> ops;
  for (const std::string& line : log_calls(r, "ncclRedOpCreatePreMulSum")) {
    const size_t at = line.find(" op=");
    if (at != std::string::npos) ops.insert(line.substr(at));
  }
  EXPECT_EQ(ops.size(), 2u) << "each rank's op numbered apart\n" << r.describe();
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.extra_rc"), 0);
    EXPECT_EQ(rnum(r, k, "ag.premul_destroy_rc"), 0);
    expect_rank_routed(r, k, 3);  // both all-gathers, then DRV_AG_CHECK's
    EXPECT_EQ(rnum(r, k, "ag.next_data_ok"), 1);
  }
}

// ncclGroupSimulateEnd launches nothing and is a local query, so one rank may simulate a group
// alone: the calls in it leave its call chain as it was, and the all-gathers after it still
// pair and route.
TEST(RouteSetup, AGroupSimulatedOnOneRankLeavesItsCallChainAlone) {
  Scratch s, chan, rdv;
  RunResult r =
      run_route({"ranks", "2", "basic", "r1:DRV_AG_SIMULATE_ALLREDUCE=1"},
                with(route_env(chan, rdv, unique_id_text()), {{"DRV_AG_REPEAT", "2"}}), s);
  expect_clean_pair(r, chan);
  EXPECT_EQ(rnum(r, 1, "ag.simulate_rc"), 0) << r.describe();
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    expect_rank_routed(r, k, 2);
  }
}

// ---- NCCL 2.29.7's memory suspend ----

// ncclCommSuspend(NCCL_SUSPEND_MEM) releases the route's hold on the peer's memory with NCCL's
// own: every import of the peer's buffers is unmapped and released (the shim's pool falls to
// its registered flags), the stage and exports go; after ncclCommResume the next all-gather
// takes the route again and imports anew, bitwise right.
TEST(RouteSetup, SuspendMemReleasesThePeersMemoryAndTheRouteResumes) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          with(route_env(chan, rdv, unique_id_text()), {{"DRV_SUSPEND", "1"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const std::string pid = pid_of(r, k);
    EXPECT_EQ(rnum(r, k, "suspend.rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "resume.rc"), 0);
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1);
    EXPECT_EQ(rnum(r, k, "after.rc"), 0);
    EXPECT_EQ(rnum(r, k, "after.data_ok"), 1) << "the all-gather after the resume";
    EXPECT_EQ(rnum(r, k, "after.ag_ce"), 2) << "both all-gathers on the route";
    // Before the suspend the pool held the registration and this rank's imports (none for an
    // earlier rank whose peer did both copies); suspended, the registration alone (host
    // memory, a few pages per rank).
    EXPECT_LE(rnum(r, k, "suspended.pool_bytes"), rnum(r, k, "ag.pool_bytes"));
    EXPECT_LT(rnum(r, k, "suspended.pool_bytes"), 1 << 20) << r.describe();
    // The driver freed its own buffers after the all-gather: a mapping left is an import.
    EXPECT_EQ(rnum(r, k, "suspended.live_map"), 0) << "an import of the peer's memory is left";
    EXPECT_TRUE(any_contains(shim_lines(r, pid, "INFO"), "suspended: released")) << r.describe();
  }
  EXPECT_GT(rnum(r, 0, "ag.pool_bytes") + rnum(r, 1, "ag.pool_bytes"),
            rnum(r, 0, "suspended.pool_bytes") + rnum(r, 1, "suspended.pool_bytes"))
      << "no rank held an import before the suspend: nothing was tested";
  EXPECT_EQ(static_cast<int>(log_calls(r, "ncclCommSuspend").size()), 2) << r.describe();
}

// A NCCL without ncclCommSuspend (before 2.29.7): the call fails as for any function the
// loaded library lacks, and nothing of the route changes.
TEST(RouteSetup, SuspendOnANcclWithoutItFailsAndTheRouteGoesOn) {
  Scratch s, chan, rdv;
  RunSpec spec;
  spec.argv = {driver("drv_route"), "ranks", "2", "basic"};
  spec.env = with(route_env(chan, rdv, unique_id_text()), {{"DRV_SUSPEND", "1"}});
  spec.library_path = fake_old_dir() + ":" + fake_dir();  // the old NCCL, the fake driver
  spec.timeout_s = 40;
  RunResult r = run(spec, s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "suspend.rc"), 3) << "ncclInternalError\n" << r.describe();
    EXPECT_EQ(rnum(r, k, "after.data_ok"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "after.ag_ce"), 2);
  }
}

// ---- Captured all-gathers ----

// The settings of the capture tests: the route, each rank capturing one all-gather and
// replaying it (drv_route DRV_AG_CAPTURE), then polling and one more eager all-gather.
Env capture_env(const Scratch& chan, const Scratch& rdv, const Env& more = {}) {
  return with(with(route_env(chan, rdv, unique_id_text()),
                   {{"DRV_AG_CAPTURE", "1"}, {"DRV_AG_CHECK", "1"}, {"FAKE_CUDA_WAIT_MS", "3000"}}),
              more);
}

// Lines of the fake CUDA that say a user object's destructor called CUDA (which CUDA forbids).
int cuda_calls_from_destructors(const RunResult& r) {
  int n = 0;
  for (const std::string& line : r.log_lines())
    if (contains(line, "called from a user-object destructor")) ++n;
  return n;
}

int stream_waits_not_satisfied(const RunResult& r) {
  int n = 0;
  for (const std::string& line : r.log_lines())
    if (line.rfind("cuda cuStreamWaitValue", 0) == 0 && contains(line, " not_satisfied")) ++n;
  return n;
}

// The capturing rank first this time (it decides the verdict and waits for the pair alone):
// the eager rank, later, finds the mismatch; the capturing rank's replay, launched after that,
// is released and the error is reported on both; no hang.
TEST(RouteSetup, CapturingRankFirstAndAnEagerOneLaterBothFail) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic", "r1:DRV_AG_CAPTURE=1", "r1:DRV_AG_REPLAYS=1",
                           "r1:DRV_SLEEP_BEFORE_REPLAY_MS=800", "r0:DRV_SLEEP_BEFORE_AG_MS=300"},
                          with(route_env(chan, rdv, unique_id_text()), {{"DRV_AG_CHECK", "1"}}), s);
  expect_clean_pair(r, chan);
  expect_error_on_both(r, "captured a collective");
}

// Both ranks capture: the op takes the route on both, no NCCL all-gather; three replays, each
// with fresh inputs, are bitwise right; the eager op after them pairs too; the graph's user
// object goes with it and the shim's memory with the communicator.
TEST(RouteSetup, CapturedOnEveryRankTakesTheRouteAndEveryReplayIsRight) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"}, capture_env(chan, rdv, {{"DRV_AG_REPLAYS", "3"}}),
                          s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "ag.capture_rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.end_capture"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.replay_ok"), 3) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.async"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_data_ok"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 2) << "the capture and the eager op after it";
    EXPECT_EQ(rnum(r, k, "ag.ag_pass"), 0);
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
    expect_nothing_left(r, k);
    EXPECT_EQ(rnum(r, k, "end.live_userobj"), 0) << "the graph's hold was not released";
  }
  EXPECT_EQ(static_cast<int>(log_calls(r, "ncclAllGather").size()), 0) << r.describe();
  EXPECT_EQ(stream_waits_not_satisfied(r), 0) << r.describe();
  EXPECT_EQ(cuda_calls_from_destructors(r), 0) << r.describe();
}

// Rank 0 captures an all-gather and destroys the graph without replaying it, then captures it
// again; rank 1 captures once. Rank 1's op can never pair: its replays are released (no hang)
// and, its replay having started on an orphaned op, it poisons the communicator; rank 0, held
// back, finds the poison. An error on both, and no wrong result reported as right.
TEST(RouteSetup, CaptureDiscardedOnOneRankIsAnErrorOnEveryRankNeverAHang) {
  Scratch s, chan, rdv;
  RunResult r = run_route(
      {"ranks", "2", "basic", "r0:DRV_AG_CAPTURE_DISCARD=1", "r0:DRV_SLEEP_BEFORE_REPLAY_MS=400"},
      capture_env(chan, rdv), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    const bool error = rnum(r, k, "ag.async") != 0 || rnum(r, k, "ag.next_rc") != 0;
    EXPECT_TRUE(error) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_data_ok") == 1 && rnum(r, k, "ag.next_rc") == 0, false)
        << "an op after the poison reported as right";
  }
  EXPECT_EQ(rnum(r, 0, "ag.discard_rc"), 0);
  EXPECT_TRUE(any_contains(warns(r, pid_of(r, 1)), "destroyed without ever being replayed"))
      << r.describe();
  EXPECT_EQ(cuda_calls_from_destructors(r), 0) << r.describe();
}

// The same capture discarded on every rank, then captured again on every rank: no error (the
// discarded ops are never replayed by anyone).
TEST(RouteSetup, CaptureDiscardedOnEveryRankIsNoError) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          capture_env(chan, rdv, {{"DRV_AG_CAPTURE_DISCARD", "1"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "ag.replay_ok"), 2) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.async"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_data_ok"), 1) << r.describe();
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
  }
  EXPECT_EQ(stream_waits_not_satisfied(r), 0) << r.describe();
}

// A capture the application itself invalidated before the all-gather, on every rank (a
// framework then falls back to eager): the captured call fails as NCCL's would, nothing is
// poisoned, and the next all-gather, eager, takes the route and is right.
TEST(RouteSetup, ACaptureInvalidatedOnEveryRankFailsTheOpAndTheRouteGoesOn) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          capture_env(chan, rdv, {{"DRV_AG_INVALIDATE_CAPTURE", "1"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "ag.capture_rc"), 1) << "ncclUnhandledCudaError\n" << r.describe();
    EXPECT_NE(rnum(r, k, "ag.end_capture"), 0) << "the capture was not invalidated";
    EXPECT_EQ(rnum(r, k, "ag.async"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.next_data_ok"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "ag.ag_ce"), 1) << "the eager all-gather after it";
    EXPECT_EQ(warns(r, pid_of(r, k)), std::vector<std::string>{}) << r.describe();
  }
  EXPECT_EQ(stream_waits_not_satisfied(r), 0) << r.describe();
}

// A graph kept after its communicator is destroyed still holds what its nodes address: the
// channel's registration is not undone before the graph goes.
TEST(RouteSetup, AGraphOutlivingItsCommunicatorKeepsItsFlagsRegistered) {
  Scratch s, chan, rdv;
  RunResult r = run_route({"ranks", "2", "basic"},
                          capture_env(chan, rdv, {{"DRV_AG_KEEP_GRAPH", "1"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_EQ(rnum(r, k, "ag.replay_ok"), 2) << r.describe();
    EXPECT_EQ(rnum(r, k, "world.destroy"), 0);
    EXPECT_EQ(rnum(r, k, "end.live_userobj"), 0);
    // Every unregistration of this process came after its graph was destroyed.
    const std::string pid = " pid=" + pid_of(r, k);
    bool graph_gone = false, early = false;
    for (const std::string& line : r.log_lines()) {
      if (!contains(line, pid)) continue;
      if (line.rfind("cuda cuGraphDestroy ", 0) == 0) graph_gone = true;
      if (line.rfind("cuda cuMemHostUnregister ", 0) == 0 && !graph_gone) early = true;
    }
    EXPECT_TRUE(graph_gone) << r.describe();
    EXPECT_FALSE(early) << "the flags were unregistered under a live graph\n" << r.describe();
  }
  EXPECT_EQ(cuda_calls_from_destructors(r), 0) << r.describe();
}

}  // namespace
}  // namespace itest
