// How the library's host-side waits poll memory another thread or process writes (the op
// exchange's words, a peer's stage): spin first, since the answer usually comes within
// microseconds, then yield the core, then sleep, longer once the wait has gone on for long.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <cstdint>

namespace zc {

constexpr uint32_t kSpinsBeforeYield = 64;
constexpr uint32_t kSpinsBeforeSleep = 1000;
constexpr uint32_t kSpinsBeforeLongSleep = 100000;
constexpr useconds_t kShortSleepUs = 20;
constexpr useconds_t kLongSleepUs = 1000;

// The pause after `spins` polls that found nothing.
inline void backoff_pause(uint32_t spins) {
  if (spins > kSpinsBeforeLongSleep)
    usleep(kLongSleepUs);
  else if (spins > kSpinsBeforeSleep)
    usleep(kShortSleepUs);
  else if (spins > kSpinsBeforeYield)
    sched_yield();
}

}  // namespace zc
