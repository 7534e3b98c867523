// 9. ZEROCTA_STATS: a table on stderr at exit, a JSON file per process, or nothing.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <regex>

#include "harness.h"

namespace itest {
namespace {

// 3 all-gathers and 5 all-reduces: distinct counts so each can be found in the output.
RunResult run_counted(std::vector<std::pair<std::string, std::string>> env, const Scratch& s) {
  RunSpec spec;
  spec.argv = {driver("drv_script"), "pid",       "init",      "allgather",
               "allgather",          "allgather", "allreduce", "allreduce",
               "allreduce",          "allreduce", "allreduce", "destroy"};
  spec.env = std::move(env);
  return run(spec, s);
}

// Whether stderr carries counters: a line naming a collective next to a number.
bool stats_on_stderr(const RunResult& r) {
  static const std::regex kCounter(R"((allgather|allreduce)\D*\d)");
  for (const std::string& line : r.err_lines())
    if (std::regex_search(line, kCounter)) return true;
  return false;
}

// A minimal JSON reader: enough to find numbers by the names on their path, whatever the
// exact schema ({"allgather": {"passthrough": {"calls": 3}}} or
// [{"op": "allgather", "route": "passthrough", "calls": 3}] both work).
class JsonScan {
 public:
  explicit JsonScan(const std::string& text) : s_(text) {}

  // Parses the document, recording every number leaf with its context: the keys on its path
  // plus the string values of the objects enclosing it.
  bool parse() {
    std::vector<std::string> ctx;
    bool ok = value(ctx);
    skip_ws();
    return ok && i_ == s_.size();
  }

  // Whether some number leaf named `key` with `value` has every word of `context`.
  bool has(const std::string& key, long long v, const std::vector<std::string>& context) const {
    for (const Leaf& l : leaves_) {
      if (l.key != key || l.value != v) continue;
      bool all = true;
      for (const std::string& w : context) {
        bool found = false;
        for (const std::string& c : l.context) found = found || c == w;
        all = all && found;
      }
      if (all) return true;
    }
    return false;
  }

 private:
  struct Leaf {
    std::string key;
    long long value;
    std::vector<std::string> context;
  };

  void skip_ws() {
    while (i_ < s_.size() && isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }

  bool string(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    out->clear();
    for (++i_; i_ < s_.size() && s_[i_] != '"'; ++i_) {
      if (s_[i_] == '\\') ++i_;
      if (i_ < s_.size()) *out += s_[i_];
    }
    ++i_;
    return i_ <= s_.size();
  }

  bool value(std::vector<std::string>& ctx, const std::string& key = "") {
    skip_ws();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{') return object(ctx);
    if (c == '[') {
      ++i_;
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
      for (;;) {
        if (!value(ctx, key)) return false;
        skip_ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
        return false;
      }
    }
    if (c == '"') {
      std::string ignored;
      return string(&ignored);
    }
    size_t start = i_;
    while (i_ < s_.size() && (isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' ||
                              s_[i_] == '+' || s_[i_] == '.'))
      ++i_;
    std::string tok = s_.substr(start, i_ - start);
    if (tok.empty()) return false;
    if (tok != "true" && tok != "false" && tok != "null")
      leaves_.push_back({key, strtoll(tok.c_str(), nullptr, 10), ctx});
    return true;
  }

  bool object(std::vector<std::string>& ctx) {
    ++i_;
    // First pass over the members' string values, so siblings see each other ("op": "allgather"
    // gives context to "calls": 3 in the same object).
    size_t save = i_;
    std::vector<std::string> strings = sibling_strings();
    i_ = save;
    size_t depth = ctx.size();
    ctx.insert(ctx.end(), strings.begin(), strings.end());
    skip_ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ctx.resize(depth);
      return ++i_, true;
    }
    for (;;) {
      skip_ws();
      std::string k;
      if (!string(&k)) return false;
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != ':') return false;
      ++i_;
      ctx.push_back(k);
      if (!value(ctx, k)) return false;
      ctx.pop_back();
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ctx.resize(depth);
        return ++i_, true;
      }
      return false;
    }
  }

  // String values of the current object's direct members (cursor just inside '{').
  std::vector<std::string> sibling_strings() {
    std::vector<std::string> out;
    int depth = 0;
    bool expect_value = false;
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == '"') {
        std::string str;
        string(&str);
        if (depth == 0 && expect_value) out.push_back(str);
        expect_value = false;
        continue;
      }
      if (c == '{' || c == '[') ++depth;
      if (c == '}' || c == ']') {
        if (depth == 0) break;
        --depth;
      }
      if (depth == 0 && c == ':') expect_value = true;
      if (depth == 0 && c == ',') expect_value = false;
      ++i_;
    }
    return out;
  }

  const std::string& s_;
  size_t i_ = 0;
  std::vector<Leaf> leaves_;
};

