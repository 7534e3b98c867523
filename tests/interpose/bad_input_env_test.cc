// Bad ZEROCTA_* values in a real process. tests/unit/config_test.cc proves the parser rejects
// every bad value with one line and keeps the default, and the fuzzer explores it; what no
// other test covers is the preloaded library as a whole: for every variable (not only
// ZEROCTA_LOG, test_bad_config.cc), a bad value must give exactly one WARN line naming it,
// change no NCCL result, and with ZEROCTA_STRICT=1 refuse the calls. Also values the parser
// accepts but that are extreme (huge pools, chunks, thresholds), a ZEROCTA_STATS path that
// cannot be written, and a ZEROCTA_NCCL_LIBRARY that cannot be used.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "bad_input_log.h"
#include "harness.h"

namespace itest {
namespace {

enum class Kind { kWords, kSize, kCount, kString };
struct Var {
  const char* name;
  Kind kind;
};
// Every variable of the README's table (EnvTableIsTheReadmes checks the list is complete).
const Var kVars[] = {
    {"ZEROCTA_ENABLE", Kind::kWords},
    {"ZEROCTA_STRICT", Kind::kWords},
    {"ZEROCTA_LOG", Kind::kWords},
    {"ZEROCTA_CTA_POLICY", Kind::kWords},
    {"ZEROCTA_CTA_POLICY_FORCE", Kind::kWords},
    {"ZEROCTA_ALLGATHER", Kind::kWords},
    {"ZEROCTA_MIN_BYTES", Kind::kSize},
    {"ZEROCTA_AUTO_MAX_RANKS", Kind::kCount},
    {"ZEROCTA_REDUCESCATTER", Kind::kWords},
    {"ZEROCTA_RS_SCRATCH", Kind::kSize},
    {"ZEROCTA_RS_CTAS", Kind::kCount},
    {"ZEROCTA_STATS", Kind::kString},
    {"ZEROCTA_NVTX", Kind::kWords},
    {"ZEROCTA_NCCL_LIBRARY", Kind::kString},
    {"ZEROCTA_CHANNEL_DIR", Kind::kString},
};

// Words, junk, overflow, empty, signs, whitespace, other number spellings.
const char* const kBadValues[] = {
    "", "junk", "99999999999999999999", "-1", " 1", "1 ", "0x10", "1e9", "16777216T"};

RunResult run_script(const std::vector<std::pair<std::string, std::string>>& env,
                     const Scratch& scratch) {
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init", "allgather", "destroy"};
  spec.env = env;
  return run(spec, scratch);
}

std::vector<std::string> lines_with(const std::string& text, const std::string& a,
                                    const std::string& b) {
  std::vector<std::string> out;
  for (const std::string& line : split_lines(text))
    if (contains(line, a) && contains(line, b)) out.push_back(line);
  return out;
}

TEST(BadInputEnv, EnvTableIsTheReadmes) {
  std::ifstream in(std::string(ZEROCTA_SOURCE_DIR) + "/README.md");
  std::string line;
  std::set<std::string> readme, ours;
  bool table = false;
  while (std::getline(in, line)) {
    if (contains(line, "zerocta-env-table:begin")) table = true;
    if (contains(line, "zerocta-env-table:end")) table = false;
    if (table && line.rfind("| `ZEROCTA_", 0) == 0)
      readme.insert(line.substr(3, line.find('`', 3) - 3));
  }
  for (const Var& v : kVars) ours.insert(v.name);
  ASSERT_GE(readme.size(), 10u) << "README table not found";
  EXPECT_EQ(ours, readme) << "a variable was added or removed: update kVars";
}

TEST(BadInputEnv, EveryInvalidValueIsOneWarnLineAndChangesNoResult) {
  Scratch scratch;
  for (const Var& v : kVars) {
    if (v.kind == Kind::kString) continue;  // any text is a valid string (see below)
    for (const char* bad : kBadValues) {
      SCOPED_TRACE(std::string(v.name) + "=\"" + bad + "\"");
      RunResult r = run_script({{v.name, bad}}, scratch);
      ASSERT_EQ(r.signal, 0) << r.describe();
      ASSERT_EQ(r.exit_code, 0) << r.describe();
      EXPECT_EQ(r.num("init"), 0);
      EXPECT_EQ(r.num("allgather"), 0);
      EXPECT_EQ(r.num("destroy"), 0);
      EXPECT_EQ(lines_with(r.err, std::string(v.name) + "=", "is invalid").size(), 1u)
          << r.describe();
      EXPECT_EQ(lines_with(r.err, " WARN ", "").size(), 1u)
          << "nothing but the one line about the bad value\n"
          << r.describe();
    }
  }
}

TEST(BadInputEnv, StrictModeRefusesEveryInvalidValue) {
  Scratch scratch;
  for (const Var& v : kVars) {
    if (v.kind == Kind::kString || std::string(v.name) == "ZEROCTA_STRICT") continue;
    SCOPED_TRACE(v.name);
    RunResult r = run_script({{v.name, "junk"}, {"ZEROCTA_STRICT", "1"}}, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.num("init"), 5) << "ncclInvalidUsage expected\n" << r.describe();
    EXPECT_EQ(r.num("allgather"), 5);
    EXPECT_TRUE(log_calls(r, "ncclCommInitRankConfig").empty() &&
                log_calls(r, "ncclCommInitRank").empty())
        << r.describe();
  }
}

TEST(BadInputEnv, ExtremeValidSizesChangeNothingOnThePassThroughPath) {
  // Accepted by the parser; the copy-engine route can never be set up on the fake driver, so
  // what is exercised is start-up, the announcement, routing and the fingerprint.
  const std::vector<std::vector<std::pair<std::string, std::string>>> cases = {
      {{"ZEROCTA_MIN_BYTES", "0"}},
      {{"ZEROCTA_MIN_BYTES", "18446744073709551615"}},
      {{"ZEROCTA_MIN_BYTES", "16777215T"}, {"ZEROCTA_AUTO_MAX_RANKS", "0"}},
      {{"ZEROCTA_MIN_BYTES", "0"}, {"ZEROCTA_AUTO_MAX_RANKS", "1000000"}},
  };
  Scratch scratch;
  for (const char* mode : {"auto", "zerocta"}) {
    for (auto env : cases) {
      env.push_back({"ZEROCTA_ALLGATHER", mode});
      std::string what;
      for (const auto& kv : env) what += kv.first + "=" + kv.second + " ";
      SCOPED_TRACE(what);
      RunResult r = run_script(env, scratch);
      ASSERT_EQ(r.signal, 0) << r.describe();
      ASSERT_EQ(r.exit_code, 0) << r.describe();
      EXPECT_EQ(r.num("init"), 0);
      EXPECT_EQ(r.num("allgather"), 0);
      EXPECT_EQ(r.num("destroy"), 0);
      EXPECT_TRUE(lines_with(r.err, "is invalid", "").empty()) << r.describe();
    }
  }
}

TEST(BadInputEnv, StatsPathThatCannotBeWrittenWarnsOnceAndExitsCleanly) {
  Scratch scratch;
  const std::string long_path = scratch.path(std::string(5000, 'x') + ".json");
  for (const std::string& path :
       {std::string("/"), scratch.dir(), std::string("/nonexistent-zerocta-dir/stats.json"),
        long_path, scratch.path("no-such-dir/stats-%p.json")}) {
    SCOPED_TRACE("ZEROCTA_STATS=" + path.substr(0, 80));
    RunResult r = run_script({{"ZEROCTA_STATS", path}}, scratch);
    ASSERT_EQ(r.signal, 0) << r.describe();
    EXPECT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.num("allgather"), 0);
    EXPECT_EQ(lines_with(r.err, "stats: cannot write", "").size(), 1u) << r.describe();
  }
}

// (That each reason is said only once is KNOWN ISSUE 5, bad_input_known_issues_test.cc.)
TEST(BadInputEnv, UnusableNcclLibraryFailsEveryCallCleanly) {
  struct Case {
    std::string value;  // "" = unset
    std::string says;   // in the WARN line
  };
  const std::vector<Case> cases = {
      {"", "no NCCL library is loaded"},
      {"/nonexistent-zerocta-dir/libnccl.so.2", "could not be loaded"},
      {"/etc/hostname", "could not be loaded"},
      {"/", "could not be loaded"},
      {shim_path(), "is libzerocta itself"},
  };
  Scratch scratch;
  for (const Case& c : cases) {
    SCOPED_TRACE("ZEROCTA_NCCL_LIBRARY=" + c.value);
    RunSpec spec;
    spec.argv = {BAD_INPUT_DLSYM_DRIVER, "3"};
    if (!c.value.empty()) spec.env = {{"ZEROCTA_NCCL_LIBRARY", c.value}};
    RunResult r = run(spec, scratch);
    ASSERT_EQ(r.signal, 0) << r.describe();
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(r.num("call." + std::to_string(i)), 2) << "ncclSystemError expected";
    EXPECT_FALSE(lines_with(r.err, c.says, "").empty()) << r.describe();
  }
  // Control: the same program finds the library when it is usable.
  RunSpec spec;
  spec.argv = {BAD_INPUT_DLSYM_DRIVER, "3"};
  spec.env = {{"ZEROCTA_NCCL_LIBRARY", fake_dir() + "/libnccl.so.2"}};
  RunResult ok = run(spec, scratch);
  ASSERT_EQ(ok.exit_code, 0) << ok.describe();
  EXPECT_EQ(ok.num("call.2"), 0) << ok.describe();
  EXPECT_EQ(ok.num("version"), 22809) << ok.describe();
}

}  // namespace
}  // namespace itest
