// Counters, the stats part of the public C API, the JSON file's trust rules, and the exit
// reporter (ZEROCTA_STATS=1 / a path with %p), including fork behaviour.
#include "stats.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "log.h"
#include "stats_snapshot.h"
#include "zerocta.h"

extern char** environ;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

bool all_counters_zero(const zerocta_stats_t& s) {
  for (int op = 0; op < zerocta_op_count; ++op) {
    for (int route = 0; route < zerocta_route_count; ++route) {
      if (s.counters[op][route].calls != 0 || s.counters[op][route].bytes != 0) return false;
    }
  }
  return s.comms_created == 0 && s.comms_zero_policy == 0 && s.comms_ce_ready == 0 &&
         s.inner_calls == 0;
}

zerocta_stats_t snapshot() {
  zerocta_stats_t s;
  EXPECT_EQ(zerocta_get_stats(&s), 0);
  return s;
}

// A fresh directory per test, removed (with its files) afterwards.
class StatsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/zerocta-stats-XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    zerocta_reset_stats();
  }
  void TearDown() override {
    const std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

TEST(Stats, ConcurrentCountsSumExactly) {
  zerocta_reset_stats();
  constexpr int kThreads = 8;
  constexpr uint64_t kIters = 200000;
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&go, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      for (uint64_t i = 0; i < kIters; ++i) {
        // Every thread hits the same hot counter, and one counter of its own.
        zc::stats_count(zerocta_op_allgather, zerocta_route_ce, static_cast<uint64_t>(t) + 1);
        zc::stats_count(static_cast<zerocta_op_t>(t % zerocta_op_count), zerocta_route_passthrough,
                        3);
      }
      zc::stats_comm_created(t % 2 == 0);
      zc::stats_inner_call();
    });
  }
  go.store(true, std::memory_order_release);
  for (std::thread& th : threads) th.join();

  const zerocta_stats_t s = snapshot();
  uint64_t expected_ce_bytes = 0;
  for (int t = 0; t < kThreads; ++t) expected_ce_bytes += (static_cast<uint64_t>(t) + 1) * kIters;
  EXPECT_EQ(s.counters[zerocta_op_allgather][zerocta_route_ce].calls, kThreads * kIters);
  EXPECT_EQ(s.counters[zerocta_op_allgather][zerocta_route_ce].bytes, expected_ce_bytes);
  for (int op = 0; op < zerocta_op_count; ++op) {
    const uint64_t threads_on_op = op < kThreads ? 1 : 0;  // thread t counts op t % 10
    EXPECT_EQ(s.counters[op][zerocta_route_passthrough].calls, threads_on_op * kIters) << op;
    EXPECT_EQ(s.counters[op][zerocta_route_passthrough].bytes, threads_on_op * kIters * 3) << op;
  }
  EXPECT_EQ(s.comms_created, static_cast<uint64_t>(kThreads));
  EXPECT_EQ(s.comms_zero_policy, static_cast<uint64_t>(kThreads / 2));
  EXPECT_EQ(s.inner_calls, static_cast<uint64_t>(kThreads));
}

TEST(Stats, ResetZeroesCountersButKeepsPoolGauge) {
  zc::stats_count(zerocta_op_broadcast, zerocta_route_nccl_ce, 100);
  zc::stats_comm_created(true);
  zc::stats_comm_ce_ready();
  zc::stats_inner_call();
  const uint64_t pool_before = snapshot().pool_bytes;
  zc::stats_pool_bytes_add(4096);
  EXPECT_FALSE(all_counters_zero(snapshot()));

  zerocta_reset_stats();
  const zerocta_stats_t s = snapshot();
  EXPECT_TRUE(all_counters_zero(s));
  // Memory still held after a reset is still held: the gauge is not a counter.
  EXPECT_EQ(s.pool_bytes, pool_before + 4096);
  zc::stats_pool_bytes_add(-4096);
  EXPECT_EQ(snapshot().pool_bytes, pool_before);
}

