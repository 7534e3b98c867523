// gtest glue shared by the GPU test binaries (parent process side).
#pragma once

#include <gtest/gtest.h>

#include "mp_harness.h"

// Skips the current test unless at least n GPUs are visible: NCCL needs one device per rank.
#define ZG_REQUIRE_GPUS(n)                                                    \
  do {                                                                        \
    const int zg_gpus_ = ::zgpu::visible_gpu_count();                         \
    if (zg_gpus_ == 0) GTEST_SKIP() << "no GPU";                              \
    if (zg_gpus_ < (n)) {                                                     \
      GTEST_SKIP() << "needs " << (n) << " GPUs, " << zg_gpus_ << " visible"; \
    }                                                                         \
  } while (0)

namespace zgpu {

// Timeouts for one run of ranks: env ZCTEST_GPU_TEST_TIMEOUT_S (total, default `total_s`)
// and ZCTEST_GPU_IDLE_TIMEOUT_S (no heartbeat, default 180).
inline RunOptions default_run_options(int total_s = 600) {
  RunOptions options;
  options.total_timeout_s = static_cast<int>(env_long("ZCTEST_GPU_TEST_TIMEOUT_S", total_s));
  options.idle_timeout_s = static_cast<int>(env_long("ZCTEST_GPU_IDLE_TIMEOUT_S", 180));
  return options;
}

}  // namespace zgpu