TEST(Stats, PrintedOnStderrAtExit) {
  Scratch scratch;
  RunResult r = run_counted({{"ZEROCTA_STATS", "1"}}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  bool allgather = false, allreduce = false;
  static const std::regex kThree(R"(\b3\b)"), kFive(R"(\b5\b)");
  for (const std::string& line : r.err_lines()) {
    if (contains(line, "allgather") && std::regex_search(line, kThree)) allgather = true;
    if (contains(line, "allreduce") && std::regex_search(line, kFive)) allreduce = true;
  }
  EXPECT_TRUE(allgather) << "no stderr line reports 3 all-gathers\n" << r.describe();
  EXPECT_TRUE(allreduce) << "no stderr line reports 5 all-reduces\n" << r.describe();
}

TEST(Stats, WrittenAsJsonPerProcess) {
  Scratch scratch;
  RunResult r = run_counted({{"ZEROCTA_STATS", scratch.path("x-%p.json")}}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_FALSE(stats_on_stderr(r)) << "a path means JSON only\n" << r.describe();
  std::string path = scratch.path("x-" + std::to_string(r.num("pid")) + ".json");
  std::string json = read_file(path);
  ASSERT_FALSE(json.empty()) << "no " << path << "; directory has:\n"
                             << ::testing::PrintToString(files_in(scratch.dir()));
  JsonScan scan(json);
  ASSERT_TRUE(scan.parse()) << "invalid JSON:\n" << json;
  EXPECT_TRUE(scan.has("calls", 3, {"allgather", "passthrough"})) << json;
  EXPECT_TRUE(scan.has("calls", 5, {"allreduce", "passthrough"})) << json;
  EXPECT_TRUE(scan.has("bytes", 3 * 2 * 1024 * 4, {"allgather", "passthrough"})) << json;
  EXPECT_FALSE(scan.has("calls", 5, {"allgather", "passthrough"})) << json;
}

// One file per rank of a job: %r from the launcher's rank variable, %h the host.
TEST(Stats, PerRankFileFromHostAndRankPatterns) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string short_host = host;
  short_host = short_host.substr(0, short_host.find('.'));
  // Every rank variable set empty (= not a rank), so the caller's environment cannot interfere.
  const std::vector<std::string> kRankVars = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                              "SLURM_PROCID"};
  auto env_with = [&](const std::string& pattern, const std::string& var, const std::string& v) {
    std::vector<std::pair<std::string, std::string>> env = {{"ZEROCTA_STATS", pattern}};
    for (const std::string& name : kRankVars) env.push_back({name, name == var ? v : ""});
    return env;
  };
  Scratch scratch;
  int value = 3;
  for (const char* var : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    SCOPED_TRACE(var);
    const std::string rank = std::to_string(value++);
    RunResult r = run_counted(env_with(scratch.path("zc-%h-r%r.json"), var, rank), scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    const std::string path = scratch.path("zc-" + short_host + "-r" + rank + ".json");
    const std::string json = read_file(path);
    ASSERT_FALSE(json.empty()) << "no " << path << "; directory has:\n"
                               << ::testing::PrintToString(files_in(scratch.dir()));
    EXPECT_TRUE(contains(json, "\"pid\":" + std::to_string(r.num("pid")) + ","));
    unlink(path.c_str());
  }
  // No rank variable: %r is the pid.
  RunResult r = run_counted(env_with(scratch.path("zc-r%r.json"), "", ""), scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const std::string path = scratch.path("zc-r" + std::to_string(r.num("pid")) + ".json");
  EXPECT_FALSE(read_file(path).empty()) << ::testing::PrintToString(files_in(scratch.dir()));
  unlink(path.c_str());
}

// An all-gather on buffers the application registered as a symmetric window is NCCL's own
// copy-engine op (route nccl-ce: moved off the legacy stream where NCCL needs it). Registered
// inside a group, the window exists only after the group's end (NCCL 2.28, and the fake):
// the shim must read it there, not at the call.
TEST(Stats, AllGatherInAWindowRegisteredInsideAGroupIsNcclCe) {
  for (const char* how : {"window", "groupwindow"}) {
    SCOPED_TRACE(how);
    Scratch s;
    RunSpec spec;
    spec.argv = {driver("drv_script"), "init", how, "allgather", "stats:after", "destroy"};
    RunResult r = run(spec, s);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.num(how), 0) << r.describe();
    EXPECT_EQ(r.num("window_handed_out"), 1) << r.describe();
    if (std::string(how) == "groupwindow") {
      EXPECT_EQ(r.num("window_before_end"), 0) << "the fake hands the window out at once";
    }
    EXPECT_EQ(r.num("stats.after.allgather.nccl-ce.calls"), 1) << r.describe();
    EXPECT_EQ(r.num("stats.after.allgather.passthrough.calls"), 0) << r.describe();
  }
}

TEST(Stats, AllGatherInAWindowOfANonBlockingCommIsNcclCeOnceNcclWroteIt) {
  // On a non-blocking comm NCCL answers the registration ncclInProgress and writes the handle
  // when its job is done, which the application learns by polling: the shim read it right
  // after the call (NULL) and never saw the window.
  Scratch s;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init",        "ready",  "window", "ready",
               "allgather",          "stats:after", "destroy"};
  spec.env = {{"NCCL_COMM_BLOCKING", "0"}};
  RunResult r = run(spec, s);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("window"), 7) << "the fake answers ncclInProgress\n" << r.describe();
  EXPECT_EQ(r.num("window_handed_out"), 0) << r.describe();
  EXPECT_EQ(r.num("ready.1"), 0) << r.describe();
  EXPECT_GT(r.num("ready_polls.1"), 0) << "the registration was in progress for some polls";
  EXPECT_EQ(r.num("window_now.1"), 1) << r.describe();
  EXPECT_EQ(r.num("stats.after.allgather.nccl-ce.calls"), 1) << r.describe();
  EXPECT_EQ(r.num("stats.after.allgather.passthrough.calls"), 0) << r.describe();
}

TEST(Stats, NothingWhenUnset) {
  Scratch scratch;
  RunResult r = run_counted({}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_FALSE(stats_on_stderr(r)) << r.describe();
  for (const std::string& name : files_in(scratch.dir()))
    EXPECT_TRUE(name == "stdout" || name == "stderr" || name == "nccl.log") << name;
}

}  // namespace
}  // namespace itest
