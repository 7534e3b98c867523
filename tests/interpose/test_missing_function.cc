// 6. A function the loaded NCCL lacks: an NCCL error and one WARN naming it, never a crash.
#include <gtest/gtest.h>

#include "harness.h"

namespace itest {
namespace {

TEST(MissingFunction, ShrinkOnOldLibraryFailsWithOneWarning) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init", "shrink", "shrink", "allreduce", "destroy"};
  spec.library_path = fake_old_dir() + ":" + fake_dir();  // libcuda.so.1 from the fake dir
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("init"), 0);
  EXPECT_EQ(r.num("shrink"), 3) << "expected ncclInternalError\n" << r.describe();
  EXPECT_EQ(r.num("shrink.1"), 3) << r.describe();
  EXPECT_EQ(r.num("allreduce"), 0) << "other calls keep working";
  EXPECT_EQ(r.num("destroy"), 0);
  int warns = 0;
  for (const std::string& line : r.err_lines())
    if (contains(line, "WARN") && contains(line, "ncclCommShrink")) ++warns;
  EXPECT_EQ(warns, 1) << r.describe();
  EXPECT_TRUE(log_calls(r, "ncclCommShrink").empty());
}

TEST(MissingFunction, ShrinkOnCurrentLibraryWorks) {
  // Control for the test above: the same script against the full fake succeeds quietly.
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init", "shrink", "destroy"};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("shrink"), 0) << r.describe();
  EXPECT_EQ(log_calls(r, "ncclCommShrink").size(), 1u);
  EXPECT_FALSE(contains(r.err, "ncclCommShrink")) << r.describe();
}

}  // namespace
}  // namespace itest
