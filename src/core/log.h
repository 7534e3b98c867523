// Logging in NCCL's line format: "host:pid:tid [dev] zerocta LEVEL message", to stderr or to
// the file NCCL_DEBUG_FILE names. WARN is shown unless the level is none; INFO/DEBUG are
// filtered by the level (ZEROCTA_LOG, else NCCL_DEBUG).
#pragma once

#include <cstdarg>

namespace zc {

enum class LogLevel { kNone = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// Sets the active level (done once config is read; before that, WARN).
void log_set_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);

// Sends the lines from now on to the file NCCL_DEBUG_FILE names: `pattern`, expanded as NCCL
// expands it (%h host, %p pid; log_file.h); nullptr or "" = stderr, as before this call. The
// file is opened for appending at the first line. `nccl_writes_it`: NCCL opens the same file
// (its NCCL_DEBUG is above VERSION); zerocta's lines then go through NCCL's own open file, so
// that neither overwrites the other, and wait for NCCL to open it. A file that cannot be used
// means stderr, with one WARN there.
void log_set_file(const char* pattern, bool nccl_writes_it);

// The "[dev]" field of this thread's lines: the CUDA device the thread works on, as far as
// the caller knows it (the log itself makes no CUDA call). -1 (the default) = not known.
// Code that makes a device current for its work sets it, and puts back what it found.
void log_set_device(int device);
int log_device();

// Tags this thread's log lines with `device` while it lives (no CUDA call: safe in any thread).
class LogDeviceScope {
 public:
  explicit LogDeviceScope(int device) : saved_(log_device()) {
    if (device >= 0) log_set_device(device);
  }
  ~LogDeviceScope() { log_set_device(saved_); }
  LogDeviceScope(const LogDeviceScope&) = delete;
  LogDeviceScope& operator=(const LogDeviceScope&) = delete;

 private:
  int saved_;
};

// printf-style; appends a newline. Thread-safe: one write(2) per line.
void log_print(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// An INFO line printed to stderr whatever ZEROCTA_LOG and NCCL_DEBUG_FILE say: output the user
// asked for by name (ZEROCTA_STATS=1), which ZEROCTA_LOG=none must not swallow.
void log_report(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// One line of `level` to the file descriptor `fd`, whatever the level and the log's file say:
// a WARN about that file itself, on stderr; a report where its caller asks (zerocta_check_config).
void log_print_to(int fd, LogLevel level, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace zc

#define ZC_WARN(...) ::zc::log_print(::zc::LogLevel::kWarn, __VA_ARGS__)
#define ZC_INFO(...)                                       \
  do {                                                     \
    if (::zc::log_enabled(::zc::LogLevel::kInfo))          \
      ::zc::log_print(::zc::LogLevel::kInfo, __VA_ARGS__); \
  } while (0)
#define ZC_DEBUG(...)                                       \
  do {                                                      \
    if (::zc::log_enabled(::zc::LogLevel::kDebug))          \
      ::zc::log_print(::zc::LogLevel::kDebug, __VA_ARGS__); \
  } while (0)
