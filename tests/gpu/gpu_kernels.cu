#include <climits>

#include "gpu_kernels.h"

namespace zgpu {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(size_t len) {
  const size_t blocks = (len + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 8192 ? (blocks ? blocks : 1) : 8192);
}

__device__ void note_bad(unsigned long long* first, unsigned long long* count,
                         unsigned long long offset) {
  atomicMin(first, offset);
  atomicAdd(count, 1ull);
}

__global__ void fill_kernel(uint8_t* dst, size_t len, uint64_t seed, int src) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < len;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = pattern_byte(seed, src, i);
  }
}

__global__ void verify_kernel(const uint8_t* out, const uint8_t* ref, size_t per_rank, int nranks,
                              uint64_t seed, VerifyCounts* counts) {
  const size_t total = per_rank * static_cast<size_t>(nranks);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int src = static_cast<int>(i / per_rank);
    const uint8_t want = pattern_byte(seed, src, i - static_cast<size_t>(src) * per_rank);
    const uint8_t got = out[i];
    if (got != want) note_bad(&counts->first_bad_expected, &counts->bad_expected, i);
    if (ref != nullptr) {
      const uint8_t r = ref[i];
      if (got != r) note_bad(&counts->first_bad_ref, &counts->bad_ref, i);
      if (r != want) note_bad(&counts->first_bad_ref_expected, &counts->bad_ref_expected, i);
    }
  }
}

__global__ void guard_kernel(const uint8_t* p, size_t len, uint8_t value, unsigned long long base,
                             VerifyCounts* counts) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < len;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (p[i] != value) note_bad(&counts->first_bad_guard, &counts->bad_guard, base + i);
  }
}

__global__ void noop_kernel() {}

__global__ void read_globaltimer(unsigned long long* out) {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  *out = now;
}

// Every thread spins until the global timer passes `until_ns`.
__global__ void spin_kernel(unsigned long long until_ns) {
  unsigned long long now;
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now < until_ns);
}

// One thread spins for `ns` nanoseconds from when it starts (a delay in stream order).
__global__ void delay_kernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

void launch_delay(unsigned microseconds, cudaStream_t stream) {
  delay_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(microseconds) * 1000ull);
}

void reset_verify_counts(VerifyCounts* device_counts, cudaStream_t stream) {
  // first_* = ~0 (no bad byte yet), counts = 0: 0xff in first_*, 0 in the others.
  static const VerifyCounts initial = {ULLONG_MAX, 0, ULLONG_MAX, 0, ULLONG_MAX, 0, ULLONG_MAX, 0};
  cudaMemcpyAsync(device_counts, &initial, sizeof(initial), cudaMemcpyHostToDevice, stream);
}

void fill_pattern(void* dst, size_t len, uint64_t seed, int src, cudaStream_t stream) {
  if (len == 0) return;
  fill_kernel<<<grid_for(len), kThreads, 0, stream>>>(static_cast<uint8_t*>(dst), len, seed, src);
}

void verify_allgather(const void* out, const void* ref, size_t per_rank, int nranks, uint64_t seed,
                      VerifyCounts* device_counts, cudaStream_t stream) {
  const size_t total = per_rank * static_cast<size_t>(nranks);
  if (total == 0) return;
  verify_kernel<<<grid_for(total), kThreads, 0, stream>>>(static_cast<const uint8_t*>(out),
                                                          static_cast<const uint8_t*>(ref),
                                                          per_rank, nranks, seed, device_counts);
}

void verify_guard(const void* p, size_t len, uint8_t value, unsigned long long offset_base,
                  VerifyCounts* device_counts, cudaStream_t stream) {
  if (len == 0) return;
  guard_kernel<<<grid_for(len), kThreads, 0, stream>>>(static_cast<const uint8_t*>(p), len, value,
                                                       offset_base, device_counts);
}

void launch_noop_kernel(cudaStream_t stream) { noop_kernel<<<1, 1, 0, stream>>>(); }

void launch_all_sm_spin(double ms, cudaStream_t stream) {
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, spin_kernel, 1024, 0);
  // The deadline is read on the device when the first block starts: the host clock and the
  // global timer are not the same clock, so pass a duration through a first tiny launch.
  unsigned long long start = 0;
  cudaDeviceSynchronize();
  unsigned long long* d = nullptr;
  cudaMalloc(&d, sizeof(*d));
  read_globaltimer<<<1, 1, 0, stream>>>(d);
  cudaMemcpyAsync(&start, d, sizeof(start), cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  cudaFree(d);
  const unsigned long long until = start + static_cast<unsigned long long>(ms * 1e6);
  spin_kernel<<<sms*(per_sm > 0 ? per_sm : 1), 1024, 0, stream>>>(until);
}

}  // namespace zgpu
