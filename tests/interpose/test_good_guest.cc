// 8. A good guest: the shim changes nothing for programs that do not use NCCL, loads and
// calls nothing it does not need, leaves the current device alone and survives fork().
#include <gtest/gtest.h>
#include <unistd.h>

#include <sstream>

#include "harness.h"
#include "zerocta.h"

namespace itest {
namespace {

TEST(GoodGuest, BinTrueIsUnaffected) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {"/bin/true"};
  RunResult r = run(spec, scratch);
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.log, "");
}

TEST(GoodGuest, PythonIsUnaffected) {
  std::string python;
  std::istringstream path(getenv("PATH") ? getenv("PATH") : "");
  for (std::string dir; std::getline(path, dir, ':');) {
    std::string candidate = dir + "/python3";
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) {
      python = candidate;
      break;
    }
  }
  if (python.empty()) GTEST_SKIP() << "no python3 on PATH";
  Scratch scratch;
  RunSpec spec;
  spec.argv = {python, "-c", "pass"};
  RunResult r = run(spec, scratch);
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.err, "");
}

TEST(GoodGuest, NeedsOnlyTheCLibraries) {
  int rc = -1;
  std::string text = capture({"readelf", "-d", shim_path()}, &rc);
  ASSERT_EQ(rc, 0) << "readelf failed";
  const std::set<std::string> allowed = {"libc.so.6", "libdl.so.2", "libpthread.so.0", "libm.so.6",
                                         "ld-linux-x86-64.so.2"};
  int needed = 0;
  for (const std::string& line : split_lines(text)) {
    if (!contains(line, "(NEEDED)")) continue;
    size_t a = line.find('['), b = line.find(']');
    ASSERT_NE(a, std::string::npos) << line;
    std::string lib = line.substr(a + 1, b - a - 1);
    ++needed;
    EXPECT_EQ(allowed.count(lib), 1u) << "libzerocta.so must not need " << lib;
  }
  EXPECT_GE(needed, 1);
}

TEST(GoodGuest, LoadsNeitherCudaNorNcclUntilCalled) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_no_nccl")};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("shim_loaded"), 1) << "the scenario is void: the shim was not loaded";
  EXPECT_EQ(r.num("libcuda_mapped"), 0);
  EXPECT_EQ(r.num("libnccl_mapped"), 0);
  EXPECT_EQ(r.err, "");
}

// zerocta-run --check loads the library into python3, where there is no NCCL: checking the
// configuration must neither need NCCL nor load it (the fake one is on the search path here).
TEST(GoodGuest, CheckingTheConfigLoadsNeitherCudaNorNccl) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_no_nccl"), "check", shim_path()};
  spec.preload = false;
  spec.env = {{"ZEROCTA_ALLGATHER", "bogus"}, {"ZEROCTA_LOG", "none"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  ASSERT_EQ(r.num("shim_loaded"), 1) << r.describe();
  EXPECT_EQ(r.num("check_result"), 1) << r.describe();
  EXPECT_EQ(r.num("libcuda_mapped"), 0);
  EXPECT_EQ(r.num("libnccl_mapped"), 0);
  EXPECT_EQ(r.log, "") << "an NCCL or CUDA call was made";
  // Its report is written whatever ZEROCTA_LOG says, in the log's line format.
  const std::vector<std::string> lines = r.err_lines();
  ASSERT_EQ(lines.size(), 2u) << r.describe();
  EXPECT_TRUE(contains(lines[0], " zerocta WARN ZEROCTA_ALLGATHER=\"bogus\" is invalid"))
      << lines[0];
  EXPECT_TRUE(contains(lines[1], " zerocta INFO config: zerocta ")) << lines[1];
}

TEST(GoodGuest, HostOnlyCallsMakeNoCudaCalls) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "uniqueid",   "version",   "marker:m1", "init",
               "marker:m2",          "asyncerror", "marker:m3", "destroy"};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("uniqueid"), 0);
  EXPECT_EQ(r.num("version"), 0);
  EXPECT_EQ(r.num("init"), 0);
  EXPECT_EQ(r.num("asyncerror"), 0);
  std::string phase = "start";
  int cuda_in_init = 0;
  for (const std::string& line : r.log_lines()) {
    if (line.rfind("marker ", 0) == 0) {
      phase = line.substr(7);
    } else if (line.rfind("cuda ", 0) == 0) {
      EXPECT_NE(phase, "start") << "ncclGetUniqueId/ncclGetVersion made a CUDA call: " << line;
      EXPECT_NE(phase, "m2") << "ncclCommGetAsyncError made a CUDA call: " << line;
      if (phase == "m1") ++cuda_in_init;
    }
  }
  // The fake NCCL itself asks the driver for the current device at init: proves the log
  // does record CUDA calls.
  EXPECT_GE(cuda_in_init, 1) << r.describe();
}

TEST(GoodGuest, BlockingInitLeavesCurrentDeviceAlone) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_init_all"), "initrank"};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("result"), 0);
  EXPECT_EQ(r.num("dev_before"), 1);
  EXPECT_EQ(r.num("dev_after"), 1) << r.describe();
  EXPECT_EQ(r.num("comm0.device"), 1) << "the comm was created on the wrong device";
}

TEST(GoodGuest, ForkedChildStartsFromZero) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_fork")};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  ASSERT_NE(r.kv()["stats.parent_before_fork"], "absent") << r.describe();
  const std::string key = ".allreduce.passthrough.calls";
  EXPECT_EQ(r.num("stats.parent_before_fork" + key), 3);
  EXPECT_EQ(r.num("child_exit"), 0) << r.describe();
  EXPECT_EQ(r.num("child_call"), 0);
  EXPECT_EQ(r.num("stats.child_start" + key), 0) << r.describe();
  int counters = 0;
  for (const auto& kv : r.kv()) {
    const std::string& k = kv.first;
    if (k.rfind("stats.child_start.", 0) != 0) continue;
    if (k.size() < 6 || (k.substr(k.size() - 6) != ".calls" && k.substr(k.size() - 6) != ".bytes"))
      continue;
    ++counters;
    EXPECT_EQ(kv.second, "0") << k << " in the forked child";
  }
  EXPECT_GE(counters, 2 * zerocta_op_count * zerocta_route_count);
  EXPECT_EQ(r.num("stats.child_after_call" + key), 1) << r.describe();
  EXPECT_EQ(r.num("stats.parent_after_child" + key), 3);
}

}  // namespace
}  // namespace itest
