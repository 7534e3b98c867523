// The machine's bare copy-engine all-gather: one process, one thread per GPU, peer access
// between all pairs, and every GPU pulling each peer's chunk with cudaMemcpyAsync back to back
// on one stream. No flags, no barriers on the device: the ceiling any protocol can approach.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "channel.h"

namespace zcb {

// Per-GPU buffers, visible to every thread once allocated.
struct PeerBuffers {
  char* recv = nullptr;  // total bytes
  char* send = nullptr;  // one chunk
};

// Makes device g current, checks and enables peer access to every other GPU (fatal if a
// pair cannot), and sends the Hello for "rank" g.
void setup_peer_gpu(int g, int ngpus, Channel* ch);

// Enqueues GPU g's pulls of one all-gather of `chunk` bytes per rank on stream: for each peer
// q (starting at g+1, so GPUs do not all read the same peer first), copies q's source chunk
// (q's send buffer, or in-place its recv + q*chunk) into recv + q*chunk of GPU g.
void enqueue_pulls(int g, const std::vector<PeerBuffers>& bufs, uint64_t chunk, bool in_place,
                   cudaStream_t stream);

}  // namespace zcb
