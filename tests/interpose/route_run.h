// What the tests of the copy-engine route share: each test's own channel and rendezvous
// directories and unique id, the route's settings for the fake NCCL and fake CUDA driver
// (tests/fake_nccl, FAKE_CUDA_CE=1: memory really shared between processes, FAKE_CUDA_WAIT_MS: a
// stream's wait polls the flag a peer process writes), and a run of drivers/drv_route.cc.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

namespace itest {

using Env = std::vector<std::pair<std::string, std::string>>;

inline std::string unique_id_text() {
  static std::atomic<int> n{0};
  return "route-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// The settings of the route tests: auto for any size, INFO logs, the fake's copy-engine API,
// real waits (a rank's stream waits on the flags its peer's stream writes: up to 2 s).
inline Env route_env(const Scratch& chan, const Scratch& rdv, const std::string& id) {
  return {{"FAKE_CUDA_CE", "1"},
          {"FAKE_CUDA_WAIT_MS", "2000"},
          {"ZEROCTA_LOG", "info"},
          {"ZEROCTA_ALLGATHER", "auto"},
          {"ZEROCTA_MIN_BYTES", "0"},
          {"ZEROCTA_CHANNEL_DIR", chan.dir()},
          {"FAKE_NCCL_RENDEZVOUS_DIR", rdv.dir()},
          {"FAKE_NCCL_RENDEZVOUS_TIMEOUT_MS", "5000"},
          {"FAKE_NCCL_COMM_ID", id},
          {"DRV_TIMEOUT_S", "20"}};
}

inline Env with(Env env, const Env& more) {
  for (const auto& kv : more) {
    auto it =
        std::find_if(env.begin(), env.end(), [&](const auto& e) { return e.first == kv.first; });
    if (it != env.end())
      it->second = kv.second;
    else
      env.push_back(kv);
  }
  return env;
}

inline RunResult run_route(const std::vector<std::string>& args, const Env& env,
                           const Scratch& s, bool preload = true) {
  RunSpec spec;
  spec.argv = {driver("drv_route")};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = env;
  spec.preload = preload;
  spec.timeout_s = 40;
  return run(spec, s);
}

inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// The shim's lines of one process at one level ("INFO", "WARN").
inline std::vector<std::string> shim_lines(const RunResult& r, const std::string& pid,
                                           const std::string& level) {
  std::vector<std::string> out;
  for (const std::string& line : r.err_lines())
    if (contains(line, ":" + pid + ":") && contains(line, " zerocta " + level + " "))
      out.push_back(line);
  return out;
}

inline bool any_contains(const std::vector<std::string>& lines, const std::string& needle) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return contains(l, needle); });
}

// Its WARN lines.
inline std::vector<std::string> warns(const RunResult& r, const std::string& pid) {
  return shim_lines(r, pid, "WARN");
}

inline std::string pid_of(const RunResult& r, int rank) {
  return r.kv()["r" + std::to_string(rank) + ".pid"];
}
inline long long rnum(const RunResult& r, int rank, const std::string& key) {
  return r.num("r" + std::to_string(rank) + "." + key);
}

// Every rank exited cleanly, and the channel directory is empty.
inline void expect_clean_pair(const RunResult& r, const Scratch& chan, int nranks = 2) {
  EXPECT_FALSE(r.timed_out) << r.describe();
  for (int k = 0; k < nranks; ++k) {
    EXPECT_EQ(rnum(r, k, "exit"), 0) << "rank " << k << "\n" << r.describe();
    EXPECT_EQ(r.kv()["r" + std::to_string(k) + ".done"], "1") << "rank " << k << "\n"
                                                              << r.describe();
  }
  EXPECT_EQ(joined(files_in(chan.dir())), "") << "left in the channel directory";
}

}  // namespace itest
