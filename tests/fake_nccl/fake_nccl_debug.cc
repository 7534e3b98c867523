// NCCL's debug file as NCCL 2.28 writes it (src/debug.cc there), which zerocta's log shares:
// opened at NCCL's first log line, and only above NCCL_DEBUG=VERSION, by fopen(name, "w")
// (emptied, written at its own offset, not appended), line-buffered. The name expands %h
// (host up to its first '.'), %p (pid) and %%. NCCL writes to stdout without a file; the fake
// writes nothing then, so that drivers' stdout stays theirs.
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "fake_nccl_internal.h"

namespace fake {
namespace {

std::mutex g_debug_mu;
bool g_debug_init = false;
FILE* g_debug_file = nullptr;  // nullptr: no line is written

std::string short_host() {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  if (char* dot = strchr(host, '.')) *dot = '\0';
  return host;
}

FILE* open_debug_file() {
  const char* level = getenv("NCCL_DEBUG");
  const char* pattern = getenv("NCCL_DEBUG_FILE");
  if (level == nullptr || pattern == nullptr) return nullptr;
  bool above_version = false;
  for (const char* word : {"WARN", "INFO", "ABORT", "TRACE"})
    above_version = above_version || strcasecmp(level, word) == 0;
  if (!above_version) return nullptr;
  std::string name;
  for (const char* p = pattern; *p != '\0'; ++p) {
    if (*p == '%' && p[1] == 'h') {
      name += short_host();
      ++p;
    } else if (*p == '%' && p[1] == 'p') {
      name += std::to_string(getpid());
      ++p;
    } else if (*p == '%' && p[1] == '%') {
      name += '%';
      ++p;
    } else {
      name += *p;
    }
  }
  FILE* f = fopen(name.c_str(), "w");
  if (f != nullptr) setlinebuf(f);
  return f;
}

}  // namespace

void nccl_debug_line(const std::string& text) {
  std::lock_guard<std::mutex> lock(g_debug_mu);
  if (!g_debug_init) {
    g_debug_file = open_debug_file();
    g_debug_init = true;
  }
  if (g_debug_file == nullptr) return;
  // "[0]": NCCL asks the CUDA runtime; the fake asks nothing, so as to add no call to its log.
  fprintf(g_debug_file, "%s:%d:%ld [0] NCCL INFO %s\n", short_host().c_str(),
          static_cast<int>(getpid()), static_cast<long>(syscall(SYS_gettid)), text.c_str());
}

}  // namespace fake