TEST(Stats, OutOfRangeCountIsIgnored) {
  zerocta_reset_stats();
  zc::stats_count(zerocta_op_count, zerocta_route_ce, 5);
  zc::stats_count(zerocta_op_allgather, zerocta_route_count, 5);
  zc::stats_count(static_cast<zerocta_op_t>(-1), zerocta_route_ce, 5);
  EXPECT_TRUE(all_counters_zero(snapshot()));
}

TEST(Stats, GetStatsRejectsNull) { EXPECT_EQ(zerocta_get_stats(nullptr), EINVAL); }

TEST(StatsApi, Names) {
  const char* const ops[] = {"allgather", "allreduce", "reducescatter", "broadcast", "reduce",
                             "alltoall",  "gather",    "scatter",       "send",      "recv"};
  ASSERT_EQ(sizeof(ops) / sizeof(ops[0]), static_cast<size_t>(zerocta_op_count));
  for (int op = 0; op < zerocta_op_count; ++op) {
    ASSERT_NE(zerocta_op_name(static_cast<zerocta_op_t>(op)), nullptr) << op;
    EXPECT_STREQ(zerocta_op_name(static_cast<zerocta_op_t>(op)), ops[op]);
  }
  EXPECT_STREQ(zerocta_route_name(zerocta_route_passthrough), "passthrough");
  EXPECT_STREQ(zerocta_route_name(zerocta_route_ce), "ce");
  EXPECT_STREQ(zerocta_route_name(zerocta_route_nccl_ce), "nccl-ce");
  EXPECT_EQ(zerocta_op_name(zerocta_op_count), nullptr);
  EXPECT_EQ(zerocta_op_name(static_cast<zerocta_op_t>(-1)), nullptr);
  EXPECT_EQ(zerocta_route_name(zerocta_route_count), nullptr);
  EXPECT_EQ(zerocta_route_name(static_cast<zerocta_route_t>(-1)), nullptr);
}

TEST(StatsApi, VersionEncodesHeaderMacros) {
  const int v = zerocta_version();
  EXPECT_EQ(v / 10000, ZEROCTA_VERSION_MAJOR);
  EXPECT_EQ(v / 100 % 100, ZEROCTA_VERSION_MINOR);
  EXPECT_EQ(v % 100, ZEROCTA_VERSION_PATCH);
}

TEST(StatsPath, ExpandsHostPidRankAndPercent) {
  zc::StatsPathFields f;
  f.host = "node7";
  f.pid = 4242;
  f.rank = "3";
  EXPECT_EQ(zc::stats_expand_path("/tmp/s-%p.json", f), "/tmp/s-4242.json");
  EXPECT_EQ(zc::stats_expand_path("/tmp/zc-%h-r%r.json", f), "/tmp/zc-node7-r3.json");
  EXPECT_EQ(zc::stats_expand_path("%p/%p", f), "4242/4242");
  EXPECT_EQ(zc::stats_expand_path("%h%r%p", f), "node734242");
  EXPECT_EQ(zc::stats_expand_path("a%%p-%%r-%%h", f), "a%p-%r-%h");
  EXPECT_EQ(zc::stats_expand_path("plain", f), "plain");
  EXPECT_EQ(zc::stats_expand_path("", f), "");
}

TEST(StatsPath, KeepsOtherPercentSequences) {
  zc::StatsPathFields f;
  f.host = "h";
  f.pid = 7;
  f.rank = "0";
  EXPECT_EQ(zc::stats_expand_path("%", f), "%");
  EXPECT_EQ(zc::stats_expand_path("x-%", f), "x-%");
  EXPECT_EQ(zc::stats_expand_path("%x%d%s", f), "%x%d%s");
  EXPECT_EQ(zc::stats_expand_path("%%%p", f), "%7");
  EXPECT_EQ(zc::stats_expand_path("%%%", f), "%%");
  EXPECT_EQ(zc::stats_expand_path("100%-%r", f), "100%-0");
}

