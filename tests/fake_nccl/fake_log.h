// The fakes' call log: one line per call appended to the file named by FAKE_NCCL_LOG.
// The file is opened O_APPEND for every line and each line is one write(2), so lines from
// several threads (NCCL's own threads included) or processes never interleave.
#pragma once

#include <cstddef>
#include <string>

#define FAKE_HIDDEN __attribute__((visibility("hidden")))

namespace fake {

// Appends `line` plus a newline to $FAKE_NCCL_LOG; does nothing when the variable is unset.
FAKE_HIDDEN void log_line(const std::string& line);

// printf-style helpers for building a line.
FAKE_HIDDEN std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
FAKE_HIDDEN std::string hex_ptr(const void* p);
FAKE_HIDDEN std::string hex_bytes(const void* data, size_t n);

}  // namespace fake
