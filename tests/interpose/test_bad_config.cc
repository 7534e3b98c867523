// 7. An invalid ZEROCTA_* value: one clear line, defaults kept; ZEROCTA_STRICT=1 refuses.
#include <gtest/gtest.h>

#include "harness.h"

namespace itest {
namespace {

RunResult run_script(std::vector<std::pair<std::string, std::string>> env, const Scratch& s) {
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init", "allgather", "destroy"};
  spec.env = std::move(env);
  return run(spec, s);
}

TEST(BadConfig, InvalidLogLevelIsReportedOnceAndIgnored) {
  Scratch scratch;
  RunResult r = run_script({{"ZEROCTA_LOG", "verbose"}}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 0);
  EXPECT_EQ(r.num("allgather"), 0);
  EXPECT_EQ(r.num("destroy"), 0);
  std::vector<std::string> lines;
  for (const std::string& line : r.err_lines())
    if (contains(line, "ZEROCTA_LOG")) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u) << r.describe();
  for (const char* word : {"verbose", "none", "warn", "info", "debug"})
    EXPECT_TRUE(contains(lines[0], word)) << "missing \"" << word << "\" in: " << lines[0];
}

TEST(BadConfig, StrictModeFailsTheNcclCall) {
  Scratch scratch;
  RunResult r = run_script({{"ZEROCTA_LOG", "verbose"}, {"ZEROCTA_STRICT", "1"}}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 5) << "expected ncclInvalidUsage\n" << r.describe();
  EXPECT_EQ(r.num("allgather"), 5) << r.describe();
  EXPECT_TRUE(log_calls(r, "ncclCommInitRankConfig").empty() &&
              log_calls(r, "ncclCommInitRank").empty())
      << "a refused call must not reach NCCL\n"
      << r.describe();
}

TEST(BadConfig, StrictModeWithValidValuesWorks) {
  Scratch scratch;
  RunResult r = run_script({{"ZEROCTA_LOG", "warn"}, {"ZEROCTA_STRICT", "1"}}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 0) << r.describe();
  EXPECT_EQ(r.num("allgather"), 0);
  EXPECT_FALSE(contains(r.err, "ZEROCTA_")) << "valid values, nothing to report\n" << r.describe();
}

}  // namespace
}  // namespace itest
