// What the library says about its configuration (src/core/config_report.cc): at the first NCCL call
// and in zerocta_check_config.
#include "config_report.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "zerocta.h"

namespace zc {
namespace {

Config parse_env(const std::map<std::string, std::string>& env) {
  return parse_config([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ConfigReport, AGoodConfigIsOneInfoLineWithEverySetting) {
  const std::vector<ReportLine> lines = config_report(
      parse_env({{"ZEROCTA_ALLGATHER", "auto"}, {"ZEROCTA_MIN_BYTES", "1M"}}), {}, nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].level, LogLevel::kInfo);
  const std::string version = std::to_string(ZEROCTA_VERSION_MAJOR) + "." +
                              std::to_string(ZEROCTA_VERSION_MINOR) + "." +
                              std::to_string(ZEROCTA_VERSION_PATCH);
  EXPECT_EQ(lines[0].text.rfind("config: zerocta " + version + " ", 0), 0u) << lines[0].text;
  for (const char* field :
       {"ZEROCTA_ENABLE=1", "ZEROCTA_STRICT=0", "ZEROCTA_LOG=warn ", "ZEROCTA_CTA_POLICY=zero",
        "ZEROCTA_ALLGATHER=auto", "ZEROCTA_MIN_BYTES=1048576", "ZEROCTA_AUTO_MAX_RANKS=4",
        "ZEROCTA_STATS=0", "ZEROCTA_NVTX=1", "fingerprint="})
    EXPECT_TRUE(contains(lines[0].text, field)) << field << " missing in " << lines[0].text;
}

TEST(ConfigReport, BadValuesAndUnknownNamesWarnBeforeTheConfigLine) {
  const Config c = parse_env({{"ZEROCTA_ALLGATHER", "bogus"}, {"ZEROCTA_STRICT", "1"}});
  const char* const envp[] = {"ZEROCTA_ALLGATHR=auto", nullptr};
  const std::vector<ReportLine> lines = config_report(c, find_unknown_vars(envp), "1");
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0].level, LogLevel::kWarn);
  EXPECT_EQ(lines[0].text, c.errors[0]);
  EXPECT_TRUE(contains(lines[0].text, "ZEROCTA_ALLGATHER=\"bogus\" is invalid")) << lines[0].text;
  EXPECT_EQ(lines[1].level, LogLevel::kWarn);
  EXPECT_TRUE(contains(lines[1].text, "ZEROCTA_STRICT=1: NCCL calls fail")) << lines[1].text;
  EXPECT_EQ(lines[2].level, LogLevel::kWarn);
  EXPECT_EQ(lines[2].text,
            "ZEROCTA_ALLGATHR is not a zerocta variable and is ignored; did you mean "
            "ZEROCTA_ALLGATHER?");
  EXPECT_EQ(lines[3].level, LogLevel::kInfo);
  EXPECT_TRUE(contains(lines[3].text, "config: zerocta ")) << lines[3].text;
  EXPECT_EQ(lines[4].level, LogLevel::kWarn);
  EXPECT_TRUE(contains(lines[4].text, "NCCL_CTA_POLICY=\"1\" is set")) << lines[4].text;
}

TEST(ConfigReport, TheConfigLineSaysWhereTheLevelComesFrom) {
  const Config followed = parse_env({{"NCCL_DEBUG", "INFO"}});
  EXPECT_TRUE(contains(config_report(followed, {}, nullptr)[0].text,
                       " ZEROCTA_LOG=info (from NCCL_DEBUG) ZEROCTA_CTA_POLICY="));
  const Config own = parse_env({{"ZEROCTA_LOG", "debug"}, {"NCCL_DEBUG", "INFO"}});
  EXPECT_TRUE(
      contains(config_report(own, {}, nullptr)[0].text, " ZEROCTA_LOG=debug ZEROCTA_CTA_POLICY="));
}

TEST(ConfigReport, NcclCtaPolicyOnlyWarnsWhereZeroctaSetsThePolicy) {
  for (const char* keep : {"ZEROCTA_ENABLE=0", "ZEROCTA_CTA_POLICY=keep"}) {
    const std::string kv = keep;
    const size_t eq = kv.find('=');
    const auto lines = config_report(parse_env({{kv.substr(0, eq), kv.substr(eq + 1)}}), {}, "2");
    EXPECT_EQ(lines.size(), 1u) << keep;
  }
}

}  // namespace
}  // namespace zc
