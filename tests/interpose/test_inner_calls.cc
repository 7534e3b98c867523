// 5. NCCL calling its own API is passed straight through and not counted as the
// application's call, whichever thread it comes from.
#include <gtest/gtest.h>

#include "harness.h"

namespace itest {
namespace {

TEST(InnerCalls, BcastIsCountedOnceAndWindowRegisterFromNcclThread) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_inner_calls")};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("bcast"), 0);
  EXPECT_EQ(r.num("window_register"), 0);
  EXPECT_EQ(r.num("window_deregister"), 0);
  ASSERT_NE(r.kv()["stats.start"], "absent") << r.describe();

  // The scenario happened: the fake's ncclBcast reached NCCL's ncclBroadcast, and window
  // registration reached ncclCommRegister.
  EXPECT_EQ(log_calls(r, "ncclBcast").size(), 1u) << r.describe();
  EXPECT_EQ(log_calls(r, "ncclBroadcast").size(), 1u) << r.describe();
  EXPECT_EQ(log_calls(r, "ncclCommRegister").size(), 1u) << r.describe();

  auto delta = [&](const std::string& from, const std::string& to, const std::string& key) {
    return r.num("stats." + to + "." + key) - r.num("stats." + from + "." + key);
  };
  EXPECT_EQ(delta("start", "after_bcast", "broadcast.passthrough.calls"), 1)
      << "ncclBcast -> ncclBroadcast must count one broadcast, not two\n"
      << r.describe();
  EXPECT_GE(delta("start", "after_bcast", "inner_calls"), 1) << r.describe();
  EXPECT_GE(delta("after_bcast", "after_window", "inner_calls"), 1)
      << "ncclCommRegister from NCCL's own thread was not seen as an inner call\n"
      << r.describe();
  EXPECT_EQ(delta("after_bcast", "after_window", "broadcast.passthrough.calls"), 0);
}

}  // namespace
}  // namespace itest
