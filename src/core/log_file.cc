// The log's destination. Until log_set_file names a file, and whenever a file cannot be used,
// lines go to stderr. With a file, the first line settles where they go:
//   - this process already writes that file (NCCL opened it): through NCCL's open file itself,
//     a duplicate of its descriptor. NCCL's stream writes at the file offset it shares with us,
//     so each line, NCCL's or ours, lands after the last one. A file of our own would append
//     while NCCL's stream kept writing at its own offset, over our lines.
//   - NCCL will open it but has not yet (zerocta's first lines come at the first NCCL call,
//     before NCCL logs anything): the lines are held, since NCCL's fopen(..., "w") would
//     empty the file; the first line after NCCL opened it, or the process's exit, writes them.
//   - NCCL does not write it (its NCCL_DEBUG is at VERSION or lower): opened here, appending.
// NCCL reopening its file (ncclResetDebugInit) is not followed: our lines keep to the first.
#include "log_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "log.h"

namespace zc {
namespace {

// Lines held at most while NCCL has not opened the file; past this, NCCL could not open it
// either (it then writes to stdout), and the lines go to stderr.
constexpr size_t kMaxHeldBytes = 64 << 10;

enum class Target { kFd, kPending };

// Once the destination is settled (kFd), a line is one write(2) to g_fd without a lock; only
// the lines before that take the lock of Pending.
std::atomic<Target> g_target{Target::kFd};
std::atomic<int> g_fd{STDERR_FILENO};

struct Pending {
  std::mutex mu;
  std::string path;  // expanded
  bool nccl_writes_it = false;
  std::string held;  // lines written before NCCL opened the file
  pid_t holder = 0;  // the process those lines are from: a forked child does not write them
};

// Never destroyed: lines are written until the process ends, exit handlers included.
Pending& pending() {
  static Pending* p = new Pending;
  return *p;
}

void write_all(int fd, const char* data, size_t len) {
  ssize_t w = write(fd, data, len);
  (void)w;
}

void settle(int fd) {
  g_fd.store(fd, std::memory_order_relaxed);
  g_target.store(Target::kFd, std::memory_order_release);
}

// A new descriptor (close-on-exec) on the open file through which this process already writes
// `path`, found among /proc/self/fd by device and inode; -1 when there is none.
int adopt_open_file(const std::string& path) {
  struct stat want;
  if (stat(path.c_str(), &want) != 0 || !S_ISREG(want.st_mode)) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || st.st_dev != want.st_dev ||
        st.st_ino != want.st_ino)
      continue;
    const int flags = fcntl(static_cast<int>(fd), F_GETFL);
    if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY) continue;
    found = fcntl(static_cast<int>(fd), F_DUPFD_CLOEXEC, 0);
    break;
  }
  closedir(dir);
  return found;
}

// The file, opened here: appending, created as fopen creates it (0666 less the umask).
int open_own(const std::string& path) {
  return open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
}

void give_up(Pending& p, const char* why) {
  log_print_to(STDERR_FILENO, LogLevel::kWarn, "NCCL_DEBUG_FILE %s %s: zerocta logs to stderr",
               p.path.c_str(), why);
  settle(STDERR_FILENO);
}

// The held lines go where `fd` points, if they are this process's.
void write_held(Pending& p, int fd) {
  if (!p.held.empty() && p.holder == getpid()) write_all(fd, p.held.data(), p.held.size());
  p.held.clear();
}

// At exit, lines still held: NCCL never wrote a line after them, or never opened the file.
void write_held_at_exit() {
  Pending& p = pending();
  std::lock_guard<std::mutex> lock(p.mu);
  if (g_target.load(std::memory_order_acquire) != Target::kPending) return;
  int fd = adopt_open_file(p.path);
  // NCCL has not opened it and no longer will: there is no stream of NCCL's to overwrite ours.
  if (fd < 0) fd = open_own(p.path);
  if (fd < 0) {
    const std::string why = std::string("cannot be opened (") + std::strerror(errno) + ")";
    give_up(p, why.c_str());
    write_held(p, STDERR_FILENO);
    return;
  }
  write_held(p, fd);
  settle(fd);
}

// Under p.mu, while pending: settles where lines go, or holds `lines` until NCCL opens the file.
void write_pending(Pending& p, const char* lines, size_t len) {
  int fd = adopt_open_file(p.path);
  if (fd < 0 && !p.nccl_writes_it) {
    fd = open_own(p.path);
    if (fd < 0) {
      const std::string why = std::string("cannot be opened (") + std::strerror(errno) + ")";
      give_up(p, why.c_str());
      write_all(STDERR_FILENO, lines, len);
      return;
    }
  }
  if (fd >= 0) {
    write_held(p, fd);
    write_all(fd, lines, len);
    settle(fd);
    return;
  }
  if (p.held.size() + len <= kMaxHeldBytes) {
    if (p.held.empty()) p.holder = getpid();
    p.held.append(lines, len);
    return;
  }
  give_up(p, "is still not open in NCCL");
  write_held(p, STDERR_FILENO);
  write_all(STDERR_FILENO, lines, len);
}

}  // namespace

std::string expand_log_file_name(const char* pattern, const char* host, int pid) {
  std::string name;
  std::string safe_host = host;
  for (char& ch : safe_host)
    if (ch == '/' || ch == '%') ch = '-';
  for (const char* p = pattern; *p != '\0'; ++p) {
    if (*p != '%') {
      name += *p;
    } else if (p[1] == 'h') {
      name += safe_host;
      ++p;
    } else if (p[1] == 'p') {
      name += std::to_string(pid);
      ++p;
    } else if (p[1] == '%') {
      name += '%';
      ++p;
    } else {
      name += '%';  // the character after it, if any, is copied next
    }
  }
  if (name.size() > PATH_MAX) name.resize(PATH_MAX);
  return name;
}

void log_set_file(const char* pattern, bool nccl_writes_it) {
  if (pattern == nullptr || pattern[0] == '\0') return;
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  if (char* dot = std::strchr(host, '.')) *dot = '\0';
  const std::string path = expand_log_file_name(pattern, host, static_cast<int>(getpid()));
  if (path.empty()) return;
  Pending& p = pending();
  std::lock_guard<std::mutex> lock(p.mu);
  p.path = path;
  p.nccl_writes_it = nccl_writes_it;
  g_target.store(Target::kPending, std::memory_order_release);
  if (nccl_writes_it) {
    static const bool registered = std::atexit(&write_held_at_exit) == 0;
    (void)registered;
  }
}

void log_file_write(const char* lines, size_t len) {
  if (g_target.load(std::memory_order_acquire) == Target::kFd) {
    write_all(g_fd.load(std::memory_order_relaxed), lines, len);
    return;
  }
  Pending& p = pending();
  std::unique_lock<std::mutex> lock(p.mu);
  if (g_target.load(std::memory_order_acquire) == Target::kPending) {
    write_pending(p, lines, len);
    return;
  }
  lock.unlock();  // settled by another thread meanwhile
  write_all(g_fd.load(std::memory_order_relaxed), lines, len);
}

}  // namespace zc
