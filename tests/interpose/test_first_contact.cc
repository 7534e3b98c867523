// What a user meets first, in a real process under LD_PRELOAD: silence where NCCL is never
// called, one WARN for a misspelt ZEROCTA_* variable at the first NCCL call, messages that say
// what went wrong, and a library that loads on glibc 2.34 (Ubuntu 22.04's 2.35, RHEL 9's 2.34).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <regex>
#include <sstream>

#include "harness.h"

namespace itest {
namespace {

const char* const kTypoLine =
    "ZEROCTA_ALLGATHR is not a zerocta variable and is ignored; did you mean ZEROCTA_ALLGATHER?";

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> out;
  for (const std::string& line : split_lines(text))
    if (contains(line, needle)) out.push_back(line);
  return out;
}

// The preload reaches every process of a job (compilers, nvidia-smi, inductor workers), and
// some of them parse their own output: without an NCCL call the library says nothing, whatever
// is set.
TEST(FirstContact, ProcessesThatNeverCallNcclPrintNothing) {
  Scratch scratch;
  const std::vector<std::vector<std::pair<std::string, std::string>>> envs = {
      {{"ZEROCTA_ALLGATHR", "auto"}},
      {{"ZEROCTA_ALLGATHR", "auto"}, {"ZEROCTA_LOG", "debug"}, {"ZEROCTA_STATS", "1"}},
      {{"ZEROCTA_LOG", "verbose"}, {"ZEROCTA_STRICT", "1"}, {"ZEROCTA_SOMETHING", "1"}},
  };
  for (const auto& env : envs) {
    std::string what;
    for (const auto& kv : env) what += kv.first + "=" + kv.second + " ";
    SCOPED_TRACE(what);
    RunSpec spec;
    spec.argv = {"/bin/true"};
    spec.env = env;
    RunResult r = run(spec, scratch);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.out, "") << r.describe();
    EXPECT_EQ(r.err, "") << r.describe();

    spec.argv = {"/bin/echo", "hi"};
    r = run(spec, scratch);
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.out, "hi\n") << r.describe();
    EXPECT_EQ(r.err, "") << r.describe();
    EXPECT_EQ(r.log, "") << r.describe();
  }
}

