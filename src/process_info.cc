#include "process_info.h"

#include <unistd.h>

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

}  // namespace zc
