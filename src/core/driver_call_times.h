// Counting the CUDA driver calls zerocta makes, in a diagnostic build only
// (driver_call_times.cc).
#pragma once
#include "cuda_driver.h"

namespace zc {
#ifdef ZC_DRIVER_CALL_TIMES
// Replaces the driver functions an all-gather may call by counting ones; reports at exit.
void time_driver_calls(CudaDriver* d);
// Calls counted so far of the driver function `name` (0 for one not counted).
uint64_t driver_calls(const char* name);
#else
inline void time_driver_calls(CudaDriver*) {}
#endif
}  // namespace zc
