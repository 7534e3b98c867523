// 4. NCCL loaded RTLD_LOCAL as a dependency of a dlopen()ed extension (the PyTorch way).
#include <gtest/gtest.h>

#include "config_bytes.h"
#include "harness.h"

namespace itest {
namespace {

TEST(RtldLocal, ExtensionOpenedLocallyIsStillIntercepted) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_torch_ext"), torch_ext_path()};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("nccl_global"), 0) << "the scenario is void: NCCL became global";
  for (const char* step : {"init", "allgather", "allreduce", "bcast", "destroy"})
    EXPECT_EQ(r.num(step), 0) << step << "\n" << r.describe();

  // The policy reached NCCL: ncclCommInitRank became ncclCommInitRankConfig with CTAPolicy 2.
  EXPECT_TRUE(log_calls(r, "ncclCommInitRank").empty()) << r.describe();
  SeenConfig seen = seen_config(r, "ncclCommInitRankConfig");
  ASSERT_TRUE(seen.present && !seen.null) << r.describe();
  EXPECT_EQ(seen.cta(), 2);

  ASSERT_NE(r.kv()["stats.end"], "absent") << "zerocta_get_stats not found with RTLD_DEFAULT";
  EXPECT_EQ(r.num("stats.end.allgather.passthrough.calls"), 1) << r.describe();
  EXPECT_EQ(r.num("stats.end.allgather.passthrough.bytes"), 2 * 1000 * 4);
  EXPECT_EQ(r.num("stats.end.allreduce.passthrough.calls"), 1);
  EXPECT_EQ(r.num("stats.end.broadcast.passthrough.calls"), 1);
  EXPECT_EQ(r.num("stats.end.comms_created"), 1);
  EXPECT_EQ(r.num("stats.end.comms_zero_policy"), 1);
  // The fake driver has no copy-engine functions: nothing may be routed there.
  EXPECT_EQ(r.num("stats.end.allgather.ce.calls"), 0);
  EXPECT_EQ(r.num("stats.end.comms_ce_ready"), 0);
}

}  // namespace
}  // namespace itest
