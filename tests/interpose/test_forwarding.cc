// 1. Forwarding: every nccl.h function reaches NCCL with the application's arguments.
#include <gtest/gtest.h>

#include "harness.h"
#include "nccl_header_functions.h"

namespace itest {
namespace {

RunResult run_every_call(bool preload, std::vector<std::pair<std::string, std::string>> env,
                         const Scratch& scratch) {
  RunSpec spec;
  spec.argv = {driver("drv_every_call")};
  spec.preload = preload;
  spec.env = std::move(env);
  return run(spec, scratch);
}

// The shim's own queries of a communicator it just saw created: its size and its rank (needed
// to count all-gather bytes) and its device, and the NCCL version and CUDA driver entry points
// (for the set-up exchange that every enabled rank on NCCL 2.28 joins whatever its
// ZEROCTA_ALLGATHER, so that ranks configured differently agree instead of hanging; the fake
// driver has no copy-engine API, so the exchange itself stops there). Nothing else: local
// queries that change no state.
bool is_shim_comm_query(const std::string& line) {
  for (const char* query :
       {"ncclCommCount ", "ncclCommUserRank ", "ncclCommCuDevice ", "ncclGetVersion ",
        "cuda cuGetProcAddress ", "cuda cuDriverGetVersion ", "cuda cuInit "})
    if (line.rfind(query, 0) == 0) return true;
  return false;
}

// Reports the first differing line, which says far more than two whole logs. With
// `allow_queries`, a comm query in the shim's log that is not the application's next line is
// the shim's own and is skipped; the application's own queries still have to match.
void expect_same_lines(const RunResult& want, const RunResult& got, const char* what,
                       bool allow_queries = false) {
  std::vector<std::string> a = want.log_lines(), b;
  for (const std::string& line : got.log_lines()) {
    const bool expected_next = b.size() < a.size() && a[b.size()] == line;
    if (allow_queries && !expected_next && is_shim_comm_query(line)) continue;
    b.push_back(line);
  }
  for (size_t i = 0; i < a.size() || i < b.size(); ++i) {
    std::string la = i < a.size() ? a[i] : "<end of log>";
    std::string lb = i < b.size() ? b[i] : "<end of log>";
    if (la != lb) {
      ADD_FAILURE() << what << ": log line " << i + 1 << " differs\n  without shim: " << la
                    << "\n  with shim:    " << lb << "\n"
                    << got.describe();
      return;
    }
  }
}

TEST(Forwarding, DriverCallsEveryHeaderFunctionWithoutShim) {
  // Guards the comparison below: the baseline really exercises every declared function.
  Scratch scratch;
  RunResult base = run_every_call(false, {}, scratch);
  ASSERT_EQ(base.exit_code, 0) << base.describe();
  std::set<std::string> fns = nccl_header_functions(nccl_header());
  ASSERT_GE(fns.size(), 40u);
  for (const std::string& fn : fns)
    EXPECT_FALSE(log_calls(base, fn).empty()) << fn << " never reached the fake NCCL";
}

TEST(Forwarding, KeepPolicyAndAllGatherOffLogIsIdentical) {
  Scratch scratch;
  RunResult base = run_every_call(false, {}, scratch);
  ASSERT_EQ(base.exit_code, 0) << base.describe();
  RunResult shim =
      run_every_call(true, {{"ZEROCTA_ALLGATHER", "off"}, {"ZEROCTA_CTA_POLICY", "keep"}}, scratch);
  ASSERT_EQ(shim.exit_code, 0) << shim.describe();
  EXPECT_EQ(shim.out, base.out);
  expect_same_lines(base, shim, "ZEROCTA_CTA_POLICY=keep ZEROCTA_ALLGATHER=off",
                    /*allow_queries=*/true);
}

TEST(Forwarding, DisabledShimLogIsByteIdentical) {
  Scratch scratch;
  RunResult base = run_every_call(false, {}, scratch);
  ASSERT_EQ(base.exit_code, 0) << base.describe();
  RunResult off = run_every_call(true, {{"ZEROCTA_ENABLE", "0"}}, scratch);
  ASSERT_EQ(off.exit_code, 0) << off.describe();
  EXPECT_EQ(off.out, base.out);
  expect_same_lines(base, off, "ZEROCTA_ENABLE=0");
  EXPECT_TRUE(off.log == base.log) << "logs differ in bytes (line endings, trailing data)";
}

TEST(Forwarding, DefaultPolicyChangesOnlyInitConfigs) {
  // With the shim active, the collectives and queries still arrive with identical arguments;
  // only communicator creation may differ (the policy). Makes the keep test above meaningful.
  Scratch scratch;
  RunResult base = run_every_call(false, {}, scratch);
  RunResult shim = run_every_call(true, {{"ZEROCTA_ALLGATHER", "off"}}, scratch);
  ASSERT_EQ(shim.exit_code, 0) << shim.describe();
  for (const char* fn :
       {"ncclReduce", "ncclBroadcast", "ncclBcast", "ncclAllReduce", "ncclReduceScatter",
        "ncclAllGather", "ncclAlltoAll", "ncclGather", "ncclScatter", "ncclSend", "ncclRecv",
        "ncclMemAlloc", "ncclCommRegister", "ncclRedOpCreatePreMulSum"}) {
    EXPECT_EQ(log_calls(shim, fn), log_calls(base, fn)) << fn;
  }
  std::vector<std::string> init = log_calls(shim, "ncclCommInitRankConfig");
  ASSERT_FALSE(init.empty()) << shim.describe();
  EXPECT_NE(log_calls(base, "ncclCommInitRankConfig"), init)
      << "the default policy (zero) left every init config unchanged";
}

TEST(Forwarding, NcclErrorsReachTheApplication) {
  // FAKE_NCCL_FAIL makes one fake function return ncclInternalError (3); the shim must hand
  // that result back, including from NCCL's inner call (ncclBcast -> ncclBroadcast) and from
  // the ncclCommInitRankConfig an ncclCommInitRank becomes.
  struct Case {
    const char* fail;
    const char* step;
  };
  const Case kCases[] = {{"ncclAllGather", "allgather"},
                         {"ncclAllReduce", "allreduce"},
                         {"ncclBroadcast", "bcast"},
                         {"ncclCommInitRankConfig", "init"},
                         {"ncclGetUniqueId", "uniqueid"}};
  for (const Case& c : kCases) {
    Scratch scratch;
    RunSpec spec;
    spec.argv = {driver("drv_script"), "uniqueid", "init", "allgather", "allreduce", "bcast"};
    spec.env = {{"FAKE_NCCL_FAIL", c.fail}};
    RunResult r = run(spec, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.num(c.step), 3) << "FAKE_NCCL_FAIL=" << c.fail << "\n" << r.describe();
  }
}

}  // namespace
}  // namespace itest
