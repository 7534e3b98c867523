// zc::NvtxRange observed through a real NVTX3 injection: runs nvtx_probe with
// NVTX_INJECTION64_PATH=<zerocta_nvtx_recorder> and checks what the tool saw.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string field;
  while (std::getline(ss, field, sep)) out.push_back(field);
  return out;
}

// The value of "key=value" among the fields, or "" when absent.
std::string field_value(const std::vector<std::string>& fields, const std::string& key) {
  for (const std::string& f : fields) {
    if (f.compare(0, key.size() + 1, key + "=") == 0) return f.substr(key.size() + 1);
  }
  return "";
}

class NvtxRangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/zerocta-nvtx-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    record_ = dir_ + "/record.txt";
  }
  void TearDown() override {
    unlink(record_.c_str());
    rmdir(dir_.c_str());
  }

  // Runs the probe with the inherited environment minus the variables under test, plus extra.
  // Returns its exit status (or -1 when it did not exit normally).
  int run_probe(const std::vector<std::string>& extra) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string var(*e);
      if (var.rfind("NVTX_INJECTION", 0) == 0 || var.rfind("ZEROCTA_", 0) == 0 ||
          var.rfind("ZCTEST_", 0) == 0)
        continue;
      env.push_back(var);
    }
    env.insert(env.end(), extra.begin(), extra.end());
    std::vector<char*> envp;
    for (std::string& var : env) envp.push_back(var.data());
    envp.push_back(nullptr);
    char probe[] = ZEROCTA_NVTX_PROBE_PATH;
    char* argv[] = {probe, nullptr};
    pid_t pid;
    if (posix_spawn(&pid, probe, nullptr, nullptr, argv, envp.data()) != 0) return -1;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
  }

  std::vector<std::string> record_lines() {
    std::vector<std::string> lines;
    std::ifstream in(record_);
    std::string line;
    while (std::getline(in, line)) lines.push_back(line);
    return lines;
  }

  bool record_exists() {
    struct stat st;
    return stat(record_.c_str(), &st) == 0;
  }

  std::string dir_;
  std::string record_;
};

TEST_F(NvtxRangeTest, ToolSeesDomainMessagePayloadAndBalancedRanges) {
  ASSERT_EQ(run_probe({"NVTX_INJECTION64_PATH=" ZEROCTA_NVTX_RECORDER_PATH,
                       "ZCTEST_NVTX_RECORD=" + record_, "ZEROCTA_NVTX=1"}),
            0);
  const std::vector<std::string> lines = record_lines();
  ASSERT_FALSE(lines.empty()) << "the recorder was not loaded";
  EXPECT_EQ(lines[0], "init");

  int domains = 0;
  std::map<std::string, int> registered;                 // text -> count
  std::map<std::string, std::vector<std::string>> push;  // msg -> fields
  std::map<std::string, int> depth_by_tid;
  std::map<std::string, int> pushes_by_tid;
  for (const std::string& line : lines) {
    const std::vector<std::string> f = split(line, '\t');
    ASSERT_FALSE(f.empty());
    if (f[0] == "domain_create") {
      ASSERT_EQ(f.size(), 2u);
      EXPECT_EQ(f[1], "zerocta");
      ++domains;
    } else if (f[0] == "register") {
      ASSERT_EQ(f.size(), 3u);
      EXPECT_EQ(f[1], "zerocta");
      ++registered[f[2]];
    } else if (f[0] == "push" || f[0] == "pop") {
      ASSERT_GE(f.size(), 3u) << line;
      EXPECT_EQ(f[2], "zerocta") << line;
      const std::string& tid = f[1];
      depth_by_tid[tid] += f[0] == "push" ? 1 : -1;
      EXPECT_GE(depth_by_tid[tid], 0) << "pop without push: " << line;
      EXPECT_EQ(field_value(f, "depth"), std::to_string(depth_by_tid[tid])) << line;
      if (f[0] == "push") {
        ++pushes_by_tid[tid];
        const std::string msg = field_value(f, "msg");
        EXPECT_EQ(push.count(msg), 0u) << "range recorded twice: " << line;
        push[msg] = f;
      }
    }
  }
  EXPECT_EQ(domains, 1) << "the domain must be created once, shared by all threads";
  // Every (op, route) pair is registered exactly once, e.g. "allgather ce".
  EXPECT_EQ(registered.size(), 10u * 3u);
  for (const auto& r : registered) EXPECT_EQ(r.second, 1) << r.first;
  EXPECT_EQ(registered.count("allgather ce"), 1u);
  EXPECT_EQ(registered.count("reducescatter nccl-ce"), 1u);

  // The three in-range ranges of the probe, with their byte counts as payload; the
  // out-of-range op recorded nothing.
  ASSERT_EQ(push.size(), 3u);
  ASSERT_EQ(push.count("allgather ce"), 1u);
  ASSERT_EQ(push.count("allreduce passthrough"), 1u);
  ASSERT_EQ(push.count("reducescatter nccl-ce"), 1u);
  const auto& ag = push["allgather ce"];
  const auto& ar = push["allreduce passthrough"];
  const auto& rs = push["reducescatter nccl-ce"];
  EXPECT_EQ(field_value(ag, "payload_u64"), "268435456");
  EXPECT_EQ(field_value(ar, "payload_u64"), "1024");
  EXPECT_EQ(field_value(rs, "payload_u64"), "4096");
  EXPECT_EQ(field_value(ag, "depth"), "1");
  EXPECT_EQ(field_value(ar, "depth"), "2") << "allreduce was opened inside allgather";
  EXPECT_EQ(ag[1], ar[1]);
  EXPECT_NE(ag[1], rs[1]) << "reducescatter ran on its own thread";
  // Routes are told apart by color; each color is opaque ARGB.
  EXPECT_NE(field_value(ag, "color"), field_value(ar, "color"));
  EXPECT_NE(field_value(ag, "color"), field_value(rs, "color"));
  EXPECT_NE(field_value(ar, "color"), field_value(rs, "color"));
  for (const auto* f : {&ag, &ar, &rs}) EXPECT_EQ(field_value(*f, "color").substr(0, 4), "0xFF");

  // Balanced: every thread ends at depth 0.
  EXPECT_EQ(depth_by_tid.size(), 2u);
  for (const auto& d : depth_by_tid) EXPECT_EQ(d.second, 0) << "thread " << d.first;
}

TEST_F(NvtxRangeTest, DisabledByConfigRecordsNothing) {
  ASSERT_EQ(run_probe({"NVTX_INJECTION64_PATH=" ZEROCTA_NVTX_RECORDER_PATH,
                       "ZCTEST_NVTX_RECORD=" + record_, "ZEROCTA_NVTX=0"}),
            0);
  // Not even "init": with ZEROCTA_NVTX=0 zerocta makes no NVTX call, so NVTX never loads a tool.
  EXPECT_FALSE(record_exists()) << "recorded with ZEROCTA_NVTX=0";
}

TEST_F(NvtxRangeTest, RunsWithoutATool) {
  // No injection: the domain handle is null and ranges are skipped, without crashing.
  ASSERT_EQ(run_probe({"ZCTEST_NVTX_RECORD=" + record_, "ZEROCTA_NVTX=1"}), 0);
  EXPECT_FALSE(record_exists());
}

}  // namespace