zc::EnvLookup env_of(const std::map<std::string, std::string>& env) {
  return [env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

TEST(StatsPath, RankComesFromTheLaunchersVariablesInOrder) {
  EXPECT_EQ(zc::stats_rank(env_of({}), 99), "99");
  EXPECT_EQ(zc::stats_rank(nullptr, 99), "99");
  EXPECT_EQ(zc::stats_rank(env_of({{"SLURM_PROCID", "4"}}), 99), "4");
  EXPECT_EQ(zc::stats_rank(env_of({{"SLURM_PROCID", "4"}, {"PMI_RANK", "3"}}), 99), "3");
  EXPECT_EQ(zc::stats_rank(env_of({{"PMI_RANK", "3"}, {"OMPI_COMM_WORLD_RANK", "2"}}), 99), "2");
  EXPECT_EQ(zc::stats_rank(env_of({{"OMPI_COMM_WORLD_RANK", "2"}, {"RANK", "1"}}), 99), "1");
  EXPECT_EQ(zc::stats_rank(env_of({{"RANK", "0"}}), 99), "0");
  // Not a number (or absurdly long): the next variable, else the pid; never a path piece.
  EXPECT_EQ(zc::stats_rank(env_of({{"RANK", "../x"}, {"PMI_RANK", "5"}}), 99), "5");
  EXPECT_EQ(zc::stats_rank(env_of({{"RANK", ""}}), 99), "99");
  EXPECT_EQ(zc::stats_rank(env_of({{"RANK", "-1"}}), 99), "99");
  EXPECT_EQ(zc::stats_rank(env_of({{"RANK", "12345678901"}}), 99), "99");
}

TEST(StatsPath, ProcessFields) {
  const zc::StatsPathFields f = zc::stats_path_fields();
  EXPECT_EQ(f.pid, static_cast<long>(getpid()));
  EXPECT_FALSE(f.host.empty());
  EXPECT_EQ(f.host.find('.'), std::string::npos);
  EXPECT_EQ(f.host.find('/'), std::string::npos);
  EXPECT_FALSE(f.rank.empty());
}

TEST_F(StatsFileTest, JsonHasTotalsAndOnlyNonZeroPairs) {
  zc::stats_count(zerocta_op_allgather, zerocta_route_ce, 100);
  zc::stats_count(zerocta_op_allgather, zerocta_route_ce, 200);
  zc::stats_count(zerocta_op_allgather, zerocta_route_nccl_ce, 5);
  zc::stats_count(zerocta_op_recv, zerocta_route_passthrough, 9);
  zc::stats_comm_created(true);
  zc::stats_comm_created(false);
  zc::stats_comm_ce_ready();
  zc::stats_inner_call();
  zc::stats_inner_call();
  zc::stats_pool_bytes_add(1 << 20);
  const uint64_t pool = snapshot().pool_bytes;
  zc::stats_pair_settled(true);
  zc::stats_pair_settled(true);
  zc::stats_pair_settled(false);
  zc::stats_peer_mapped(3, 60 << 20, 1500);
  zc::stats_peer_unmapped(20 << 20);
  zc::stats_op_staged();
  zc::stats_push_deferred(40);
  zc::stats_push_deferred(-3);  // a clock step back counts as no wait
  zc::stats_op_host_times({10, 1, 300, 40, 25});
  zc::stats_op_host_times({12, 0, 0, 2, 23});
  // NCCL's own calls of forwarded collectives, beside the route's ops: 98 quick, 2 slow.
  for (int i = 0; i < 98; ++i) zc::stats_nccl_call_time(6);
  zc::stats_nccl_call_time(20);
  zc::stats_nccl_call_time(20);

  const std::string file = path("stats.json");
  ASSERT_EQ(zerocta_write_stats_json(file.c_str()), 0);
  zc::stats_pool_bytes_add(-(1 << 20));
  const std::string json = read_file(file);

  ASSERT_FALSE(json.empty());
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.substr(json.size() - 2), "}\n");
  char version[64];
  snprintf(version, sizeof(version), "\"version\":\"%d.%d.%d\"", ZEROCTA_VERSION_MAJOR,
           ZEROCTA_VERSION_MINOR, ZEROCTA_VERSION_PATCH);
  EXPECT_NE(json.find(version), std::string::npos) << json;
  EXPECT_NE(json.find("\"pid\":" + std::to_string(getpid()) + ","), std::string::npos) << json;
  EXPECT_NE(json.find("\"comms_created\":2,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"comms_zero_policy\":1,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"comms_ce_ready\":1,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"pool_bytes\":" + std::to_string(pool) + ","), std::string::npos) << json;
  EXPECT_NE(json.find("\"inner_calls\":2,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"route\":{\"pairs_each_pushes\":2,\"pairs_later_does_both\":1,"
                      "\"peer_mappings\":3,\"peer_mapped_bytes\":62914560,"
                      "\"peer_map_micros\":1500,\"peer_unmapped_bytes\":20971520,"
                      "\"staged_ops\":1,\"pushes_deferred\":2,\"deferred_claim_micros\":40,\"captured_ops\":0,\"local_group_ops\":0,\"host_ops\":2,\"host_post_micros\":22,"
                      "\"host_arrive_micros\":1,\"host_pair_wait_micros\":300,"
                      "\"host_reach_micros\":42,\"host_issue_micros\":48,"),
            std::string::npos)
      << json;
  // The medians lie in the upper op's bucket (12 us, 300 + 10 + ...), the exact buckets below 32.
  EXPECT_NE(json.find("\"host_post_p50_micros\":10.0,\"host_post_p90_micros\":12.0,"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"host_call_p50_micros\":"), std::string::npos) << json;
  EXPECT_NE(json.find("\"host_post_p90_micros\":12.0,\"host_post_p99_micros\":12.0,"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"nccl_calls\":100,\"nccl_call_p50_micros\":6.0,"
                      "\"nccl_call_p90_micros\":6.0,\"nccl_call_p99_micros\":20.0,"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"ops\":{\"allgather\":{\"ce\":{\"calls\":2,\"bytes\":300},"
                      "\"nccl-ce\":{\"calls\":1,\"bytes\":5}},"
                      "\"recv\":{\"passthrough\":{\"calls\":1,\"bytes\":9}}}"),
            std::string::npos)
      << json;
  // Pairs never counted are left out.
  EXPECT_EQ(json.find("allreduce"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"calls\":0,"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"allgather\":{\"passthrough\""), std::string::npos) << json;
  // Well-formed enough for any parser: balanced braces, no dangling commas.
  int depth = 0;
  for (char c : json) {
    depth += c == '{' ? 1 : c == '}' ? -1 : 0;
    ASSERT_GE(depth, 0);
  }
  EXPECT_EQ(depth, 0);
  EXPECT_EQ(json.find(",}"), std::string::npos) << json;
  EXPECT_EQ(json.find("{,"), std::string::npos) << json;
}

TEST_F(StatsFileTest, PeersMemoryHeldIsAGaugeReportedWithItsBound) {
  // The peers' memory mapped here and its bound per communicator (peer_memory.h): a gauge that
  // a reset keeps, in the JSON's route object.
  zc::stats_peer_held_budget(uint64_t{16} << 30);
  zc::stats_peer_held_add(3 << 20);
  zc::stats_reset();
  const std::string file = path("held.json");
  ASSERT_EQ(zerocta_write_stats_json(file.c_str()), 0);
  zc::stats_peer_held_add(-(3 << 20));
  const std::string json = read_file(file);
  EXPECT_NE(json.find("\"peer_held_bytes\":3145728,\"peer_held_budget_bytes\":17179869184}"),
            std::string::npos)
      << json;
}

TEST_F(StatsFileTest, JsonWithNothingCountedHasEmptyOps) {
  const std::string file = path("empty.json");
  ASSERT_EQ(zerocta_write_stats_json(file.c_str()), 0);
  EXPECT_NE(read_file(file).find("\"ops\":{}}"), std::string::npos) << read_file(file);
}

TEST_F(StatsFileTest, NewFileIsPrivate) {
  const mode_t old_mask = umask(0);  // the mode must come from zerocta, not from the umask
  const std::string file = path("new.json");
  const int rc = zerocta_write_stats_json(file.c_str());
  umask(old_mask);
  ASSERT_EQ(rc, 0);
  struct stat st;
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

TEST_F(StatsFileTest, ReplacesLongerContent) {
  const std::string file = path("old.json");
  write_file(file, std::string(100000, 'x'));
  ASSERT_EQ(zerocta_write_stats_json(file.c_str()), 0);
  const std::string json = read_file(file);
  EXPECT_EQ(json.find('x'), std::string::npos);
  EXPECT_EQ(json.front(), '{');
}

TEST_F(StatsFileTest, RefusesSymlink) {
  const std::string target = path("precious");
  const std::string link = path("link.json");
  write_file(target, "precious");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  EXPECT_EQ(zerocta_write_stats_json(link.c_str()), ELOOP);
  EXPECT_EQ(read_file(target), "precious");

  // A dangling link must not create its target either.
  const std::string missing = path("missing");
  const std::string dangling = path("dangling.json");
  ASSERT_EQ(symlink(missing.c_str(), dangling.c_str()), 0);
  EXPECT_EQ(zerocta_write_stats_json(dangling.c_str()), ELOOP);
  EXPECT_NE(access(missing.c_str(), F_OK), 0);
}

TEST_F(StatsFileTest, RefusesNonRegularFiles) {
  EXPECT_EQ(zerocta_write_stats_json("/dev/null"), EPERM);
  EXPECT_EQ(zerocta_write_stats_json(dir_.c_str()), EISDIR);
  EXPECT_EQ(zerocta_write_stats_json(""), EINVAL);
  EXPECT_EQ(zerocta_write_stats_json(nullptr), EINVAL);

  const std::string fifo = path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // No reader: refused in open() (ENXIO), never blocking the exit path.
  EXPECT_NE(zerocta_write_stats_json(fifo.c_str()), 0);
  // With a reader: open() succeeds, and the type check refuses it.
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  EXPECT_EQ(zerocta_write_stats_json(fifo.c_str()), EPERM);
  char byte;
  EXPECT_LE(read(reader, &byte, 1), 0) << "something was written into the FIFO";
  close(reader);
}

TEST_F(StatsFileTest, RefusesFileOwnedByAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create a file owned by another user";
  const std::string file = path("theirs.json");
  write_file(file, "theirs");
  if (chown(file.c_str(), 65534, 65534) != 0) {
    GTEST_SKIP() << "chown failed: " << strerror(errno);
  }
  EXPECT_EQ(zerocta_write_stats_json(file.c_str()), EPERM);
  EXPECT_EQ(read_file(file), "theirs");
}

TEST(StatsFork, ChildStartsFromZero) {
  if (getenv("ZCTEST_STATS_TEST_LOG_NONE") != nullptr) zc::log_set_level(zc::LogLevel::kNone);
  zc::stats_install_reporter();
  zerocta_reset_stats();
  zc::stats_count(zerocta_op_allgather, zerocta_route_ce, 1000);
  zc::stats_comm_created(true);
  zc::stats_pool_bytes_add(12345);
  const zerocta_stats_t parent_before = snapshot();

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    zerocta_stats_t s;
    if (zerocta_get_stats(&s) != 0) _exit(2);
    if (!all_counters_zero(s)) _exit(3);
    if (s.pool_bytes != 0) _exit(4);                                 // no GPU memory survives fork
    zc::stats_count(zerocta_op_send, zerocta_route_passthrough, 8);  // and it counts its own
    if (zerocta_get_stats(&s) != 0 || s.counters[zerocta_op_send][0].calls != 1) _exit(5);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: get_stats, 3: counters, 4: pool, 5: counting";

  // The parent's counters are its own, untouched by the child.
  const zerocta_stats_t parent_after = snapshot();
  EXPECT_EQ(memcmp(&parent_before, &parent_after, sizeof(parent_before)), 0);
  zc::stats_pool_bytes_add(-12345);
}

// --- exit reporter: a helper program (stats_child_main.cc) runs with ZEROCTA_STATS set -------

class StatsExitReport : public StatsFileTest {
 protected:
  // Runs the helper program zerocta_stats_child (its exit-report part) with ZEROCTA_STATS=stats;
  // its stderr goes to the file stderr_path(). Returns the child's pid after it exited with
  // status 0, or -1. write_now: its write-now part, which checks the file of that name itself.
  pid_t run_child(const std::string& stats, bool log_none = false,
                  const std::vector<std::string>& extra_env = {},
                  const std::string& write_now = "") {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (strncmp(*e, "ZEROCTA_", 8) == 0 || strncmp(*e, "ZCTEST_", 7) == 0) continue;
      // The rank variables steer %r; the tests set them as they need.
      bool rank_var = false;
      for (const char* v : {"RANK=", "OMPI_COMM_WORLD_RANK=", "PMI_RANK=", "SLURM_PROCID="})
        rank_var = rank_var || strncmp(*e, v, strlen(v)) == 0;
      if (!rank_var) env.emplace_back(*e);
    }
    env.push_back("ZEROCTA_STATS=" + stats);
    if (write_now.empty()) {
      env.push_back("ZCTEST_STATS_TEST_CHILD=1");
    } else {
      env.push_back("ZCTEST_STATS_TEST_WRITE_NOW=" + write_now);
    }
    if (log_none) env.push_back("ZCTEST_STATS_TEST_LOG_NONE=1");
    for (const std::string& extra : extra_env) env.push_back(extra);
    std::vector<char*> envp;
    for (std::string& var : env) envp.push_back(var.data());
    envp.push_back(nullptr);

    char exe[] = ZCTEST_STATS_CHILD;
    char* argv[] = {exe, nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    const std::string err = stderr_path();
    posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, exe, &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return -1;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return -1;
    }
    return pid;
  }
  std::string stderr_path() const { return path("child.stderr"); }
};

TEST_F(StatsExitReport, WritesJsonPerPidAtExit) {
  const pid_t child = run_child(path("stats-%p.json"));
  ASSERT_GT(child, 0) << read_file(stderr_path());

  const std::string json = read_file(path("stats-" + std::to_string(child) + ".json"));
  ASSERT_FALSE(json.empty()) << "no stats file for the child";
  EXPECT_NE(json.find("\"pid\":" + std::to_string(child) + ","), std::string::npos) << json;
  EXPECT_NE(json.find("\"allgather\":{\"ce\":{\"calls\":3,\"bytes\":3000}}"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"send\":{\"passthrough\":{\"calls\":1,\"bytes\":7}}"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"comms_created\":1,"), std::string::npos) << json;

  // The grandchild reported under its own pid, with none of its parent's counts.
  int others = 0;
  const std::string list = path("list");
  const std::string cmd = "ls '" + dir_ + "' | grep '^stats-.*\\.json$' > '" + list + "'";
  ASSERT_EQ(system(cmd.c_str()), 0);
  std::ifstream names(list);
  std::string name;
  while (std::getline(names, name)) {
    if (name == "stats-" + std::to_string(child) + ".json") continue;
    ++others;
    const std::string grandchild = read_file(path(name));
    EXPECT_NE(grandchild.find("\"ops\":{}}"), std::string::npos) << grandchild;
    EXPECT_NE(grandchild.find("\"comms_created\":0,"), std::string::npos) << grandchild;
  }
  EXPECT_EQ(others, 1) << "expected one report from the forked grandchild, none from the clone";
}

TEST_F(StatsExitReport, WritesOneFilePerRankWithHostAndRankPatterns) {
  char host[256] = "";
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  std::string short_host = host;
  short_host = short_host.substr(0, short_host.find('.'));
  for (const char* rank : {"0", "1"}) {
    const pid_t child = run_child(path("zc-%h-r%r.json"), false, {std::string("RANK=") + rank});
    ASSERT_GT(child, 0) << read_file(stderr_path());
    const std::string json = read_file(path("zc-" + short_host + "-r" + rank + ".json"));
    ASSERT_FALSE(json.empty()) << "no file for rank " << rank;
    EXPECT_NE(json.find("\"pid\":" + std::to_string(child) + ","), std::string::npos) << json;
  }
  // Without any rank variable %r is the pid.
  const pid_t child = run_child(path("zc-r%r.json"));
  ASSERT_GT(child, 0) << read_file(stderr_path());
  EXPECT_FALSE(read_file(path("zc-r" + std::to_string(child) + ".json")).empty());
}

TEST_F(StatsExitReport, WriteNowWritesWithoutExitHandlers) {
  const std::string file = path("now.json");
  ASSERT_GT(run_child(file, false, {}, file), 0)
      << "zerocta_stats_child's write-now part failed (see its exit codes)\n"
      << read_file(stderr_path());
}

TEST_F(StatsExitReport, UnwritableFileWarnsOncePerProcessNamingTheVariable) {
  const std::string bad = path("no-such-dir/s.json");
  ASSERT_GT(run_child(bad, false, {"ZCTEST_STATS_TEST_UNWRITABLE=1"}, bad), 0)
      << read_file(stderr_path());
  const std::string err = read_file(stderr_path());
  const size_t at = err.find("stats: cannot write the ZEROCTA_STATS file " + bad + ": ");
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find("stats: cannot write", at + 1), std::string::npos) << err;
}

