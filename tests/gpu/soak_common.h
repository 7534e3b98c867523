// What the randomized soaks (gpu_ag_soak_test.cc, gpu_rs_soak_test.cc) share: the seeded
// generator whose draws every rank repeats alike, the streams an op may be issued on, op sizes
// drawn log-uniformly, and the two kinds of memory a program hands to NCCL.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "test_data.h"

namespace zgpu {

// splitmix64 over a counter. Seeded alike on every rank, its draws are the choices that must
// agree (an op's count, datatype, the number of ops); seeded with the rank, the choices each
// rank makes on its own (buffers, streams), which the shim's routing must not depend on.
struct SoakRng {
  uint64_t state;
  explicit SoakRng(uint64_t seed) : state(seed) {}
  uint64_t next() { return mix64(state += 0x9E3779B97F4A7C15ull); }
  uint64_t below(uint64_t n) { return next() % n; }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  bool chance(double p) { return uniform() < p; }
};

// Where an op is issued: the legacy default stream (stream 0), the per-thread default stream,
// or a stream of the soak's own, non-blocking or synchronising with the legacy one.
enum class StreamKind { kLegacy, kPerThread, kNonBlocking, kBlocking };
constexpr int kStreamKinds = 4;
const char* stream_name(StreamKind k);

// The soak's own two streams, and CUDA's two default ones by kind.
class SoakStreams {
 public:
  SoakStreams();
  ~SoakStreams();  // leaves the streams while an exception unwinds: the GPU may be hung
  SoakStreams(const SoakStreams&) = delete;
  SoakStreams& operator=(const SoakStreams&) = delete;
  cudaStream_t get(StreamKind k) const;

 private:
  cudaStream_t nonblocking_ = nullptr;
  cudaStream_t blocking_ = nullptr;
};

// An op's element count per rank (the all-gather's send count, the reduce-scatter's receive
// count) whose `nranks` chunks of `elem`-byte elements fit in `cap` bytes, at least 1: the
// total drawn log-uniformly (each octave from 1 B to `cap` as likely as the next), and 15 %
// of the time snapped to a power of two or one element either side of it, where the
// libraries' block, slice and vector sizes change.
size_t draw_soak_count(SoakRng& rng, size_t cap, size_t elem, int nranks);

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// The memory of a soak's user buffers: what PyTorch hands out without expandable segments
// (cudaMalloc: the shim cannot reach it from another process), with them (cuMem exportable as
// file descriptors, in 20 MiB pieces mapped back to back, so that a large op spans several
// allocations), and with them on an IMEX node (cuMem exportable as FABRIC handles only).
enum class SoakMemory { kCudaMalloc, kCumem, kCumemFabric };
const char* memory_name(SoakMemory m);
void* soak_alloc(SoakMemory m, size_t bytes);  // fails the rank on error
void soak_free(SoakMemory m, void* p);         // p may be null

// The shim's name for a route ("passthrough", "ce", ...), or its number without the shim.
std::string shim_route_name(int route);

}  // namespace zgpu
