#include "ce_allgather.h"

#include "ce_exec.h"
#include "config.h"
#include "log.h"

namespace zc {

bool stream_is_capturing(CUstream stream) {
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->ce_ok) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // The legacy stream cannot be captured, and querying it during another thread's global-mode
  // capture is itself an error; it never needs the question.
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return false;
  if (cu->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS) return true;  // be safe
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

ncclResult_t ce_allgather(CommState& st, const void* sendbuff, void* recvbuff, uint64_t bytes,
                          CUstream stream, bool capturing) {
  const CudaDriver* cu = cuda_driver();
  std::lock_guard<std::mutex> lock(st.issue_mu);
  if (int p = st.poisoned.load(); p != ncclSuccess) return static_cast<ncclResult_t>(p);
  CeComm* ce = st.ce.get();
  if (!ce || !ce->prepared || !cu) {
    st.poisoned.store(ncclInternalError);
    return ncclInternalError;
  }
  ScopedDevice dev(st.device);
  AllGatherArgs args;
  args.send = reinterpret_cast<uint64_t>(sendbuff);
  args.recv = reinterpret_cast<uint64_t>(recvbuff);
  args.bytes = bytes;
  const ArenaLayout& L = ce->layout;
  SlotRange eager{0, L.eager_slots}, graph{L.eager_slots, L.nslots - L.eager_slots};
  ce->plan.clear();
  const CeDirection dir =
      config().ce_direction == CeDirectionMode::kPush ? CeDirection::kPush : CeDirection::kPull;
  // Every op starts at the first slot of its range: nothing carries over from op to op, so a
  // capture that one rank discards or retries shifts no later op (each replay, like each eager
  // op, leaves the flags as it found them).
  uint64_t cursor = 0;
  ce->captured = ce->captured || capturing;
  build_allgather_plan(L, ce->view, args, capturing ? graph : eager, &cursor, &ce->plan, dir);
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  if (dev.ok())
    r = capturing
            ? issue_plan(*cu, ce->capture_streams, ce->capture_events, stream, ce->plan, false)
            : issue_plan(*cu, ce->streams, ce->events, stream, ce->plan, true);
  if (r != CUDA_SUCCESS) {
    st.poisoned.store(ncclUnhandledCudaError);
    ZC_WARN("copy-engine all-gather failed on rank %d (%s); the communicator is poisoned", st.rank,
            cuda_error_string(r));
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

}  // namespace zc
