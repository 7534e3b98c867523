// 10. Logging in NCCL's format; the effective configuration printed once at ZEROCTA_LOG=info;
//     logging like NCCL: the level follows NCCL_DEBUG while ZEROCTA_LOG is unset, the lines go
//     to the file NCCL_DEBUG_FILE names, shared with NCCL's own (the fake NCCL writes that file
//     as NCCL does: tests/fake_nccl/fake_nccl_debug.cc).
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

// Whole lines of zerocta and of NCCL, as they may follow each other in one file.
const std::regex kZeroctaLine(R"(^[^:\s]+:\d+:\d+ \[-?\d+\] zerocta (INFO|WARN|DEBUG) \S.*$)");
const std::regex kNcclLine(R"(^[^:\s]+:\d+:\d+ \[\d+\] NCCL INFO \S.*$)");

// Indexes of the lines that contain `needle`.
std::vector<size_t> find_lines(const std::vector<std::string>& lines, const std::string& needle) {
  std::vector<size_t> at;
  for (size_t i = 0; i < lines.size(); ++i)
    if (contains(lines[i], needle)) at.push_back(i);
  return at;
}

std::string listing(const Scratch& scratch) {
  std::string names;
  for (const std::string& name : files_in(scratch.dir())) names += " " + name;
  return "files in " + scratch.dir() + ":" + names;
}

// NCCL_DEBUG_FILE's name, expanded as NCCL expands it, for the driver's pid.
std::string expanded(const Scratch& scratch, const std::string& prefix, const RunResult& r) {
  return scratch.path(prefix + "." + short_hostname() + "." + std::to_string(r.num("pid")));
}

TEST(Logs, LinesGoToTheFileNcclDebugFileNames) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "pid", "version", "init", "destroy"};
  spec.env = {{"ZEROCTA_LOG", "info"}, {"NCCL_DEBUG_FILE", scratch.path("zc.%h.%p")}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.err, "") << r.describe();
  const std::string file = expanded(scratch, "zc", r);
  const std::vector<std::string> lines = split_lines(read_file(file));
  ASSERT_FALSE(lines.empty()) << file << " is missing or empty; " << listing(scratch);
  for (const std::string& line : lines)
    EXPECT_TRUE(std::regex_match(line, kZeroctaLine)) << "not a whole zerocta line: " << line;
  EXPECT_EQ(find_lines(lines, " zerocta INFO config: zerocta ").size(), 1u) << read_file(file);
  EXPECT_EQ(find_lines(lines, "CTAPolicy").size(), 1u) << read_file(file);
}

// NCCL writes the same file through its own stream: fopen(name, "w") at its first line, which
// empties the file, then writes at its own offset. zerocta's lines from before that (the
// configuration at the first NCCL call) and after it must all be there, and NCCL's too.
TEST(Logs, SharesTheFileWithNcclsOwnLinesIntact) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "pid", "version", "init", "destroy", "init", "destroy"};
  spec.env = {{"NCCL_DEBUG", "INFO"}, {"NCCL_DEBUG_FILE", scratch.path("nccl.%h.%p")}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.err, "") << r.describe();
  const std::string file = expanded(scratch, "nccl", r);
  const std::string text = read_file(file);
  const std::vector<std::string> lines = split_lines(text);
  ASSERT_FALSE(lines.empty()) << file << " is missing or empty; " << listing(scratch);
  for (const std::string& line : lines)
    EXPECT_TRUE(std::regex_match(line, kZeroctaLine) || std::regex_match(line, kNcclLine))
        << "not a whole line of zerocta or NCCL: " << line << "\n"
        << text;
  // zerocta at NCCL_DEBUG=INFO: info.
  const std::vector<size_t> config = find_lines(lines, " zerocta INFO config: zerocta ");
  ASSERT_EQ(config.size(), 1u) << text;
  EXPECT_TRUE(contains(lines[config[0]], " ZEROCTA_LOG=info (from NCCL_DEBUG) ")) << text;
  const std::vector<size_t> policy = find_lines(lines, " zerocta INFO ncclCommInitRank: CTAPolicy");
  const std::vector<size_t> nccl_init = find_lines(lines, " NCCL INFO ncclCommInitRank");
  ASSERT_EQ(policy.size(), 2u) << text;
  ASSERT_EQ(nccl_init.size(), 2u) << text;
  EXPECT_EQ(find_lines(lines, " NCCL INFO ncclCommDestroy ").size(), 2u) << text;
  // The second init's line is written once NCCL has the file open: before NCCL's line of it.
  EXPECT_LT(policy[1], nccl_init[1]) << text;
}

