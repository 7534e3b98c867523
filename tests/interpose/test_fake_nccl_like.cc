// The fake NCCL behaves like NCCL 2.28 where an interposer runs into it
// (tests/fake_nccl/fake_nccl_state.cc): inits deferred inside groups, collectives queued until
// the outermost group end, non-blocking comms in progress, a cross-process init rendezvous,
// failing ranks, fixed unique ids, NCCL's own thread calling the API. These tests run
// drivers/drv_nccl_like.cc against the fake alone (so they test the fake), then every scenario
// once with the shim preloaded, which must not crash on it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.h"

namespace itest {
namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

// Rank 1's lateness in the rendezvous scenarios. A rank that waits for it takes at least
// kWaitedMs (a little under kDelayMs); a call that must not wait stays under kAtOnceMs, half
// the lateness, so that a loaded CI machine (ctest -j2 under a sanitizer) does not pass for a wait.
constexpr int kDelayMs = 1000;
constexpr int kWaitedMs = 900;
constexpr int kAtOnceMs = 500;

RunResult run_like(const std::vector<std::string>& args, const Env& env, const Scratch& s,
                   bool preload = false) {
  RunSpec spec;
  spec.argv = {driver("drv_nccl_like")};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.preload = preload;
  spec.env = env;
  spec.timeout_s = 60;
  return run(spec, s);
}

// The fake NCCL's lines (the fake driver's "cuda ..." lines left out).
std::vector<std::string> nccl_log(const RunResult& r) {
  std::vector<std::string> out;
  for (const std::string& line : r.log_lines())
    if (line.rfind("cuda ", 0) != 0) out.push_back(line);
  return out;
}

// Lines strictly between "marker <from>" and "marker <to>".
std::vector<std::string> between(const RunResult& r, const std::string& from,
                                 const std::string& to) {
  std::vector<std::string> out;
  bool in = false;
  for (const std::string& line : nccl_log(r)) {
    if (line == "marker " + from) {
      in = true;
    } else if (line == "marker " + to) {
      break;
    } else if (in) {
      out.push_back(line);
    }
  }
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const std::vector<std::string> kCollectives = {
    "ncclAllGather", "ncclAllReduce", "ncclBroadcast", "ncclReduceScatter",
    "ncclReduce",    "ncclSend",      "ncclRecv",      "ncclAlltoAll",
    "ncclGather",    "ncclScatter",   "ncclBcast"};

bool is_collective_line(const std::string& line) {
  const std::string fn = log_fields(line)["fn"];
  return std::find(kCollectives.begin(), kCollectives.end(), fn) != kCollectives.end();
}

// "66616b...00" (16 bytes of an id in hex) without its trailing zero bytes: the rendezvous key.
std::string trimmed_hex(std::string hex) {
  while (hex.size() >= 2 && hex.compare(hex.size() - 2, 2, "00") == 0) hex.resize(hex.size() - 2);
  return hex;
}

bool file_exists(const std::string& path) { return !read_file(path).empty(); }

// ---- 1. Deferred init inside a group ----

TEST(FakeNcclLike, GroupedInitAnswersZeroUntilOutermostGroupEnd) {
  Scratch s;
  RunResult r = run_like({"grouped-init"}, {}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 0);
  EXPECT_EQ(r.kv()["init.handle"], "set") << "ncclCommInitRank* hands out the handle at once";
  for (const char* phase : {"in_group", "after_inner"}) {
    for (const char* q : {"rank", "count", "device"}) {
      const std::string key = std::string(phase) + "." + q;
      EXPECT_EQ(r.num(key + ".rc"), 0) << key << "\n" << r.describe();
      EXPECT_EQ(r.num(key), 0) << key << ": the init is deferred to the outermost group end";
    }
  }
  EXPECT_EQ(r.num("in_group.async"), 0);
  EXPECT_EQ(r.num("group_end.inner"), 0);
  EXPECT_EQ(r.num("group_end"), 0);
  EXPECT_EQ(r.num("after.rank"), 2);
  EXPECT_EQ(r.num("after.count"), 4);
  EXPECT_EQ(r.num("after.device"), 2);
  // The split's child handle is written by its job, at the group end (NCCL init.cc:2572).
  EXPECT_EQ(r.num("split"), 0);
  EXPECT_EQ(r.kv()["split.handle.in_group"], "null");
  EXPECT_EQ(r.kv()["split.handle.after_inner"], "null");
  EXPECT_EQ(r.kv()["split.handle.after"], "set");
  EXPECT_EQ(r.num("child.rank"), 2);
  EXPECT_EQ(r.num("child.count"), 4);

  // The init is logged when called; the outermost group end says it completed it.
  auto log = nccl_log(r);
  auto init_at = std::find_if(log.begin(), log.end(), [](const std::string& l) {
    return starts_with(l, "ncclCommInitRankConfig ");
  });
  auto inner_marker = std::find(log.begin(), log.end(), "marker inner-end");
  ASSERT_NE(init_at, log.end()) << r.describe();
  EXPECT_LT(init_at, inner_marker) << "the init must be logged when it is called";
  EXPECT_EQ(between(r, "inner-end", "outer-end").front(), "ncclGroupEnd depth=1 -> 0")
      << "an inner group end completes nothing";
  std::vector<std::string> end = between(r, "outer-end", "after-group");
  ASSERT_EQ(end.size(), 1u) << r.describe();
  EXPECT_EQ(end[0], "ncclGroupEnd depth=0 completes_init=comm#1,comm#2 -> 0");
}

// ---- 2. Queued grouped operations ----

TEST(FakeNcclLike, GroupedCollectivesAreQueuedAndLaunchedAtOutermostEndInCallOrder) {
  Scratch s;
  RunResult r = run_like({"queued-ops"}, {}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (const auto& kv : r.kv()) EXPECT_EQ(kv.second, "0") << kv.first;

  // Outside a group: logged as always.
  std::vector<std::string> outside = between(r, "outside", "group");
  ASSERT_EQ(outside.size(), 1u) << r.describe();
  EXPECT_TRUE(starts_with(outside[0], "ncclAllReduce ") && ends_with(outside[0], " -> 0"))
      << outside[0];

  // Inside: every collective logged at the call with " queued", nothing launched yet.
  std::vector<std::string> queued, seen;
  std::vector<std::string> inside = between(r, "group", "inner-end");
  for (const std::string& part : between(r, "after-inner", "outer-end")) inside.push_back(part);
  for (const std::string& line : inside) {
    EXPECT_FALSE(starts_with(line, "ncclGroupEnd:launch")) << "launched before the group end";
    if (!is_collective_line(line)) continue;
    ASSERT_TRUE(ends_with(line, " -> 0 queued")) << line;
    const std::string fn = log_fields(line)["fn"];
    seen.push_back(fn);
    // ncclBcast's operation is the ncclBroadcast it makes inside NCCL (queued just before).
    if (fn != "ncclBcast") queued.push_back(line.substr(0, line.size() - strlen(" -> 0 queued")));
  }
  for (const std::string& fn : kCollectives)
    EXPECT_NE(std::find(seen.begin(), seen.end(), fn), seen.end()) << fn << " was not queued";
  EXPECT_EQ(between(r, "inner-end", "after-inner"),
            std::vector<std::string>{"ncclGroupEnd depth=1 -> 0"})
      << "the inner group end of a nested group launches nothing";

  // The outermost end launches them in call order, the comm created in the group included.
  std::vector<std::string> end = between(r, "outer-end", "after-group"), launched;
  ASSERT_FALSE(end.empty()) << r.describe();
  for (size_t i = 0; i + 1 < end.size(); ++i) {
    ASSERT_TRUE(starts_with(end[i], "ncclGroupEnd:launch ") && ends_with(end[i], " -> 0"))
        << end[i];
    launched.push_back(end[i].substr(strlen("ncclGroupEnd:launch "),
                                     end[i].size() - strlen("ncclGroupEnd:launch ") - 5));
  }
  EXPECT_EQ(launched, queued) << r.describe();
  ASSERT_GE(queued.size(), 2u);
  EXPECT_TRUE(contains(queued.back(), "comm=comm#2")) << "the collective on the comm created in "
                                                         "the group (nccl-tests style)";
  EXPECT_EQ(end.back(), "ncclGroupEnd depth=0 completes_init=comm#2 launched=" +
                            std::to_string(queued.size()) + " -> 0");

  // After the group: as always again. ncclGroupSimulateEnd launches nothing.
  std::vector<std::string> after = between(r, "after-group", "simulate");
  ASSERT_EQ(after.size(), 1u);
  EXPECT_TRUE(ends_with(after[0], " -> 0")) << after[0];
  std::vector<std::string> sim = between(r, "simulate", "end");
  ASSERT_EQ(sim.size(), 3u) << r.describe();
  EXPECT_TRUE(ends_with(sim[1], " -> 0 queued")) << sim[1];
  EXPECT_TRUE(starts_with(sim[2], "ncclGroupSimulateEnd ") && contains(sim[2], " simulated=1 "))
      << sim[2];
}

// ---- 3. Non-blocking communicators ----

TEST(FakeNcclLike, NonBlockingCommIsInProgressForThePolls) {
  Scratch s;
  RunResult r = run_like({"nonblocking"},
                         {{"FAKE_NCCL_NONBLOCKING", "1"}, {"FAKE_NCCL_INPROGRESS_POLLS", "5"}}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 7) << "ncclInProgress";
  EXPECT_EQ(r.kv()["init.handle"], "set");
  // NCCL 2.28's ncclCommEnsureReady: ncclInvalidArgument, the output left alone.
  for (const char* q : {"rank", "count", "device"}) {
    EXPECT_EQ(r.num(std::string("early.") + q + ".rc"), 4) << q;
    EXPECT_EQ(r.num(std::string("early.") + q), -77) << q;
  }
  EXPECT_EQ(r.num("early.allreduce"), 4);
  EXPECT_EQ(r.num("early.destroy"), 4);
  EXPECT_EQ(r.num("early.finalize"), 4);
  EXPECT_EQ(r.num("init.polls_in_progress"), 5);
  EXPECT_EQ(r.num("init.poll_rc"), 0);
  EXPECT_EQ(r.num("init.async"), 0);
  EXPECT_EQ(r.num("ready.rank"), 1);
  EXPECT_EQ(r.num("ready.count"), 2);
  EXPECT_EQ(r.num("ready.allreduce"), 0);
  // Split of a non-blocking parent: NULL at first, the parent in progress, the handle written
  // when the parent is polled ready.
  EXPECT_EQ(r.num("split"), 0);
  EXPECT_EQ(r.kv()["split.handle.after_call"], "null");
  EXPECT_EQ(r.num("split.parent_allreduce"), 4);
  EXPECT_EQ(r.num("split.polls_in_progress"), 5);
  EXPECT_EQ(r.num("split.written_at_poll"), 6);
  EXPECT_EQ(r.kv()["split.handle.after_polls"], "set");
  EXPECT_EQ(r.num("child.rank"), 1);
  EXPECT_EQ(r.num("child.count"), 2);
  // Grouped: deferred, the group end returns ncclInProgress.
  EXPECT_EQ(r.num("grouped.init"), 0);
  EXPECT_EQ(r.num("grouped.group_end"), 7);
  EXPECT_EQ(r.num("grouped.polls_in_progress"), 5);
  EXPECT_EQ(r.num("grouped.async"), 0);
  // Abort does not wait.
  EXPECT_EQ(r.num("abort.init"), 7);
  EXPECT_EQ(r.num("abort"), 0);
  bool wrote = false;
  for (const std::string& line : nccl_log(r))
    if (starts_with(line, "ncclCommGetAsyncError comm=comm#1 ") &&
        contains(line, "wrote_newcomm=comm#2"))
      wrote = true;
  EXPECT_TRUE(wrote) << r.describe();
}

TEST(FakeNcclLike, NonBlockingDefaultIsThreePolls) {
  Scratch s;
  RunResult r = run_like({"nonblocking"}, {{"FAKE_NCCL_NONBLOCKING", "1"}}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init.polls_in_progress"), 3);
  EXPECT_EQ(r.num("split.polls_in_progress"), 3);
  EXPECT_EQ(r.num("split.written_at_poll"), 4);
}

// Existing tests (and the shim's unit tests) create non-blocking comms and expect the old
// fake: ready at once. The model is opt-in.
TEST(FakeNcclLike, NonBlockingModelIsOptIn) {
  Scratch s;
  RunResult r = run_like({"nonblocking"}, {}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 0);
  EXPECT_EQ(r.num("early.rank.rc"), 0);
  EXPECT_EQ(r.num("early.rank"), 1);
  EXPECT_EQ(r.num("early.allreduce"), 0);
  EXPECT_EQ(r.num("early.destroy"), 0) << "ready at once: the early destroy is accepted";
}

TEST(FakeNcclLike, NcclCommBlockingZeroMakesInitRankNonBlocking) {
  Scratch s;
  RunResult r = run_like({"nonblocking-env"},
                         {{"FAKE_NCCL_NONBLOCKING", "1"}, {"NCCL_COMM_BLOCKING", "0"}}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 7);
  EXPECT_EQ(r.num("init.polls_in_progress"), 3);
  EXPECT_EQ(r.num("destroy"), 0);
  RunResult blocking = run_like({"nonblocking-env"}, {{"FAKE_NCCL_NONBLOCKING", "1"}}, s);
  ASSERT_EQ(blocking.exit_code, 0) << blocking.describe();
  EXPECT_EQ(blocking.num("init"), 0) << "without NCCL_COMM_BLOCKING=0 ncclCommInitRank blocks";
}

// ---- 4. Cross-process init rendezvous ----

void expect_rendezvous_results(const RunResult& r) {
  EXPECT_EQ(r.num("r0.init"), 0);
  EXPECT_EQ(r.num("r1.init"), 0);
  EXPECT_GE(r.num("r0.init_ms"), kWaitedMs) << "rank 0 did not wait for the late rank 1";
  for (int rank : {0, 1}) {
    const std::string p = "r" + std::to_string(rank);
    EXPECT_EQ(r.num(p + ".comm.rank"), rank);
    EXPECT_EQ(r.num(p + ".comm.count"), 2);
    // One child of both, ordered by key = -rank; each rank alone.
    EXPECT_EQ(r.num(p + ".split.rank"), 1 - rank) << p;
    EXPECT_EQ(r.num(p + ".split.count"), 2) << p;
    EXPECT_EQ(r.num(p + ".split_alone.rank"), 0) << p;
    EXPECT_EQ(r.num(p + ".split_alone.count"), 1) << p;
    EXPECT_EQ(r.num(p + ".group_end"), 0) << p;
    EXPECT_EQ(r.num(p + ".group.rank"), rank) << p;
    EXPECT_EQ(r.num(p + ".group.count"), 2) << p;
  }
  EXPECT_EQ(r.num("r0.shrink.rank"), 0);
  EXPECT_EQ(r.num("r0.shrink.count"), 1);
  EXPECT_LT(r.num("r0.group_init_ms"), kAtOnceMs) << "a grouped init returns at once";
  EXPECT_GE(r.num("r0.group_end_ms"), kWaitedMs) << "the grouped init waits at the group end";
}

TEST(FakeNcclLike, RendezvousTwoProcessesWaitForEachOther) {
  Scratch s;
  RunResult r = run_like({"rendezvous-2proc", std::to_string(kDelayMs)},
                         {{"FAKE_NCCL_RENDEZVOUS_DIR", s.dir()}}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("child_exit"), 0) << r.describe();
  expect_rendezvous_results(r);
  const std::string key = trimmed_hex(r.kv()["id"]);
  ASSERT_FALSE(key.empty());
  for (const char* rank : {"0", "1"})
    EXPECT_TRUE(file_exists(s.path(key + ".1." + rank))) << key << ".1." << rank;
}

TEST(FakeNcclLike, RendezvousThreadsOfOneProcess) {
  Scratch s;
  RunResult r = run_like({"rendezvous-threads", std::to_string(kDelayMs)},
                         {{"FAKE_NCCL_RENDEZVOUS_DIR", s.dir()}}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  expect_rendezvous_results(r);
}

TEST(FakeNcclLike, NoRendezvousWithoutTheDirectory) {
  Scratch s;
  RunResult r = run_like({"rendezvous-2proc", std::to_string(kDelayMs)}, {}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("r0.init"), 0);
  EXPECT_LT(r.num("r0.init_ms"), kAtOnceMs) << "waited without FAKE_NCCL_RENDEZVOUS_DIR";
  EXPECT_LT(r.num("r0.group_end_ms"), kAtOnceMs);
  // The old fake's answers: a split child has its parent's size and rank.
  EXPECT_EQ(r.num("r0.split.rank"), 0);
  EXPECT_EQ(r.num("r1.split_alone.count"), 2);
}

// ---- 4b. A failing rank ----

TEST(FakeNcclLike, FailRankFailsAtOnceAndTheOthersTimeOut) {
  Scratch s;
  RunResult r = run_like({"fail-rank"},
                         {{"FAKE_NCCL_RENDEZVOUS_DIR", s.dir()},
                          {"FAKE_NCCL_FAIL_RANK", "1"},
                          {"FAKE_NCCL_RENDEZVOUS_TIMEOUT_MS", std::to_string(kDelayMs)}},
                         s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("child_exit"), 0);
  EXPECT_EQ(r.num("r1.init"), 2) << "ncclSystemError on the failing rank";
  EXPECT_LT(r.num("r1.init_ms"), kAtOnceMs);
  EXPECT_EQ(r.kv()["r1.init.handle"], "null");
  EXPECT_EQ(r.num("r0.init"), 2) << "the other rank times out";
  EXPECT_GE(r.num("r0.init_ms"), kWaitedMs);
  EXPECT_EQ(r.kv()["r0.init.handle"], "null");
  for (const char* p : {"r0", "r1"}) {
    EXPECT_EQ(r.num(std::string(p) + ".group_init"), 0) << p;
    EXPECT_EQ(r.num(std::string(p) + ".group_end"), 2) << p;
    EXPECT_EQ(r.num(std::string(p) + ".group.async"), 2) << p;
    EXPECT_EQ(r.num(std::string(p) + ".group.abort"), 0) << p;
  }
  EXPECT_GE(r.num("r0.group_end_ms"), kWaitedMs);
  int fail_lines = 0, timeout_lines = 0;
  for (const std::string& line : nccl_log(r)) {
    if (contains(line, " fail_rank=1")) ++fail_lines;
    if (contains(line, " rendezvous_timeout_ms=" + std::to_string(kDelayMs) + " entered=1/2"))
      ++timeout_lines;
  }
  EXPECT_EQ(fail_lines, 2) << r.describe();     // its init and its group end
  EXPECT_EQ(timeout_lines, 2) << r.describe();  // rank 0's init and group end
}

// ---- 5. Identical unique ids ----

TEST(FakeNcclLike, CommIdMakesEveryUniqueIdTheSame) {
  Scratch s;
  RunResult r = run_like({"same-id"}, {{"FAKE_NCCL_COMM_ID", "job42"}}, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("same_bytes"), 1);
  EXPECT_EQ(trimmed_hex(r.kv()["id_a"]), "66616b6569643a6a6f623432");  // "fakeid:job42"
  EXPECT_EQ(r.num("init1"), 0);
  EXPECT_EQ(r.num("init2"), 0);
  EXPECT_EQ(r.num("distinct_comms"), 1);
  RunResult plain = run_like({"same-id"}, {}, s);
  ASSERT_EQ(plain.exit_code, 0) << plain.describe();
  EXPECT_EQ(plain.num("same_bytes"), 0) << "without FAKE_NCCL_COMM_ID every id differs";
}

TEST(FakeNcclLike, CommIdLetsSeparateProcessesFormOneComm) {
  Scratch shared, s0, s1;
  const Env env = {{"FAKE_NCCL_COMM_ID", "job42"},
                   {"FAKE_NCCL_RENDEZVOUS_DIR", shared.dir()},
                   {"FAKE_NCCL_RENDEZVOUS_TIMEOUT_MS", "20000"}};
  RunResult r1;
  std::thread other([&] { r1 = run_like({"same-id-rank", "1"}, env, s1); });
  RunResult r0 = run_like({"same-id-rank", "0"}, env, s0);
  other.join();
  ASSERT_EQ(r0.exit_code, 0) << r0.describe();
  ASSERT_EQ(r1.exit_code, 0) << r1.describe();
  EXPECT_EQ(r0.kv()["id"], r1.kv()["id"]);
  EXPECT_EQ(r0.num("init"), 0) << r0.describe();
  EXPECT_EQ(r1.num("init"), 0) << r1.describe();
  EXPECT_EQ(r0.num("comm.rank"), 0);
  EXPECT_EQ(r1.num("comm.rank"), 1);
  EXPECT_EQ(r0.num("comm.count"), 2);
  // Alone, the same rank waits for a partner that never comes.
  Scratch alone_dir, s2;
  RunResult alone = run_like({"same-id-rank", "0"},
                             {{"FAKE_NCCL_COMM_ID", "job42"},
                              {"FAKE_NCCL_RENDEZVOUS_DIR", alone_dir.dir()},
                              {"FAKE_NCCL_RENDEZVOUS_TIMEOUT_MS", "200"}},
                             s2);
  ASSERT_EQ(alone.exit_code, 0) << alone.describe();
  EXPECT_EQ(alone.num("init"), 2);
}

// ---- 7. NCCL's own thread calls the API ----

TEST(FakeNcclLike, InnerThreadCallsTheApiFromAnotherThread) {
  Scratch s;
  const Env env = {{"FAKE_NCCL_NONBLOCKING", "1"}, {"FAKE_NCCL_INNER_THREAD", "1"}};
  RunResult r = run_like({"inner-thread"}, env, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 7);
  EXPECT_EQ(r.num("init.polls_in_progress"), 3) << "the thread's own poll is no progress";
  EXPECT_EQ(r.num("init.async"), 0);
  std::vector<std::string> log = nccl_log(r);
  auto at = std::find_if(log.begin(), log.end(),
                         [](const std::string& l) { return starts_with(l, "fakeNcclThread "); });
  ASSERT_NE(at, log.end()) << r.describe();
  auto f = log_fields(*at);
  EXPECT_EQ(f["comm"], "comm#1");
  EXPECT_NE(f["tid"], r.kv()["main_tid"]) << "the calls must come from a thread of the fake";
  int version = 0, polls = 0;
  for (const std::string& line : log) {
    if (starts_with(line, "ncclGetVersion ")) ++version;
    if (starts_with(line, "ncclCommGetAsyncError ")) ++polls;
  }
  EXPECT_EQ(version, 1) << r.describe();
  EXPECT_EQ(polls, 3 + 1 + 1) << "the application's polls plus the thread's";

  // With the shim in front, the shim sees both calls come from inside NCCL: they went
  // through the PLT.
  Scratch s2;
  RunResult shim = run_like({"inner-thread"}, env, s2, /*preload=*/true);
  ASSERT_EQ(shim.exit_code, 0) << shim.describe();
  ASSERT_NE(shim.kv()["stats.before"], "absent") << shim.describe();
  EXPECT_GE(shim.num("stats.after.inner_calls") - shim.num("stats.before.inner_calls"), 2)
      << shim.describe();

  Scratch s3;
  RunResult off = run_like({"inner-thread"}, {{"FAKE_NCCL_NONBLOCKING", "1"}}, s3);
  ASSERT_EQ(off.exit_code, 0) << off.describe();
  EXPECT_FALSE(contains(off.log, "fakeNcclThread")) << "FAKE_NCCL_INNER_THREAD is opt-in";
}

// ---- The shim in front of the NCCL-like fake: it must not crash or hang ----

struct Scenario {
  const char* name;
  std::vector<std::string> args;
  Env env;  // FAKE_NCCL_RENDEZVOUS_DIR is added for the rendezvous scenarios
  bool rendezvous;
};

std::vector<Scenario> scenarios() {
  const Env nb = {{"FAKE_NCCL_NONBLOCKING", "1"}};
  return {
      {"grouped_init", {"grouped-init"}, {}, false},
      {"queued_ops", {"queued-ops"}, {}, false},
      {"nonblocking", {"nonblocking"}, nb, false},
      {"nonblocking_env", {"nonblocking-env"}, {nb[0], {"NCCL_COMM_BLOCKING", "0"}}, false},
      {"rendezvous_2proc", {"rendezvous-2proc", "100"}, {}, true},
      {"rendezvous_threads", {"rendezvous-threads", "100"}, {}, true},
      {"fail_rank",
       {"fail-rank"},
       {{"FAKE_NCCL_FAIL_RANK", "1"}, {"FAKE_NCCL_RENDEZVOUS_TIMEOUT_MS", "200"}},
       true},
      {"same_id", {"same-id"}, {{"FAKE_NCCL_COMM_ID", "job42"}}, false},
      {"inner_thread", {"inner-thread"}, {nb[0], {"FAKE_NCCL_INNER_THREAD", "1"}}, false},
  };
}

class FakeNcclLikeWithShim : public ::testing::TestWithParam<size_t> {};

TEST_P(FakeNcclLikeWithShim, RunsWithoutCrashOrHang) {
  const Scenario sc = scenarios()[GetParam()];
  Scratch s;
  Env env = sc.env;
  if (sc.rendezvous) env.emplace_back("FAKE_NCCL_RENDEZVOUS_DIR", s.dir());
  RunResult r = run_like(sc.args, env, s, /*preload=*/true);
  ASSERT_FALSE(r.timed_out) << r.describe();
  ASSERT_EQ(r.signal, 0) << "the shim crashed\n" << r.describe();
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  if (r.kv().count("child_exit")) {
    EXPECT_EQ(r.num("child_exit"), 0) << r.describe();
  }
  // Informational: which answers the application saw change with the shim in front.
  Scratch s2;
  Env env2 = sc.env;
  if (sc.rendezvous) env2.emplace_back("FAKE_NCCL_RENDEZVOUS_DIR", s2.dir());
  RunResult base = run_like(sc.args, env2, s2);
  ASSERT_EQ(base.exit_code, 0) << base.describe();
  std::string diff;
  auto with = r.kv();
  for (const auto& kv : base.kv()) {
    const std::string& k = kv.first;
    if (k.rfind("stats.", 0) == 0 || k == "main_tid" || ends_with(k, "_ms")) continue;
    if (with[k] != kv.second) diff += "  " + k + ": " + kv.second + " -> " + with[k] + "\n";
  }
  if (!diff.empty()) std::cout << "[ note ] answers that differ with the shim:\n" << diff;
}

INSTANTIATE_TEST_SUITE_P(Scenarios, FakeNcclLikeWithShim,
                         ::testing::Range<size_t>(0, scenarios().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(scenarios()[info.param].name);
                         });

}  // namespace
}  // namespace itest
