// 10. Logging in NCCL's format; the effective configuration printed once at ZEROCTA_LOG=info.
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>

#include "harness.h"

namespace itest {
namespace {

std::string short_hostname() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string h = host;
  return h.substr(0, h.find('.'));
}

TEST(Logs, InfoPrintsEffectiveConfigOnceInNcclFormat) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "pid", "version", "version", "init", "allgather", "destroy"};
  spec.env = {{"ZEROCTA_LOG", "info"}, {"ZEROCTA_CTA_POLICY", "efficiency"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string pid = std::to_string(r.num("pid"));
  // host:pid:tid [dev] zerocta LEVEL message
  static const std::regex kLine(
      R"(^([^:\s]+):(\d+):(\d+) \[-?\d+\] zerocta (INFO|WARN|DEBUG) \S.*$)");
  int config_lines = 0, info_lines = 0;
  for (const std::string& line : r.err_lines()) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, kLine)) << "not in NCCL's format: " << line;
    EXPECT_EQ(m[1].str(), short_hostname()) << line;
    EXPECT_EQ(m[2].str(), pid) << line;
    if (m[4] == "INFO") ++info_lines;
    if (contains(line, "ZEROCTA_CTA_POLICY=")) {
      ++config_lines;
      EXPECT_EQ(m[4].str(), "INFO") << line;
      EXPECT_TRUE(contains(line, "ZEROCTA_CTA_POLICY=efficiency")) << line;
      EXPECT_TRUE(contains(line, "ZEROCTA_ALLGATHER=")) << line;
    }
  }
  EXPECT_GE(info_lines, 1) << r.describe();
  EXPECT_EQ(config_lines, 1) << "the effective configuration must be printed exactly once\n"
                             << r.describe();
}

TEST(Logs, DefaultLevelIsQuiet) {
  // All-gather routing off: nothing can be unavailable, so WARN level has nothing to say.
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "version", "init", "allgather", "destroy"};
  spec.env = {{"ZEROCTA_ALLGATHER", "off"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.err, "") << r.describe();
}

}  // namespace
}  // namespace itest