// Lines held for NCCL's file reach a file at exit: NCCL's, or, when NCCL never opened it (no
// NCCL call wrote a line), one opened then.
TEST(Logs, HeldLinesAreWrittenAtExit) {
  for (const char* last : {"init", "uniqueid"}) {
    SCOPED_TRACE(last);
    Scratch scratch;
    RunSpec spec;
    spec.argv = {driver("drv_script"), "pid", "version", last};
    spec.env = {{"NCCL_DEBUG", "INFO"}, {"NCCL_DEBUG_FILE", scratch.path("nccl.%h.%p")}};
    RunResult r = run(spec, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.err, "") << r.describe();
    const std::string file = expanded(scratch, "nccl", r);
    const std::vector<std::string> lines = split_lines(read_file(file));
    EXPECT_EQ(find_lines(lines, " zerocta INFO config: zerocta ").size(), 1u)
        << read_file(file) << listing(scratch);
    bool nccl_wrote = false;
    for (const std::string& line : lines)
      nccl_wrote = nccl_wrote || std::regex_match(line, kNcclLine);
    EXPECT_EQ(nccl_wrote, std::string(last) == "init") << read_file(file);
  }
}

TEST(Logs, AFileThatCannotBeOpenedMeansStderr) {
  for (const char* nccl_debug : {"", "INFO"}) {
    SCOPED_TRACE(std::string("NCCL_DEBUG=") + nccl_debug);
    Scratch scratch;
    const std::string file = scratch.path("no-such-dir/zc.log");
    RunSpec spec;
    spec.argv = {driver("drv_script"), "version", "init", "destroy"};
    spec.env = {{"ZEROCTA_LOG", "info"}, {"NCCL_DEBUG_FILE", file}};
    if (nccl_debug[0] != '\0') spec.env.push_back({"NCCL_DEBUG", nccl_debug});
    RunResult r = run(spec, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const std::vector<std::string> lines = r.err_lines();
    EXPECT_EQ(find_lines(lines, " zerocta WARN NCCL_DEBUG_FILE " + file +
                                    " cannot be opened (No such file or directory): zerocta "
                                    "logs to stderr")
                  .size(),
              1u)
        << r.describe();
    EXPECT_EQ(find_lines(lines, " zerocta INFO config: zerocta ").size(), 1u) << r.describe();
  }
}

TEST(Logs, LevelFollowsNcclDebugWhileZeroctaLogIsUnset) {
  struct Case {
    std::vector<std::pair<std::string, std::string>> env;
    bool config_line;  // INFO shown
    bool typo_warn;    // WARN shown
  };
  const std::vector<Case> cases = {
      {{{"NCCL_DEBUG", "INFO"}}, true, true},
      {{{"NCCL_DEBUG", "trace"}}, true, true},
      {{{"NCCL_DEBUG", "WARN"}}, false, true},
      {{{"NCCL_DEBUG", "VERSION"}}, false, false},
      {{{"NCCL_DEBUG", "NONE"}}, false, false},
      // ZEROCTA_LOG wins.
      {{{"NCCL_DEBUG", "INFO"}, {"ZEROCTA_LOG", "warn"}}, false, true},
      {{{"NCCL_DEBUG", "NONE"}, {"ZEROCTA_LOG", "info"}}, true, true},
      {{{"NCCL_DEBUG", "TRACE"}, {"ZEROCTA_LOG", "none"}}, false, false},
  };
  for (const Case& c : cases) {
    std::string what;
    for (const auto& kv : c.env) what += kv.first + "=" + kv.second + " ";
    SCOPED_TRACE(what);
    Scratch scratch;
    RunSpec spec;
    spec.argv = {driver("drv_script"), "version", "init", "destroy"};
    spec.env = c.env;
    spec.env.push_back({"ZEROCTA_ALLGATHR", "auto"});  // a typo: one WARN
    RunResult r = run(spec, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const std::vector<std::string> lines = r.err_lines();
    EXPECT_EQ(find_lines(lines, " zerocta INFO config: ").size(), c.config_line ? 1u : 0u)
        << r.describe();
    EXPECT_EQ(find_lines(lines, " zerocta WARN ZEROCTA_ALLGATHR ").size(), c.typo_warn ? 1u : 0u)
        << r.describe();
  }
}

}  // namespace
}  // namespace itest
