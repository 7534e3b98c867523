// Device helpers for the GPU tests: pattern fill and check kernels for the all-gather soak
// (hundreds of MiB per iteration are too slow to generate and compare on the host), and a
// no-op kernel that the policy test uses as a positive control for its kernel counting.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ZG_HOST_DEVICE __host__ __device__
#else
#define ZG_HOST_DEVICE
#endif

namespace zgpu {

// Byte `index` of rank `src`'s input for an operation seeded with `seed`: a hash, so any byte
// of any rank's input can be recomputed independently (on the host for error messages).
ZG_HOST_DEVICE inline uint8_t pattern_byte(uint64_t seed, int src, uint64_t index) {
  uint64_t x = seed ^ (static_cast<uint64_t>(src + 1) * 0xD1B54A32D192ED03ull) ^
               ((index >> 3) * 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x >> ((index & 7) * 8));
}

// What a verification found; offsets are byte offsets into the checked range, ~0 = none.
struct VerifyCounts {
  unsigned long long first_bad_expected;  // output differs from the pattern
  unsigned long long bad_expected;
  unsigned long long first_bad_ref;  // output differs from the reference output
  unsigned long long bad_ref;
  unsigned long long first_bad_ref_expected;  // the reference (real NCCL) differs from the pattern
  unsigned long long bad_ref_expected;
  unsigned long long first_bad_guard;  // a guard byte lost its poison
  unsigned long long bad_guard;
};
void reset_verify_counts(VerifyCounts* device_counts, cudaStream_t stream);

// dst[i] = pattern_byte(seed, src, i) for i < len.
void fill_pattern(void* dst, size_t len, uint64_t seed, int src, cudaStream_t stream);

// Checks an all-gather output of nranks * per_rank bytes: out against the pattern (slice q
// comes from rank q) and against ref, and ref against the pattern. ref may be null.
void verify_allgather(const void* out, const void* ref, size_t per_rank, int nranks, uint64_t seed,
                      VerifyCounts* device_counts, cudaStream_t stream);

// Checks that len bytes at p still hold `value` (guards); offsets reported relative to p
// plus `offset_base`.
void verify_guard(const void* p, size_t len, uint8_t value, unsigned long long offset_base,
                  VerifyCounts* device_counts, cudaStream_t stream);

// Launches an empty kernel (one thread).
void launch_noop_kernel(cudaStream_t stream);

// Delays `stream` by about `microseconds` with a one-thread spinning kernel (race hunting:
// one rank's operations start late, so its peers wait on its flags).
void launch_delay(unsigned microseconds, cudaStream_t stream);

// Fills every SM with spinning blocks for about `ms` milliseconds (synchronises the device
// first). Work that needs an SM cannot start until they end; copy engines can.
void launch_all_sm_spin(double ms, cudaStream_t stream);

}  // namespace zgpu
