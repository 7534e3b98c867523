#include "process_info.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace zc {

uint64_t process_start_time(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line)) return 0;
  // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  const char* p = line.c_str() + close + 1;
  for (int field = 3; field < 22 && *p; ++field) {
    while (*p == ' ') ++p;
    while (*p && *p != ' ') ++p;
  }
  return strtoull(p, nullptr, 10);
}

// A zombie counts as alive: its state says so only of the main thread, which may have ended
// while the others run; the launcher that reaps a killed rank ends the doubt.
bool process_gone(pid_t pid, uint64_t start_time) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  const uint64_t now = process_start_time(pid);
  return now != 0 && start_time != 0 && now != start_time;
}

uint64_t pid_namespace_id() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace zc
