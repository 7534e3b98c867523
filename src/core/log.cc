// NCCL-format log lines. Kept dependency-free (no config.h) so that configuration parsing
// itself can log; the level and the file are pushed in by whoever reads the configuration.
#include "log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "log_file.h"

namespace zc {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kDebug:
      return "DEBUG";
    default:
      return "";
  }
}

// The CUDA device in the "[dev]" field. Reading it would need a CUDA call (and could create a
// context), which the good-guest rules forbid in a logging path; callers that know the device
// set it per thread.
thread_local int t_device = -1;

}  // namespace

void log_set_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed) &&
         level != LogLevel::kNone;
}

void log_set_device(int device) { t_device = device; }
int log_device() { return t_device; }

namespace {

constexpr size_t kMaxLine = 2048;

// Formats one line, newline included, into line[kMaxLine]; returns its length (0: none).
size_t format_line(char* line, LogLevel level, const char* fmt, va_list ap) {
  char host[64] = "?";
  gethostname(host, sizeof(host) - 1);
  if (char* dot = strchr(host, '.')) *dot = '\0';
  int n = snprintf(line, kMaxLine, "%s:%d:%ld [%d] zerocta %s ", host, static_cast<int>(getpid()),
                   static_cast<long>(syscall(SYS_gettid)), t_device, level_name(level));
  if (n < 0) return 0;
  int m = vsnprintf(line + n, kMaxLine - n - 1, fmt, ap);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > kMaxLine - 2) len = kMaxLine - 2;
  line[len++] = '\n';
  return len;
}

// One write(2) per line so lines from several threads or ranks never interleave.
void write_line(int fd, const char* line, size_t len) {
  ssize_t w = write(fd, line, len);
  (void)w;
}

}  // namespace

void log_print(LogLevel level, const char* fmt, ...) {
  if (!log_enabled(level)) return;
  char line[kMaxLine];
  va_list ap;
  va_start(ap, fmt);
  const size_t len = format_line(line, level, fmt, ap);
  va_end(ap);
  if (len > 0) log_file_write(line, len);
}

void log_report(const char* fmt, ...) {
  char line[kMaxLine];
  va_list ap;
  va_start(ap, fmt);
  const size_t len = format_line(line, LogLevel::kInfo, fmt, ap);
  va_end(ap);
  write_line(STDERR_FILENO, line, len);
}

void log_print_to(int fd, LogLevel level, const char* fmt, ...) {
  char line[kMaxLine];
  va_list ap;
  va_start(ap, fmt);
  const size_t len = format_line(line, level, fmt, ap);
  va_end(ap);
  write_line(fd, line, len);
}

}  // namespace zc
