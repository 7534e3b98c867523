// The machine's bare copy-engine all-gather: one process, one thread per GPU, peer access
// between all pairs, and every GPU writing its chunk into every peer's recv buffer with one
// cudaMemcpyBatchAsync ("prefer overlap with compute"), as NCCL's CE all-gather does: the
// driver spreads a batch over the copy engines. Measured on 8 H200s, pulls of the peers'
// chunks reached 154 GB/s busbw on one stream per peer, NCCL's batch 371. No flags; 3+ GPUs
// keep in step through events (push_steps.h): the ceiling any protocol can approach.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "channel.h"

namespace zcb {

// Per-GPU buffers, visible to every thread once allocated.
struct PeerBuffers {
  char* recv = nullptr;  // total bytes (reduce-scatter: the peers' chunks, slot q from GPU q)
  char* send = nullptr;  // one chunk (reduce-scatter: the input, n chunks, chunk q for GPU q)
};

// Makes device g current, checks and enables peer access to every other GPU (fatal if a
// pair cannot), and sends the Hello for "rank" g.
void setup_peer_gpu(int g, int ngpus, Channel* ch);

// Enqueues GPU g's part of one all-gather of `chunk` bytes per rank on `stream`: its chunk
// (its send buffer, or in place its recv + g*chunk) into recv + g*chunk of every peer, one
// batch, peers in rotated order (g+1 first). GPU g's recv is complete once every GPU's
// stream has finished its part.
void enqueue_pushes(int g, const std::vector<PeerBuffers>& bufs, uint64_t chunk, bool in_place,
                    cudaStream_t stream);

// The reduce-scatter's pushes (bare-ce's floor): GPU g's input chunk q (send + q*chunk) into
// recv + g*chunk of every peer q, one batch, peers in rotated order; no reduction. A
// reduce-scatter's in-place and out-of-place variants move the same bytes.
void enqueue_rs_pushes(int g, const std::vector<PeerBuffers>& bufs, uint64_t chunk,
                       cudaStream_t stream);

}  // namespace zcb
