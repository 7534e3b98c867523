#include "staged_allgather.h"

#include "cuda_driver.h"
#include "log.h"
#include "nonblocking_setup.h"
#include "real_nccl.h"

namespace zc {

std::vector<StagedChunk> staged_chunks(uint64_t per_rank, int nranks, uint64_t staging_bytes) {
  std::vector<StagedChunk> out;
  if (per_rank == 0 || nranks < 1) return out;
  uint64_t max_chunk = staging_bytes / static_cast<uint64_t>(nranks);
  if (max_chunk >= 4096) max_chunk &= ~uint64_t{4095};
  if (max_chunk == 0) return out;
  for (uint64_t off = 0; off < per_rank; off += max_chunk)
    out.push_back({off, std::min(max_chunk, per_rank - off)});
  return out;
}

StagingArea staging_area(const ArenaLayout& layout, bool capturing) {
  const uint64_t eager_end = layout.slot_offset(layout.eager_slots);
  if (capturing) return {eager_end, layout.slot_offset(layout.nslots) - eager_end};
  return {layout.slot_offset(0), eager_end - layout.slot_offset(0)};
}

namespace {

// Copy-in, NCCL's all-gather in place in the staging area, copy-out; for every chunk.
ncclResult_t issue_chunks(const CudaDriver& cu, const RealNccl& nccl, CommState& st,
                          CUdeviceptr stage, const std::vector<StagedChunk>& chunks,
                          CUdeviceptr send, CUdeviceptr recv, uint64_t per_rank, CUstream s,
                          const char** failed) {
  const uint64_t n = static_cast<uint64_t>(st.nranks);
  const uint64_t me = static_cast<uint64_t>(st.rank);
  for (const StagedChunk& c : chunks) {
    if (cu.cuMemcpyAsync(stage + me * c.bytes, send + c.offset, c.bytes, s) != CUDA_SUCCESS) {
      *failed = "copy-in";
      return ncclUnhandledCudaError;
    }
    ncclResult_t r = nccl.ncclAllGather(reinterpret_cast<void*>(stage + me * c.bytes),
                                        reinterpret_cast<void*>(stage), c.bytes, ncclUint8, st.comm,
                                        reinterpret_cast<cudaStream_t>(s));
    // The copy-out must follow NCCL's work on the stream: on a non-blocking comm NCCL may
    // still be enqueueing it (a blocking comm has enqueued it when the call returns).
    if (st.nonblocking) r = wait_in_progress(nccl, {st.comm}, r);
    if (r != ncclSuccess) {
      *failed = "NCCL's all-gather";
      return r;
    }
    bool ok = true;
    if (chunks.size() == 1) {
      ok = cu.cuMemcpyAsync(recv, stage, n * c.bytes, s) == CUDA_SUCCESS;
    } else {
      for (uint64_t r2 = 0; r2 < n && ok; ++r2)
        ok = cu.cuMemcpyAsync(recv + r2 * per_rank + c.offset, stage + r2 * c.bytes, c.bytes, s) ==
             CUDA_SUCCESS;
    }
    if (!ok) {
      *failed = "copy-out";
      return ncclUnhandledCudaError;
    }
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t staged_allgather(CommState& st, const void* sendbuff, void* recvbuff,
                              uint64_t bytes_per_rank, CUstream stream, bool capturing) {
  const CudaDriver* cu = cuda_driver();
  const RealNccl* nccl = real_nccl();
  std::lock_guard<std::mutex> lock(st.issue_mu);
  if (int p = st.poisoned.load(); p != ncclSuccess) return static_cast<ncclResult_t>(p);
  CeComm* ce = st.ce.get();
  if (!ce || !cu || !nccl) {
    st.poisoned.store(ncclInternalError);
    return ncclInternalError;
  }
  ScopedDevice dev(st.device);
  const StagingArea area = staging_area(ce->layout, capturing);
  const std::vector<StagedChunk> chunks = staged_chunks(bytes_per_rank, st.nranks, area.bytes);
  CUstream* streams = capturing ? ce->capture_streams : ce->streams;
  CUevent* events = capturing ? ce->capture_events : ce->events;
  CUstream s = streams[static_cast<int>(PlanStream::kCopyIn)];
  const char* failed = "joining the caller's stream";
  ncclResult_t r = ncclUnhandledCudaError;
  if (dev.ok() && !chunks.empty() && cu->cuEventRecord(events[0], stream) == CUDA_SUCCESS &&
      cu->cuStreamWaitEvent(s, events[0], 0) == CUDA_SUCCESS) {
    // A non-blocking comm may still be taking the application's previous call.
    r = st.nonblocking ? wait_in_progress(*nccl, {st.comm}, ncclSuccess) : ncclSuccess;
    if (r == ncclSuccess)
      r = issue_chunks(*cu, *nccl, st, reinterpret_cast<CUdeviceptr>(ce->arena) + area.offset,
                       chunks, reinterpret_cast<CUdeviceptr>(sendbuff),
                       reinterpret_cast<CUdeviceptr>(recvbuff), bytes_per_rank, s, &failed);
    if (r == ncclSuccess) {
      failed = "joining the caller's stream";
      if (cu->cuEventRecord(events[1], s) != CUDA_SUCCESS ||
          cu->cuStreamWaitEvent(stream, events[1], 0) != CUDA_SUCCESS)
        r = ncclUnhandledCudaError;
    }
  }
  if (r != ncclSuccess) {
    st.poisoned.store(r);
    ZC_WARN("staged all-gather failed on rank %d (%s: %s); the communicator is poisoned", st.rank,
            failed, nccl->ncclGetErrorString(r));
  }
  return r;
}

void staged_warmup(const std::vector<std::shared_ptr<CommState>>& comms) {
  const CudaDriver* cu = cuda_driver();
  const RealNccl* nccl = real_nccl();
  if (!cu || !nccl || comms.empty()) return;
  constexpr uint64_t kBytes = 4;
  const ncclResult_t r = grouped_calls(*nccl, comms, [&](size_t i) {
    const CommState& c = *comms[i];
    ScopedDevice dev(c.device);
    CUdeviceptr stage =
        reinterpret_cast<CUdeviceptr>(c.ce->arena) + staging_area(c.ce->layout, false).offset;
    return nccl->ncclAllGather(
        reinterpret_cast<void*>(stage + static_cast<uint64_t>(c.rank) * kBytes),
        reinterpret_cast<void*>(stage), kBytes, ncclUint8, c.comm,
        reinterpret_cast<cudaStream_t>(c.ce->streams[static_cast<int>(PlanStream::kCopyIn)]));
  });
  for (auto& c : comms) {
    ScopedDevice dev(c->device);
    if (r != ncclSuccess ||
        cu->cuStreamSynchronize(c->ce->streams[static_cast<int>(PlanStream::kCopyIn)]) !=
            CUDA_SUCCESS) {
      c->poisoned.store(r != ncclSuccess ? r : ncclUnhandledCudaError);
      ZC_WARN("NCCL's all-gather inside the pool failed on rank %d; the communicator is poisoned",
              c->rank);
    }
  }
}

}  // namespace zc
