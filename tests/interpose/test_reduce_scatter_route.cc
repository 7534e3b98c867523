// The copy-engine reduce-scatter (src/collectives/reduce_scatter/) across processes on the CPU:
// drivers/drv_route.cc's reduce-scatters (DRV_RS=1) under LD_PRELOAD of the shim, the fake NCCL
// and the fake CUDA driver, whose memory is really shared between processes, whose copies move
// bytes and whose kernel launches run the summing kernel's arithmetic (tests/fake_nccl,
// fake_chunk_sum.cc). Each rank checks its output against the sum it makes itself, op after op,
// on fresh inputs; the shim's counters say which route each op took.
#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <string>

#include "harness.h"
#include "route_run.h"

namespace itest {
namespace {

// The reduce-scatter's route on, the all-gathers' off; `ops` ops of `count` elements.
Env rs_env(const Scratch& chan, const Scratch& rdv, const Env& more) {
  return with(route_env(chan, rdv, unique_id_text()), with({{"ZEROCTA_ALLGATHER", "nccl"},
                                                            {"ZEROCTA_REDUCESCATTER", "zerocta"},
                                                            {"DRV_AG", "0"},
                                                            {"DRV_RS", "1"}},
                                                           more));
}

// Every rank of `r` ran its ops without error, every byte right, `routed` of them on the route.
void expect_summed(const RunResult& r, const Scratch& chan, int nranks, long long routed) {
  expect_clean_pair(r, chan, nranks);
  for (int k = 0; k < nranks; ++k) {
    EXPECT_EQ(rnum(r, k, "rs.rc"), 0) << "rank " << k << "\n" << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.wrong"), 0) << "rank " << k << "\n" << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.rs_ce"), routed) << "rank " << k << "\n" << r.describe();
  }
}

