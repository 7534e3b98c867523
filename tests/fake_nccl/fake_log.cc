#include "fake_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace fake {

void log_line(const std::string& line) {
  const char* path = getenv("FAKE_NCCL_LOG");
  if (path == nullptr || path[0] == '\0') return;
  std::string out = line + "\n";
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, out.data(), out.size());
  (void)w;
  close(fd);
}

std::string strf(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::vector<char> buf(n > 0 ? n + 1 : 1);
  vsnprintf(buf.data(), buf.size(), fmt, ap2);
  va_end(ap2);
  return std::string(buf.data());
}

std::string hex_ptr(const void* p) {
  return strf("0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
}

std::string hex_bytes(const void* data, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  const auto* b = static_cast<const unsigned char*>(data);
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s += kDigits[b[i] >> 4];
    s += kDigits[b[i] & 15];
  }
  return s;
}

}  // namespace fake
