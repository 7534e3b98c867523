// Where an eager op's device time goes, in a diagnostic build only (cmake
// -DZEROCTA_STREAM_PHASE_TIMES=ON; stream_phase_times.cc): timing events after the steps of the
// plan that mark its phases (the push stream taking the op, the ready handshake, each copy, the
// done handshake, the user's stream getting it back), read back on later ops and summarised to
// stderr at exit. It answers which part of an op's fixed cost is the flags, the copies or the
// host arriving late, which the op's total time alone cannot; a release build has none of it.
#pragma once

#include <cuda.h>

#include <vector>

#include "cuda_driver.h"
#include "direct_plan.h"

namespace zc {

#ifdef ZC_STREAM_PHASE_TIMES
// Called by issue_plan: `begin` before the plan's first step, `after` once step `i` (on stream
// `s`) is issued, `end` after the last. Captured plans are not marked.
void phase_begin(const CudaDriver& cu, const std::vector<DirectOp>& plan);
void phase_after(const CudaDriver& cu, const std::vector<DirectOp>& plan, size_t i, CUstream s);
void phase_end();
#else
inline void phase_begin(const CudaDriver&, const std::vector<DirectOp>&) {}
inline void phase_after(const CudaDriver&, const std::vector<DirectOp>&, size_t, CUstream) {}
inline void phase_end() {}
#endif

}  // namespace zc
