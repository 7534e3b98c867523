// 10. Concurrency: worker threads issuing collectives and nested groups on their own
// communicators, churn threads creating and destroying communicators by every path, and a
// watchdog polling ncclCommGetAsyncError, all at once through the preloaded shim
// (drivers/drv_concurrency.cc). Afterwards the shim's counters, the driver's own tallies, the
// numbers computed here from the schedule and the fake's call log must all agree exactly.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace itest {
namespace {

struct Params {
  int workers = 8, comms = 4, iterations = 200, churners = 2, cycles = 100;
};

// Exact call counts of the driver's schedule (see drv_concurrency.cc), computed from the
// parameters alone.
struct Expected {
  long long allgather, allgather_in_window, allreduce, broadcast, bcast, send, recv, created;
};

Expected expected_for(const Params& p) {
  auto cycles_of_variant = [&p](int v) {  // cycles k in [0, cycles) with k % 6 == v
    return p.cycles > v ? (p.cycles - v + 5) / 6 : 0;
  };
  const long long wi = static_cast<long long>(p.workers) * p.iterations;
  Expected e;
  e.allgather = wi * p.comms + p.churners * cycles_of_variant(2);
  e.allgather_in_window = wi;  // each worker's first communicator, once per iteration
  e.allreduce = wi * (p.comms + 1) + p.churners * (cycles_of_variant(0) + cycles_of_variant(5));
  e.bcast = wi;
  e.broadcast = wi * p.comms + e.bcast + p.churners * cycles_of_variant(1);
  e.send = wi * p.comms + p.churners * cycles_of_variant(3);
  e.recv = e.send;
  // Every cycle creates one communicator (the NOCOLOR split of variant 3 creates none, its
  // InitRankConfig does), plus one parent per churner.
  e.created = static_cast<long long>(p.workers) * p.comms + p.churners * (1LL + p.cycles);
  return e;
}

RunResult run_driver(const Params& p, std::vector<std::pair<std::string, std::string>> env,
                     const Scratch& s) {
  RunSpec spec;
  spec.argv = {driver("drv_concurrency"),    std::to_string(p.workers),  std::to_string(p.comms),
               std::to_string(p.iterations), std::to_string(p.churners), std::to_string(p.cycles),
               /*deadline_s=*/"20"};
  spec.env = std::move(env);
  spec.timeout_s = 40;  // past the driver's own deadline, which reports each thread's step
  return run(spec, s);
}

// Sum over routes of stats.final.<op>.<route>.<what> (calls or bytes).
long long stat_sum(const RunResult& r, const std::string& op, const std::string& what) {
  const std::string prefix = "stats.final." + op + ".", suffix = "." + what;
  long long sum = 0;
  int routes = 0;
  for (const auto& kv : r.kv()) {
    const std::string& k = kv.first;
    if (k.size() > prefix.size() + suffix.size() && k.compare(0, prefix.size(), prefix) == 0 &&
        k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0) {
      sum += strtoll(kv.second.c_str(), nullptr, 10);
      ++routes;
    }
  }
  EXPECT_GT(routes, 0) << "no stats.final." << op << ".*." << what << " in the output";
  return sum;
}

long long stat_calls(const RunResult& r, const std::string& op) { return stat_sum(r, op, "calls"); }

// Lines per function name (the first token) in the fake's log.
std::map<std::string, long long> lines_per_function(const RunResult& r) {
  std::map<std::string, long long> n;
  for (const std::string& line : r.log_lines()) n[log_fields(line)["fn"]]++;
  return n;
}

void check_run(const Params& p, const RunResult& r) {
  ASSERT_FALSE(r.timed_out) << r.describe();
  ASSERT_EQ(r.signal, 0) << r.describe();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("failures"), 0) << r.err;
  EXPECT_EQ(r.num("monotonic"), 1) << "a zerocta_get_stats counter went backwards";
  EXPECT_GT(r.num("snapshots"), 0);
  EXPECT_LT(r.num("elapsed_ms"), 5000) << "the concurrent run must stay under 5 s";

  // 1. The driver did what the schedule says (guards the test against a lazy driver).
  const Expected e = expected_for(p);
  EXPECT_EQ(r.num("calls.allgather"), e.allgather);
  EXPECT_EQ(r.num("calls.allreduce"), e.allreduce);
  EXPECT_EQ(r.num("calls.broadcast"), e.broadcast);
  EXPECT_EQ(r.num("calls.send"), e.send);
  EXPECT_EQ(r.num("calls.recv"), e.recv);
  EXPECT_EQ(r.num("api.ncclBcast"), e.bcast);
  EXPECT_EQ(r.num("created"), e.created);

