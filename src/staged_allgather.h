// ZEROCTA_ALLGATHER=nccl-staged: NCCL's own copy-engine all-gather, run inside zerocta's pool.
// The pool is an NCCL symmetric window on every rank and the comm has the zero-CTA policy, so
// an all-gather whose buffers both lie in the pool takes NCCL's CE path. Per chunk: my chunk
// is copied in at my offset of the staging area, NCCL all-gathers in place there, and the n
// chunks are copied out to recvbuff. All of it runs on one internal stream joined to the
// caller's by events: the staging area is reused in stream order, and the legacy default
// stream (which NCCL 2.28's CE path rejects) never reaches NCCL. Kept as a measurable
// alternative to the zerocta route: it moves every byte twice more, through local copies.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "comm_state.h"

namespace zc {

struct StagedChunk {
  uint64_t offset;  // in each rank's chunk
  uint64_t bytes;
};

// Pure: the chunks `per_rank` bytes go through when nranks of them must fit in
// `staging_bytes`. Full chunks are 4 KiB multiples; only the last may be odd. Depends only on
// inputs identical on every rank, so every rank runs the same NCCL calls. Empty when no chunk
// fits (or per_rank is 0).
std::vector<StagedChunk> staged_chunks(uint64_t per_rank, int nranks, uint64_t staging_bytes);

// The staging area of the eager ops or of the captured ones (each its own, like the slots).
struct StagingArea {
  uint64_t offset, bytes;  // in the arena
};
StagingArea staging_area(const ArenaLayout& layout, bool capturing);

// Issues the staged all-gather on `stream`. A failure after the first operation was issued
// poisons the communicator (the peers' NCCL calls wait for ours) and returns the error.
ncclResult_t staged_allgather(CommState& st, const void* sendbuff, void* recvbuff,
                              uint64_t bytes_per_rank, CUstream stream, bool capturing);

// One tiny NCCL all-gather inside each new pool, so that NCCL sets up its CE resources (its
// first CE op registers a window, a collective) at communicator set-up, never during a graph
// capture of the application's. Poisons a comm whose warm-up fails.
void staged_warmup(const std::vector<std::shared_ptr<CommState>>& comms);

}  // namespace zc