TEST(FirstContact, MisspeltVariableWarnsOnceAtTheFirstNcclCall) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "version", "init", "allgather", "allgather", "destroy"};
  spec.env = {{"ZEROCTA_ALLGATHR", "auto"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("allgather"), 0);
  const std::vector<std::string> lines = lines_with(r.err, "ZEROCTA_ALLGATHR");
  ASSERT_EQ(lines.size(), 1u) << r.describe();
  // NCCL's line format, WARN level, the library's words.
  static const std::regex kWarn(R"(^[^:\s]+:\d+:\d+ \[-?\d+\] zerocta WARN (.*)$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[0], m, kWarn)) << lines[0];
  EXPECT_EQ(m[1].str(), kTypoLine);
  EXPECT_EQ(lines_with(r.err, " WARN ").size(), 1u) << "nothing else to warn about\n"
                                                    << r.describe();
}

TEST(FirstContact, EachUnknownNameOnceKnownNamesNever) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init", "allgather", "destroy"};
  spec.env = {{"ZEROCTA_ALLGATHR", "auto"},
              {"ZEROCTA_SOAK_ITERS", "3"},
              {"ZEROCTA_LIB", "/nowhere/libzerocta.so"},  // zerocta-run's own
              {"ZEROCTA_ALLGATHER", "off"},
              {"ZEROCTA_MIN_BYTES", "1M"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(lines_with(r.err, kTypoLine).size(), 1u) << r.describe();
  const std::vector<std::string> far = lines_with(r.err, "ZEROCTA_SOAK_ITERS");
  ASSERT_EQ(far.size(), 1u) << r.describe();
  EXPECT_TRUE(contains(far[0],
                       "ZEROCTA_SOAK_ITERS is not a zerocta variable and is ignored (the "
                       "nearest zerocta variable is ZEROCTA_"))
      << far[0];
  EXPECT_EQ(lines_with(r.err, " WARN ").size(), 2u) << r.describe();
  EXPECT_TRUE(lines_with(r.err, "ZEROCTA_LIB").empty()) << r.describe();
}

TEST(FirstContact, ZeroctaLogNoneSilencesTheWarning) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init", "destroy"};
  spec.env = {{"ZEROCTA_ALLGATHR", "auto"}, {"ZEROCTA_LOG", "none"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.err, "") << r.describe();
}

// ZEROCTA_STRICT=1 with a bad value fails every call with ncclInvalidUsage; the strings NCCL's
// error functions return must say that this is zerocta's configuration, not a missing NCCL.
TEST(FirstContact, StrictModeErrorStringsNameTheConfiguration) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_every_call")};
  spec.env = {{"ZEROCTA_LOG", "verbose"}, {"ZEROCTA_STRICT", "1"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.signal, 0) << r.describe();
  const auto kv = r.kv();
  for (const char* fn : {"ncclGetErrorString", "ncclGetLastError"}) {
    SCOPED_TRACE(fn);
    ASSERT_EQ(kv.count(fn), 1u) << r.describe();
    const std::string& text = kv.at(fn);
    EXPECT_TRUE(contains(text, "configuration error")) << text;
    EXPECT_TRUE(contains(text, "ZEROCTA_STRICT=1")) << text;
    EXPECT_TRUE(contains(text, "ncclInvalidUsage")) << text;
    EXPECT_FALSE(contains(text, "could not be used")) << text;
  }
  EXPECT_EQ(lines_with(r.err, "ZEROCTA_STRICT=1").size(), 1u) << r.describe();
}

// Without ZEROCTA_STRICT the same strings come from NCCL.
TEST(FirstContact, ErrorStringsComeFromNcclOtherwise) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_every_call")};
  spec.env = {{"ZEROCTA_LOG", "verbose"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.signal, 0) << r.describe();
  const auto kv = r.kv();
  ASSERT_EQ(kv.count("ncclGetErrorString"), 1u) << r.describe();
  EXPECT_FALSE(contains(kv.at("ncclGetErrorString"), "zerocta")) << r.describe();
}

// "0.1.0" from include/zerocta.h's ZEROCTA_VERSION_MAJOR/MINOR/PATCH.
std::string header_version() {
  const std::string header = read_file(zerocta_header());
  std::string parts[3];
  const char* const names[3] = {"MAJOR", "MINOR", "PATCH"};
  for (int i = 0; i < 3; ++i) {
    std::smatch m;
    const std::regex def(std::string(R"(#define ZEROCTA_VERSION_)") + names[i] + R"( (\d+))");
    if (std::regex_search(header, m, def)) parts[i] = m[1].str();
  }
  return parts[0] + "." + parts[1] + "." + parts[2];
}

TEST(FirstContact, InfoConfigLineHasTheVersionAndEveryRoutingSetting) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init", "destroy"};
  spec.env = {{"ZEROCTA_LOG", "info"}, {"ZEROCTA_AUTO_MAX_RANKS", "4"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::vector<std::string> config = lines_with(r.err, " zerocta INFO config: ");
  ASSERT_EQ(config.size(), 1u) << r.describe();
  const std::string version = header_version();
  ASSERT_EQ(std::count(version.begin(), version.end(), '.'), 2) << version;
  EXPECT_TRUE(contains(config[0], " zerocta INFO config: zerocta " + version + " ")) << config[0];
  for (const char* field : {"ZEROCTA_ENABLE=1", "ZEROCTA_STRICT=0", "ZEROCTA_ALLGATHER=nccl",
                            "ZEROCTA_MIN_BYTES=", "ZEROCTA_AUTO_MAX_RANKS=4", "fingerprint="})
    EXPECT_TRUE(contains(config[0], field)) << field << " missing in " << config[0];
}

// The library must load where glibc is 2.34 (RHEL 9) or 2.35 (Ubuntu 22.04): no symbol it
// imports may carry a newer GLIBC_2.x version. (The static C++ runtime pulled arc4random from
// 2.36 and _dl_find_object from 2.35; src/interpose/glibc_compat.c defines both inside the library.)
TEST(FirstContactGlibc, NeedsNoSymbolVersionNewerThan2_34) {
  std::string objdump;
  std::istringstream path(getenv("PATH") ? getenv("PATH") : "");
  for (std::string dir; std::getline(path, dir, ':');) {
    if (!dir.empty() && access((dir + "/objdump").c_str(), X_OK) == 0) {
      objdump = dir + "/objdump";
      break;
    }
  }
  if (objdump.empty()) GTEST_SKIP() << "objdump not found (binutils)";
  int rc = -1;
  const std::string symbols = capture({objdump, "-T", shim_path()}, &rc);
  ASSERT_EQ(rc, 0) << "objdump -T " << shim_path() << " failed";
  static const std::regex kVersion(R"(GLIBC_2\.(\d+)(\.\d+)?)");
  int newest = 0, seen = 0;
  std::string offenders;
  for (const std::string& line : split_lines(symbols)) {
    std::smatch m;
    if (!std::regex_search(line, m, kVersion)) continue;
    ++seen;
    const int minor = std::stoi(m[1].str());
    newest = std::max(newest, minor);
    if (minor > 34) offenders += "\n  " + line;
  }
  EXPECT_GT(seen, 0) << "no GLIBC symbol versions found: is " << shim_path() << " a library?";
  EXPECT_TRUE(offenders.empty()) << "libzerocta.so needs a glibc newer than 2.34 for:" << offenders;
  RecordProperty("newest_glibc", "2." + std::to_string(newest));
}

}  // namespace
}  // namespace itest
