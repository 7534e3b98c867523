// The one clock the library measures waits, deadlines and host times with: CLOCK_MONOTONIC
// (never steps with the wall clock; a vDSO read, no system call).
#pragma once

#include <time.h>

#include <cstdint>

namespace zc {

inline uint64_t monotonic_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

inline int64_t monotonic_us() { return static_cast<int64_t>(monotonic_ns() / 1000); }

inline int64_t monotonic_ms() { return static_cast<int64_t>(monotonic_ns() / 1000000); }

}  // namespace zc
