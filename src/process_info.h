// Facts about processes that the channel records and checks (Linux /proc).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace zc {

// The start time of process `pid` in clock ticks since boot (/proc/PID/stat field 22), 0 when
// it cannot be read. With the pid it names a process for good: pids are reused, this is not.
uint64_t process_start_time(pid_t pid);

}  // namespace zc
