// The diagnostic build's driver-call accounting (src/core/driver_call_times.cc, compiled here with
// ZC_DRIVER_CALL_TIMES as -DZEROCTA_DRIVER_CALL_TIMES=ON compiles it into the library): the
// functions it replaces still reach the driver, with their arguments and results, and are
// counted; functions never called are not reported.
#include <gtest/gtest.h>

#include "driver_call_times.h"

namespace zc {
namespace {

int g_copies = 0;
CUdeviceptr g_last_dst = 0;

CUresult stub_copy(CUdeviceptr dst, CUdeviceptr, size_t bytes, CUstream) {
  ++g_copies;
  g_last_dst = dst;
  return bytes ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

TEST(DriverCallTimes, CountedCallsStillReachTheDriver) {
  CudaDriver cu{};
  cu.cuMemcpyAsync = stub_copy;
  time_driver_calls(&cu);
  ASSERT_NE(cu.cuMemcpyAsync, &stub_copy);  // replaced by the counting one
  EXPECT_EQ(cu.cuMemcpyAsync(0x1000, 0x2000, 64, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cu.cuMemcpyAsync(0x3000, 0x2000, 0, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(g_copies, 2);
  EXPECT_EQ(g_last_dst, 0x3000u);
  EXPECT_EQ(driver_calls("cuMemcpyAsync"), 2u);
  EXPECT_EQ(cu.cuStreamBatchMemOp, nullptr);  // absent functions stay absent
  EXPECT_EQ(driver_calls("cuStreamBatchMemOp"), 0u);
}

}  // namespace
}  // namespace zc