TEST_F(StatsExitReport, PrintsTableToStderrWithOne) {
  ASSERT_GT(run_child("1"), 0) << read_file(stderr_path());
  const std::string err = read_file(stderr_path());
  const std::string ag = "stats allgather ce calls=3 bytes=3000";
  const size_t at = err.find(ag);
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find(ag, at + 1), std::string::npos) << "reported twice (grandchild?)\n" << err;
  EXPECT_NE(err.find("stats send passthrough calls=1 bytes=7"), std::string::npos) << err;
  EXPECT_EQ(err.find("stats allreduce"), std::string::npos) << err;  // zero rows left out
  EXPECT_NE(err.find("stats comms created=1 zero_policy=1"), std::string::npos) << err;
}

// ZEROCTA_STATS=1 is asked for by name: ZEROCTA_LOG=none must not swallow it.
TEST_F(StatsExitReport, PrintsTableEvenWithLogNone) {
  ASSERT_GT(run_child("1", /*log_none=*/true), 0) << read_file(stderr_path());
  const std::string err = read_file(stderr_path());
  EXPECT_NE(err.find("zerocta INFO stats allgather ce calls=3 bytes=3000"), std::string::npos)
      << err;
  EXPECT_NE(err.find("stats comms created=1 zero_policy=1"), std::string::npos) << err;
}

TEST_F(StatsExitReport, SilentWithZero) {
  ASSERT_GT(run_child("0"), 0) << read_file(stderr_path());
  EXPECT_EQ(read_file(stderr_path()).find("stats "), std::string::npos) << read_file(stderr_path());
}

}  // namespace