struct Case {
  const char* name;
  int nranks;
  Env env;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ReduceScatterRoute : public ::testing::TestWithParam<Case> {};

TEST_P(ReduceScatterRoute, EveryRankSumsItsChunkRight) {
  const Case& c = GetParam();
  Scratch s, chan, rdv;
  const RunResult r = run_route({"ranks", std::to_string(c.nranks), "basic"},
                                rs_env(chan, rdv, with({{"DRV_RS_REPEAT", "4"}}, c.env)), s);
  expect_summed(r, chan, c.nranks, 4);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ReduceScatterRoute,
    ::testing::Values(
        Case{"Sum", 2, {}}, Case{"InPlace", 2, {{"DRV_RS_IN_PLACE", "1"}}},
        Case{"Average", 2, {{"DRV_RS_OP", "avg"}}},
        Case{"Bf16AverageInPlace",
             2,
             {{"DRV_RS_TYPE", "bf16"}, {"DRV_RS_OP", "avg"}, {"DRV_RS_IN_PLACE", "1"}}},
        // New buffers for every op, the old ones freed first.
        Case{"FreshBuffers", 2, {{"DRV_RS_FRESH", "1"}}},
        // Each op in a group of its own: issued at the group's end.
        Case{"Grouped", 2, {{"DRV_RS_GROUP", "1"}}},
        // 20 MB a rank through 2 MiB slices (the eager half of 8M, two slices of the peer):
        // both scratch buffers reused within and across ops.
        Case{"ManySlices", 2, {{"DRV_RS_COUNT", "5000000"}, {"ZEROCTA_RS_SCRATCH", "8M"}}},
        // An odd count: chunks off every alignment, a short last slice.
        Case{"OddCount", 2, {{"DRV_RS_COUNT", "262147"}, {"ZEROCTA_RS_SCRATCH", "1M"}}},
        Case{"ThreeRanks", 3, {}}, Case{"FourRanksInPlace", 4, {{"DRV_RS_IN_PLACE", "1"}}},
        // Pre-multiplied sums of each rank's own scalar (0.5, 1, 2), made before each call
        // and destroyed right after it: host-immediate, device-resident, or some of each.
        Case{"PreMulSumHostScalars", 2, {{"DRV_RS_OP", "premul"}}},
        Case{"PreMulSumDeviceScalarsBf16",
             2,
             {{"DRV_RS_OP", "premul"}, {"DRV_RS_SCALAR", "device"}, {"DRV_RS_TYPE", "bf16"}}},
        Case{"PreMulSumMixedScalarsManySlices",
             3,
             {{"DRV_RS_OP", "premul"},
              {"DRV_RS_SCALAR", "mixed"},
              {"DRV_RS_COUNT", "300001"},
              {"ZEROCTA_RS_SCRATCH", "1M"}}},
        Case{"PreMulSumGrouped",
             2,
             {{"DRV_RS_OP", "premul"}, {"DRV_RS_SCALAR", "mixed"}, {"DRV_RS_GROUP", "1"}}}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Reduce-scatters captured into a CUDA graph on every rank (drv_route DRV_RS_CAPTURE), the graph
// replayed three times with fresh inputs, then eager ops: every replay and every eager op right,
// all of them on the route (a captured op counts once, at its call), NCCL never called.
class CapturedReduceScatterRoute : public ::testing::TestWithParam<Case> {};

TEST_P(CapturedReduceScatterRoute, EveryReplayOfEveryRankIsRight) {
  const Case& c = GetParam();
  Scratch s, chan, rdv;
  const Env env = with({{"DRV_RS_CAPTURE", "1"},
                        {"DRV_RS_REPLAYS", "3"},
                        {"DRV_RS_REPEAT", "2"},
                        {"FAKE_CUDA_WAIT_MS", "3000"}},
                       c.env);
  const RunResult r =
      run_route({"ranks", std::to_string(c.nranks), "basic"}, rs_env(chan, rdv, env), s);
  long long captured = 1;
  for (const auto& [name, value] : c.env)
    if (name == "DRV_RS_CAPTURE_OPS") captured = std::stoll(value);
  expect_summed(r, chan, c.nranks, captured + 2);
  for (int k = 0; k < c.nranks; ++k) {
    EXPECT_EQ(rnum(r, k, "rs.capture_rc"), 0) << "rank " << k << "\n" << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.replay_ok"), 3) << "rank " << k << "\n" << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.async"), 0) << "rank " << k << "\n" << r.describe();
  }
  EXPECT_EQ(log_calls(r, "ncclReduceScatter").size(), 0u) << r.describe();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CapturedReduceScatterRoute,
    ::testing::Values(
        Case{"Sum", 2, {}},
        Case{"Bf16AverageInPlace",
             2,
             {{"DRV_RS_TYPE", "bf16"}, {"DRV_RS_OP", "avg"}, {"DRV_RS_IN_PLACE", "1"}}},
        // 1.2 MB a rank through slices of about 256 KiB: both buffers of the captured half
        // passed back and forth within every replay.
        Case{"ManySlices", 2, {{"DRV_RS_COUNT", "300001"}, {"ZEROCTA_RS_SCRATCH", "2M"}}},
        // Two ops in one graph: the second's buffers are free once the first ended.
        Case{"TwoOpsInOneGraph",
             2,
             {{"DRV_RS_CAPTURE_OPS", "2"},
              {"ZEROCTA_RS_SCRATCH", "2M"},
              {"DRV_RS_COUNT", "200003"}}},
        Case{"ThreeRanks", 3, {{"DRV_RS_CAPTURE_OPS", "2"}}},
        // Three pre-multiplied sums in one group in the capture: issued at the group's end,
        // their reductions destroyed before it.
        Case{"GroupedPreMulSums",
             2,
             {{"DRV_RS_CAPTURE_OPS", "3"},
              {"DRV_RS_CAPTURE_GROUP", "1"},
              {"DRV_RS_OP", "premul"},
              {"DRV_RS_SCALAR", "mixed"}}},
        Case{"FourRanksPreMulSumMixedScalars",
             4,
             {{"DRV_RS_OP", "premul"}, {"DRV_RS_SCALAR", "mixed"}, {"DRV_RS_IN_PLACE", "1"}}},
        Case{"PreMulSumDeviceScalarsManySlices",
             2,
             {{"DRV_RS_OP", "premul"},
              {"DRV_RS_SCALAR", "device"},
              {"DRV_RS_COUNT", "300001"},
              {"ZEROCTA_RS_SCRATCH", "2M"}}}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Rank 0 captures a reduce-scatter and destroys the graph without launching it, then captures
// it again; rank 1 captures once. Rank 1's op can never pair: its replays are released (no
// hang) and, its replay having started on an orphaned op, it poisons the communicator; rank 0
// finds the poison. An error on both, never a wrong result reported as right.
TEST(CapturedReduceScatterRouteWith, ACaptureDiscardedOnOneRankIsAnErrorOnEveryRankNeverAHang) {
  Scratch s, chan, rdv;
  const RunResult r = run_route(
      {"ranks", "2", "basic", "r0:DRV_RS_CAPTURE_DISCARD=1", "r0:DRV_SLEEP_BEFORE_REPLAY_MS=400"},
      rs_env(chan, rdv,
             {{"DRV_RS_CAPTURE", "1"}, {"DRV_RS_REPLAYS", "1"}, {"FAKE_CUDA_WAIT_MS", "3000"}}),
      s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_TRUE(rnum(r, k, "rs.rc") != 0 || rnum(r, k, "rs.async") != 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.data_ok"), 0) << r.describe();
  }
  EXPECT_EQ(rnum(r, 0, "rs.discard_rc"), 0);
  // Whichever host saw it first says why: rank 1 finding its replay started on an orphaned op,
  // or rank 0 destroying its graph after rank 1's replay started.
  EXPECT_TRUE(any_contains(warns(r, pid_of(r, 0)), "destroyed without ever being replayed") ||
              any_contains(warns(r, pid_of(r, 1)), "destroyed without ever being replayed"))
      << r.describe();
}

// One rank captures where the other runs the op eagerly: the posts' modes differ, an error on
// both ranks, never a hang.
TEST(CapturedReduceScatterRouteWith, OneRankCapturingWhereTheOtherRunsEagerlyBothFail) {
  Scratch s, chan, rdv;
  const RunResult r =
      run_route({"ranks", "2", "basic", "r1:DRV_RS_CAPTURE=1", "r1:DRV_RS_REPLAYS=1"},
                rs_env(chan, rdv, {{"FAKE_CUDA_WAIT_MS", "3000"}}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    SCOPED_TRACE("rank " + std::to_string(k));
    EXPECT_TRUE(rnum(r, k, "rs.rc") != 0 || rnum(r, k, "rs.async") != 0) << r.describe();
  }
  EXPECT_TRUE(contains(r.err, "captured a collective")) << r.describe();
}

// Every rank in one process, the peers' scratch reached by address: a rank keeps each peer's
// scratch until its own goes, so destroying rank 1 first leaves its scratch mapped (rank 0's
// queued or released pushes may still land there), and destroying rank 0 too frees both. (The
// fake runs a stream's operations when they are issued, so with one thread issuing both ranks'
// ops rank 0's sums cannot wait for rank 1's pushes: the sums are not checked here; the GPU's
// run_rs_one_gpu.sh and the CPU tests above check them.)
TEST(ReduceScatterRouteWith, ARankKeepsItsPeersScratchInItsProcessUntilItsOwnGoes) {
  Scratch s, chan, rdv;
  const RunResult r =
      run_route({"grouped-init"},
                with(route_env(chan, rdv, unique_id_text()), {{"ZEROCTA_ALLGATHER", "nccl"},
                                                              {"ZEROCTA_REDUCESCATTER", "zerocta"},
                                                              {"DRV_GROUPED_RS", "1"},
                                                              {"FAKE_CUDA_WAIT_MS", "0"}}),
                s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("rs.rc"), 0) << r.describe();
  EXPECT_EQ(r.num("rs.rs_ce"), 2) << r.describe();
  const long long before = r.num("rs.live_reserve0");
  EXPECT_EQ(r.num("rs.live_reserve1"), before) << "rank 1's scratch went before rank 0's\n"
                                               << r.describe();
  EXPECT_LE(r.num("rs.live_reserve2"), before - 2) << "both scratches still mapped\n"
                                                   << r.describe();
}

// The push issuer's CUDA context of its own (GPU memory, docs/PERFORMANCE.md) serves the
// all-gather's deferred pushes: a process that routes reduce-scatters alone never makes it.
TEST(ReduceScatterRouteWith, ReduceScattersAloneMakeNoPushIssuerContext) {
  Scratch s, chan, rdv;
  const RunResult r = run_route({"ranks", "2", "basic"}, rs_env(chan, rdv, {}), s);
  expect_summed(r, chan, 2, 3);
  EXPECT_FALSE(contains(r.err, "push issuer: a context of its own")) << r.describe();
}

// The events the stream that runs a process's sums (the fake driver's log: the stream of its
// zc_chunk_sum launches) waits for, with how often.
std::map<std::string, int> sum_stream_waits(const RunResult& r, const std::string& pid) {
  std::string sums;
  std::map<std::string, int> waits;
  const std::vector<std::string> lines = r.log_lines();
  for (const std::string& line : lines)
    if (contains(line, " pid=" + pid + " ") && contains(line, "cuLaunchKernel fn=zc_chunk_sum"))
      sums = log_fields(line)["stream"];
  for (const std::string& line : lines)
    if (!sums.empty() && contains(line, " pid=" + pid + " ") &&
        contains(line, "cuStreamWaitEvent stream=" + sums + " "))
      ++waits[log_fields(line)["event"]];
  return waits;
}

// All-gathers and reduce-scatters on the route on one communicator, as FSDP2 issues them: the
// ops share the exchange's numbering and the route's streams. The driver issues them on two
// streams of its own, so the stream of a reduce-scatter's sums waits for two events: its op's
// start and the previous routed op's end (NCCL runs a communicator's ops one after the other;
// the fake runs every stream operation at once, so only the log can tell).
TEST(ReduceScatterRouteWith, AllGathersOnTheSameCommunicator) {
  Scratch s, chan, rdv;
  const RunResult r =
      run_route({"ranks", "2", "basic"},
                rs_env(chan, rdv,
                       {{"ZEROCTA_ALLGATHER", "zerocta"}, {"DRV_AG", "1"}, {"DRV_AG_REPEAT", "3"}}),
                s);
  expect_summed(r, chan, 2, 3);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(rnum(r, k, "ag.data_ok"), 1) << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.ag_ce"), 3) << r.describe();
    const std::map<std::string, int> waits = sum_stream_waits(r, pid_of(r, k));
    ASSERT_EQ(waits.size(), 2u) << "rank " << k << "\n" << r.describe();
    for (const auto& [event, n] : waits)
      EXPECT_GE(n, 3) << "rank " << k << ", event " << event << "\n" << r.describe();
  }
}

// A communicator committed for the reduce-scatter's sake (zerocta: any count) on more ranks than
// the all-gather's auto takes (ZEROCTA_AUTO_MAX_RANKS, 4): its all-gathers stay on NCCL.
TEST(ReduceScatterRouteWith, AutoAllGathersKeepTheirRankLimitOnACommunicatorCommittedForIt) {
  Scratch s, chan, rdv;
  const RunResult r = run_route({"ranks", "5", "basic"},
                                rs_env(chan, rdv,
                                       {{"ZEROCTA_ALLGATHER", "auto"},
                                        {"DRV_AG", "1"},
                                        {"DRV_RS_REPEAT", "2"},
                                        {"FAKE_CUDA_DEVICES", "5"}}),
                                s);
  expect_summed(r, chan, 5, 2);
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(rnum(r, k, "rs.ag_ce"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.ag_pass"), 1) << r.describe();
  }
}

// Settings that differ between the ranks: no agreement, NCCL on every rank, no hang.
TEST(ReduceScatterRouteWith, ARankThatAsksForNcclMakesEveryRankPassThrough) {
  Scratch s, chan, rdv;
  const RunResult r =
      run_route({"ranks", "2", "basic", "r1:ZEROCTA_REDUCESCATTER=nccl"}, rs_env(chan, rdv, {}), s);
  expect_clean_pair(r, chan);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(rnum(r, k, "rs.rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.rs_ce"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.rs_pass"), 3) << r.describe();
  }
}

// auto routes from ZEROCTA_MIN_BYTES of input up, 2 ranks only; what it does not route NCCL runs.
TEST(ReduceScatterRouteWith, AutoRoutesFromTheMinimumOnTwoRanks) {
  Scratch s, chan, rdv;
  // 1000 floats a rank: 8000 B of input on 2 ranks.
  const RunResult below = run_route(
      {"ranks", "2", "basic"},
      rs_env(chan, rdv, {{"ZEROCTA_REDUCESCATTER", "auto"}, {"ZEROCTA_MIN_BYTES", "8001"}}), s);
  expect_clean_pair(below, chan);
  for (int k = 0; k < 2; ++k) EXPECT_EQ(rnum(below, k, "rs.rs_pass"), 3) << below.describe();
  Scratch s2, chan2, rdv2;
  const RunResult at = run_route(
      {"ranks", "2", "basic"},
      rs_env(chan2, rdv2, {{"ZEROCTA_REDUCESCATTER", "auto"}, {"ZEROCTA_MIN_BYTES", "8000"}}), s2);
  expect_summed(at, chan2, 2, 3);
  Scratch s3, chan3, rdv3;
  const RunResult three = run_route({"ranks", "3", "basic"},
                                    rs_env(chan3, rdv3, {{"ZEROCTA_REDUCESCATTER", "auto"}}), s3);
  expect_clean_pair(three, chan3, 3);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(rnum(three, k, "rs.rs_ce"), 0) << three.describe();
}

// Ranks that issue reduce-scatters of different counts at one position: the later to arrive
// fails the op and poisons the communicator, so both see the error (the earlier one issued its
// op before the later one came: it learns it from the communicator's asynchronous error, as
// from NCCL's), never a hang.
TEST(ReduceScatterRouteWith, RanksThatDisagreeOnTheCountBothFail) {
  Scratch s, chan, rdv;
  const RunResult r = run_route({"ranks", "2", "basic", "r1:DRV_RS_COUNT=1001"},
                                rs_env(chan, rdv, {{"DRV_RS_REPEAT", "1"}}), s);
  EXPECT_FALSE(r.timed_out) << r.describe();
  int failed_calls = 0;
  for (int k = 0; k < 2; ++k) {
    failed_calls += rnum(r, k, "rs.rc") != 0;
    EXPECT_NE(rnum(r, k, "rs.async"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
  }
  EXPECT_GE(failed_calls, 1) << r.describe();
  EXPECT_TRUE(contains(r.err, "ranks issued collectives of different counts")) << r.describe();
}

// On a child of ncclCommSplit (keys reversed: child ranks differ from the parent's) the route
// takes its facts, its scratch included, from the child's own channel; the parent routes too.
TEST(ReduceScatterRouteWith, AChildOfASplitRoutesItsOwn) {
  Scratch s, chan, rdv;
  const RunResult r =
      run_route({"ranks", "3", "split", "r0:DRV_KEY=2", "r1:DRV_KEY=1", "r2:DRV_KEY=0"},
                rs_env(chan, rdv, {{"DRV_COLOR", "0"}, {"DRV_AG_BYTES", "4096"}}), s);
  EXPECT_FALSE(r.timed_out) << r.describe();
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "child_rs.rc"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "child_rs.wrong"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "child_rs.rs_ce"), 3) << r.describe();
  }
}

// A peer's abort (PyTorch's test_abort_pg): rank 1's next reduce-scatter would need rank 0, so it
// fails at once with ncclRemoteError (NCCL's would wait for ever), while its all-reduce, which
// NCCL runs, goes on.
TEST(ReduceScatterRouteWith, AnOpAfterAPeersAbortFailsAtOnce) {
  Scratch s, chan, rdv;
  const RunResult r = run_route({"ranks", "2", "peerabort"},
                                rs_env(chan, rdv, {{"ZEROCTA_ALLGATHER", "zerocta"}}), s);
  EXPECT_FALSE(r.timed_out) << r.describe();
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(rnum(r, k, "exit"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.wrong"), 0) << r.describe();
    EXPECT_EQ(rnum(r, k, "rs.rs_ce"), 3) << r.describe();
  }
  EXPECT_EQ(rnum(r, 1, "peer.ar_rc"), 0) << r.describe();
  EXPECT_EQ(rnum(r, 1, "peer.rs_rc"), 6) << r.describe();  // ncclRemoteError
}

}  // namespace
}  // namespace itest