  // 2. The shim counted exactly those calls: none lost, none twice, the inner
  // ncclBcast -> ncclBroadcast not as a second broadcast.
  EXPECT_EQ(stat_calls(r, "allgather"), e.allgather);
  EXPECT_EQ(stat_calls(r, "allreduce"), e.allreduce);
  EXPECT_EQ(stat_calls(r, "broadcast"), e.broadcast);
  EXPECT_EQ(stat_calls(r, "send"), e.send);
  EXPECT_EQ(stat_calls(r, "recv"), e.recv);
  for (const char* op : {"reducescatter", "reduce", "alltoall", "gather", "scatter"})
    EXPECT_EQ(stat_calls(r, op), 0) << op;
  // Bytes are two more counters per op under the same contention.
  for (const char* op : {"allgather", "allreduce", "broadcast", "send", "recv"}) {
    EXPECT_EQ(stat_sum(r, op, "bytes"), r.num(std::string("bytes.") + op)) << op;
    EXPECT_GT(r.num(std::string("bytes.") + op), 0) << op;
  }
  EXPECT_EQ(r.num("stats.final.allgather.nccl-ce.calls"), e.allgather_in_window)
      << "all-gathers in the registered windows take the nccl-ce route, the others do not";
  EXPECT_EQ(r.num("stats.final.comms_created"), e.created);
  // Inner calls: ncclBcast -> ncclBroadcast, and ncclCommWindowRegister -> ncclCommRegister
  // (from the fake's own thread), one per worker.
  EXPECT_EQ(r.num("stats.final.inner_calls"), e.bcast + p.workers);

  // 3. The fake saw one call per application call, each logged on a whole line.
  auto lines = lines_per_function(r);
  auto api = [&r](const char* fn) { return r.num(std::string("api.") + fn); };
  for (const char* fn : {"ncclAllGather", "ncclAllReduce", "ncclBcast", "ncclSend", "ncclRecv",
                         "ncclGroupStart", "ncclGroupEnd", "ncclCommSplit", "ncclCommShrink",
                         "ncclCommRevoke", "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort",
                         "ncclGetUniqueId", "ncclCommWindowRegister", "ncclCommWindowDeregister"})
    EXPECT_EQ(lines[fn], api(fn)) << fn;
  // The shim itself asks a non-blocking comm whether it is ready before setting it up (at most
  // once per comm here: the fake is ready at once).
  EXPECT_GE(lines["ncclCommGetAsyncError"], api("ncclCommGetAsyncError"));
  EXPECT_LE(lines["ncclCommGetAsyncError"], api("ncclCommGetAsyncError") + e.created);
  // ncclCommWindowRegister registers the buffer with an inner ncclCommRegister.
  EXPECT_EQ(lines["ncclCommRegister"], api("ncclCommWindowRegister"));
  // ncclBcast reaches ncclBroadcast inside NCCL: one extra line per ncclBcast.
  EXPECT_EQ(lines["ncclBroadcast"], api("ncclBroadcast") + api("ncclBcast"));
  // The shim may create a communicator without a config through InitRankConfig (to add its
  // CTA policy), so only the sum of the two init functions is fixed.
  EXPECT_EQ(lines["ncclCommInitRank"] + lines["ncclCommInitRankConfig"],
            api("ncclCommInitRank") + api("ncclCommInitRankConfig"));
  EXPECT_GT(api("ncclCommGetAsyncError"), 0) << "the watchdog never polled";

  // Every NCCL line is whole and successful, and names a communicator the fake handed out
  // (a destroyed or foreign handle would be logged in hex).
  for (const std::string& line : r.log_lines()) {
    auto f = log_fields(line);
    const std::string& fn = f["fn"];
    ASSERT_TRUE(fn.rfind("nccl", 0) == 0 || fn == "cuda" || fn == "marker") << "torn: " << line;
    if (fn.rfind("nccl", 0) != 0) continue;
    EXPECT_EQ(f["result"], "0") << line;
    if (f.count("comm")) {
      EXPECT_EQ(f["comm"].rfind("comm#", 0), 0u) << line;
    }
  }
}

TEST(Concurrency, CountersAndLogExactUnderThreads) {
  Scratch s;
  Params p;
  check_run(p, run_driver(p, {}, s));
}

// The copy-engine configuration: every creation also runs the pool set-up (which gives up
// here, the fake driver has no copy engine) and every teardown the pool release, from many
// threads at once, with INFO logging on.
TEST(Concurrency, CountersExactWithCopyEngineSetupPath) {
  Scratch s;
  Params p;
  p.iterations = 50;
  p.cycles = 50;
  check_run(p, run_driver(p, {{"ZEROCTA_ALLGATHER", "auto"}, {"ZEROCTA_LOG", "info"}}, s));
}

// Many more threads than cores, few calls each: more preemption inside the wrappers.
TEST(Concurrency, ManyThreadsFewCalls) {
  Scratch s;
  Params p;
  p.workers = 32;
  p.comms = 2;
  p.iterations = 5;
  p.churners = 6;
  p.cycles = 10;
  check_run(p, run_driver(p, {}, s));
}

}  // namespace
}  // namespace itest
