// Where the log's lines go: stderr, or the file NCCL_DEBUG_FILE names. NCCL writes that file
// too, in the same process, through a stream of its own that neither appends nor keeps what
// the file held before (fopen "w"), so zerocta's lines join NCCL's stream instead of being
// written beside it (log_file.cc says how).
#pragma once

#include <cstddef>
#include <string>

namespace zc {

// NCCL_DEBUG_FILE expanded as NCCL expands it (src/debug.cc there): %h = `host` with '/' and
// '%' made '-', %p = `pid`, %% = %; any other '%' is kept with the character after it, a '%' at
// the end too. At most PATH_MAX characters. Pure.
std::string expand_log_file_name(const char* pattern, const char* host, int pid);

// Writes whole lines (`len` bytes ending in '\n') where the log goes now, in one write(2) when
// nothing was held back: lines of several threads or processes never interleave mid-line.
void log_file_write(const char* lines, size_t len);

}  // namespace zc
