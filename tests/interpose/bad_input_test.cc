// Bad input through the shim. Every collective is called with a NULL, destroyed or made-up
// communicator and, on a live one, with NULL buffers, count 0, unknown datatypes, operators
// and roots, overlapping and misaligned buffers and an element count whose byte size
// overflows; the communicator calls with NULL handles and NULL out-pointers. The fake NCCL
// answers them as NCCL 2.28 does (FAKE_NCCL_CHECK_ARGS=1, checked below against what NCCL is
// known to answer). Then, under every ZEROCTA_ALLGATHER mode and with the shim disabled, the
// program must not crash, every call must return exactly what NCCL returned without the shim,
// and what reached NCCL for each call must be identical: the shim neither swallows, changes
// nor adds an application call.
//
// Calls that crash the shim today are in bad_input_known_issues_test.cc, each in a process
// of its own.
#include <gtest/gtest.h>
#include <strings.h>

#include <algorithm>
#include <set>

#include "bad_input_log.h"
#include "harness.h"

namespace itest {
namespace {

const char* const kOps[] = {"allgather", "allreduce", "reducescatter", "reduce",
                            "broadcast", "bcast",     "alltoall",      "gather",
                            "scatter",   "send",      "recv"};
const char* const kVariants[] = {"ok",      "nullsend",   "nullrecv", "nullboth",
                                 "count0",  "count0null", "dtype99",  "dtypeneg",
                                 "overlap", "misaligned", "hugecount"};
const std::set<std::string> kReductions = {"allreduce", "reducescatter", "reduce"};
const std::set<std::string> kRooted = {"reduce",  "broadcast", "bcast", "gather",
                                       "scatter", "send",      "recv"};

// Steps that create communicators: the shim legitimately changes how (InitRank arrives as
// InitRankConfig with its policy), so only their results are compared.
const std::set<std::string> kCreationSteps = {"init",
                                              "init_dead",
                                              "initrank_badnranks",
                                              "initrank_badrank",
                                              "initall_nullcomms",
                                              "initall_negndev",
                                              "split:live",
                                              "shrink:live"};

const std::vector<std::string> kLifecycleSteps = {
    "initrank_badnranks", "initrank_badrank", "initall_nullcomms",  "initall_negndev",
    "split:null",         "split:dead",       "split:garbage",      "split_nullout",
    "shrink:null",        "shrink:dead",      "finalize:null",      "finalize:dead",
    "revoke:null",        "revoke:dead",      "asyncerror:null",    "asyncerror:dead",
    "asyncerror_nullout", "count:null",       "count:dead",         "count_nullout",
    "cudevice:null",      "userrank:garbage", "winreg:null",        "winreg:dead",
    "winreg_nullwin",     "windereg_null",    "windereg_bogus",     "register_nullhandle",
    "deregister_bogus",   "redop:null",       "redop:dead",         "memalloc_nullptr",
    "memfree_null",       "memfree_bogus",    "groupend_unmatched", "group_nullcomm",
    "errorstring_bad",    "lasterror:null",   "lasterror:dead",     "split:live",
    "shrink:live",        "abort:null",       "destroy:null",       "destroy:dead",
    "destroy:garbage",    "abort:dead"};

std::vector<std::string> all_steps() {
  std::vector<std::string> steps = {"init", "init_dead"};
  for (const char* op : kOps) {
    for (const char* comm : {"null", "dead", "garbage"})
      steps.push_back(std::string(op) + ":" + comm + ":ok");
    for (const char* v : kVariants) steps.push_back(std::string(op) + ":live:" + v);
    if (kReductions.count(op)) steps.push_back(std::string(op) + ":live:badop");
    if (kRooted.count(op)) steps.push_back(std::string(op) + ":live:badroot");
  }
  steps.push_back("allgather:live:inplace");
  steps.insert(steps.end(), kLifecycleSteps.begin(), kLifecycleSteps.end());
  steps.push_back("destroy:live");  // last: the live communicator is used until here
  return steps;
}

// What NCCL 2.28 answers, where its source says so (CommCheck, ArgsCheck, PtrCheck,
// ncclCommDestroy/Abort of NULL, ncclGroupEnd outside a group); -1 = not asserted (the
// fake's answer for something NCCL leaves undefined, e.g. a destroyed communicator).
int nccl_answer(const std::string& step) {
  const size_t a = step.find(':'), b = step.rfind(':');
  if (a != std::string::npos && a != b) {  // a collective
    const std::string comm = step.substr(a + 1, b - a - 1), v = step.substr(b + 1);
    if (comm == "null") return 4;
    if (comm != "live") return -1;
    if (v == "dtype99" || v == "dtypeneg" || v == "badop" || v == "badroot") return 4;
    return 0;  // buffers and counts are not checked (NCCL_CHECK_POINTERS=0)
  }
  static const std::map<std::string, int> kKnown = {{"init", 0},
                                                    {"initrank_badnranks", 4},
                                                    {"initrank_badrank", 4},
                                                    {"initall_nullcomms", 4},
                                                    {"initall_negndev", 4},
                                                    {"split:null", 4},
                                                    {"split_nullout", 4},
                                                    {"split:live", 0},
                                                    {"shrink:null", 4},
                                                    {"shrink:live", 0},
                                                    {"finalize:null", 4},
                                                    {"asyncerror:null", 4},
                                                    {"asyncerror_nullout", 4},
                                                    {"count:null", 4},
                                                    {"count_nullout", 4},
                                                    {"cudevice:null", 4},
                                                    {"winreg:null", 4},
                                                    {"winreg_nullwin", 4},
                                                    {"memalloc_nullptr", 4},
                                                    {"groupend_unmatched", 5},
                                                    {"group_nullcomm", 0},
                                                    {"group_nullcomm.call", 4},
                                                    {"abort:null", 0},
                                                    {"destroy:null", 0},
                                                    {"destroy:live", 0}};
  auto it = kKnown.find(step);
  return it == kKnown.end() ? -1 : it->second;
}

struct Mode {
  const char* name;
  std::vector<std::pair<std::string, std::string>> env;
};
const Mode kModes[] = {
    {"ZEROCTA_ALLGATHER=nccl (default)", {}},
    {"ZEROCTA_ALLGATHER=auto", {{"ZEROCTA_ALLGATHER", "auto"}}},
    {"ZEROCTA_ALLGATHER=auto ZEROCTA_MIN_BYTES=0",
     {{"ZEROCTA_ALLGATHER", "auto"}, {"ZEROCTA_MIN_BYTES", "0"}}},
    {"ZEROCTA_ALLGATHER=zerocta", {{"ZEROCTA_ALLGATHER", "zerocta"}}},
    {"ZEROCTA_ALLGATHER=off", {{"ZEROCTA_ALLGATHER", "off"}}},
    {"ZEROCTA_ENABLE=0", {{"ZEROCTA_ENABLE", "0"}}},
};

class BadInput : public ::testing::Test {
 protected:
  // One run without the shim serves every test of the suite.
  static void SetUpTestSuite() {
    Scratch scratch;
    baseline_ = new RunResult(run_bad_input(all_steps(), false, {}, scratch));
  }
  static void TearDownTestSuite() {
    delete baseline_;
    baseline_ = nullptr;
  }
  static RunResult* baseline_;
};
RunResult* BadInput::baseline_ = nullptr;

TEST_F(BadInput, FakeAnswersLikeNccl) {
  // Guards the comparisons below: the baseline ran every step and answered as NCCL would.
  const RunResult& base = *baseline_;
  ASSERT_EQ(base.exit_code, 0) << base.describe();
  auto kv = base.kv();
  int asserted = 0;
  for (const std::string& step : all_steps()) {
    ASSERT_EQ(kv.count(step), 1u) << "the driver did not run " << step << "\n" << base.describe();
    const int want = nccl_answer(step);
    if (want < 0) continue;
    ++asserted;
    EXPECT_EQ(kv[step], std::to_string(want)) << step;
  }
  EXPECT_EQ(kv["group_nullcomm.call"], "4");
  // Each collective step's segment holds its call, so comparing segments compares calls.
  const auto segments = step_segments(base);
  for (const std::string& step : all_steps()) {
    if (std::count(step.begin(), step.end(), ':') != 2) continue;
    const std::string fn = "nccl" + step.substr(0, step.find(':'));
    auto it = segments.find(step);
    ASSERT_TRUE(it != segments.end() && !it->second.empty()) << step << "\n" << base.describe();
    const bool has_call =
        std::any_of(it->second.begin(), it->second.end(), [&fn](const std::string& line) {
          return strncasecmp(line.c_str(), (fn + " ").c_str(), fn.size() + 1) == 0;
        });
    EXPECT_TRUE(has_call) << step << ": " << it->second[0];
  }
  EXPECT_GE(asserted, 150) << "too few steps with a known NCCL answer";
}

TEST_F(BadInput, EveryModeReturnsWhatNcclReturnsAndForwardsTheCallUnchanged) {
  const RunResult& base = *baseline_;
  ASSERT_EQ(base.exit_code, 0) << base.describe();
  const auto base_kv = base.kv();
  const auto base_segments = step_segments(base);
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(mode.name);
    Scratch scratch;
    RunResult r = run_bad_input(all_steps(), true, mode.env, scratch);
    ASSERT_FALSE(r.timed_out) << r.describe();
    ASSERT_EQ(r.signal, 0) << "the shim crashed\n" << r.describe();
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    // Every printed value: step results, "<step>.created", "<step>.text".
    EXPECT_EQ(r.kv(), base_kv) << r.describe();
    const auto segments = step_segments(r);
    for (const std::string& step : all_steps()) {
      if (kCreationSteps.count(step)) continue;
      auto want = base_segments.find(step), got = segments.find(step);
      ASSERT_TRUE(want != base_segments.end() && got != segments.end()) << step;
      const std::string diff = segment_difference(want->second, got->second);
      EXPECT_EQ(diff, "") << "step " << step;
    }
  }
}

TEST_F(BadInput, NoCrashAndSameAnswersWhenEveryCallIsInAGroup) {
  // PyTorch issues most collectives inside ncclGroupStart/End; the shim defers its own
  // all-gathers there, so bad all-gathers must come back the same way inside a group too.
  std::vector<std::string> steps = {"init", "init_dead", "group_nullcomm"};
  for (const char* comm : {"null", "dead", "garbage"})
    steps.push_back(std::string("grouped:allgather:") + comm + ":ok");
  for (const char* v : kVariants) steps.push_back(std::string("grouped:allgather:live:") + v);
  steps.push_back("destroy:live");
  Scratch scratch;
  RunResult base = run_bad_input(steps, false, {}, scratch);
  ASSERT_EQ(base.exit_code, 0) << base.describe();
  for (const Mode& mode : kModes) {
    SCOPED_TRACE(mode.name);
    RunResult r = run_bad_input(steps, true, mode.env, scratch);
    ASSERT_EQ(r.signal, 0) << r.describe();
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.kv(), base.kv()) << r.describe();
    EXPECT_EQ(base.kv()["grouped:allgather:null:ok"], "4") << base.describe();
    EXPECT_EQ(base.kv()["grouped:allgather:null:ok.end"], "0") << base.describe();
  }
}

}  // namespace
}  // namespace itest
