// Facts about processes that the channel records and checks (Linux /proc).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace zc {

// The start time of process `pid` in clock ticks since boot (/proc/PID/stat field 22), 0 when
// it cannot be read. With the pid it names a process for good: pids are reused, this is not.
uint64_t process_start_time(pid_t pid);

// Whether the process that was `pid` started at `start_time` is certainly gone: no process has
// that pid, or the one that has it started at another time (the pid was reused). A start time
// that cannot be read (0 on either side: hidepid, no /proc) counts as the same process, and so
// does a zombie not reaped yet.
bool process_gone(pid_t pid, uint64_t start_time);

// This process's pid namespace (the inode of /proc/self/ns/pid), 0 when it cannot be read. A
// pid recorded in another namespace says nothing about the processes this one sees.
uint64_t pid_namespace_id();

}  // namespace zc
