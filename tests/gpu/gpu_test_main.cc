// main() of every GPU test binary: makes the environment safe for the shared GPU host, says
// which NCCL and whether the shim are in the process, and optionally insists on them.
//
//   ZCTEST_EXPECT_SHIM=1|0          fail unless libzerocta.so is (1) / is not (0) loaded
//   ZCTEST_EXPECT_NCCL_VERSION=N    fail unless the loaded NCCL reports NCCL_VERSION_CODE N
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "mp_harness.h"
#include "rank_util.h"

int main(int argc, char** argv) {
  // NVLink multicast must stay off on the shared GPU hosts; every rank inherits these.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);

  const bool shim = zgpu::shim_get_stats() != nullptr;
  const int version = zgpu::real_nccl_version();
  printf("zerocta-gpu-test: nccl-version=%d nccl-library=%s zerocta-loaded=%s\n", version,
         zgpu::real_nccl_path().c_str(), shim ? "yes" : "no");
  fflush(stdout);

  const long expect_shim = zgpu::env_long("ZCTEST_EXPECT_SHIM", -1);
  if (expect_shim >= 0 && (expect_shim != 0) != shim) {
    fprintf(stderr, "zerocta-gpu-test: ZCTEST_EXPECT_SHIM=%ld but the shim is %s\n", expect_shim,
            shim ? "loaded" : "NOT loaded (check LD_PRELOAD)");
    return 1;
  }
  const long expect_version = zgpu::env_long("ZCTEST_EXPECT_NCCL_VERSION", -1);
  if (expect_version >= 0 && expect_version != version) {
    fprintf(stderr, "zerocta-gpu-test: ZCTEST_EXPECT_NCCL_VERSION=%ld but NCCL reports %d\n",
            expect_version, version);
    return 1;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
