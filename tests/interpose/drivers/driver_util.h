// Helpers shared by the interposition driver programs. Drivers report on stdout as
// "key=value" lines, which the test binary parses.
//
// Anything whose address ends up in the fake NCCL's log (configs, ids, scalars) lives in an
// arena mapped at a fixed address, so the log of a run with the shim can be compared byte
// for byte with the log of a run without it despite ASLR.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zerocta.h"

namespace drv {

constexpr uintptr_t kArenaAddress = 0x3a0000000;
constexpr size_t kPage = 4096;
// Page 0: strings and ids. Page 1: a config ending exactly at the page end. Page 2: no access,
// so reading past a config's `size` faults.
constexpr size_t kArenaPages = 3;

inline unsigned char* arena() {
  static unsigned char* base = [] {
    void* p =
        mmap(reinterpret_cast<void*>(kArenaAddress), kArenaPages * kPage, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != reinterpret_cast<void*>(kArenaAddress)) {
      fprintf(stderr, "driver: cannot map the arena at %#lx\n", (unsigned long)kArenaAddress);
      exit(90);
    }
    mprotect(static_cast<unsigned char*>(p) + 2 * kPage, kPage, PROT_NONE);
    return static_cast<unsigned char*>(p);
  }();
  return base;
}

// A block of `size` bytes that ends at the guard page.
inline unsigned char* guarded_block(size_t size) { return arena() + 2 * kPage - size; }
// Makes the page of guarded blocks read-only (1) or writable again (0): a callee that writes
// into the caller's struct faults.
inline void protect_guarded_page(bool read_only) {
  mprotect(arena() + kPage, kPage, read_only ? PROT_READ : PROT_READ | PROT_WRITE);
}

inline void out(const std::string& key, const std::string& value) {
  std::string line = key + "=" + value + "\n";
  // One write per line: children of fork share stdout.
  ssize_t w = write(STDOUT_FILENO, line.data(), line.size());
  (void)w;
}
inline void out(const std::string& key, long long value) { out(key, std::to_string(value)); }

inline std::string hex(const void* data, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    unsigned char b = static_cast<const unsigned char*>(data)[i];
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

inline std::string ptr_hex(const void* p) {
  char buf[32];
  snprintf(buf, sizeof buf, "0x%llx", (unsigned long long)(uintptr_t)p);
  return buf;
}

// Appends "marker <text>" to the fake's log so tests can split it into phases.
inline void log_marker(const char* text) {
  const char* path = getenv("FAKE_NCCL_LOG");
  if (path == nullptr) return;
  std::string line = std::string("marker ") + text + "\n";
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, line.data(), line.size());
  (void)w;
  close(fd);
}

// Prints the shim's counters as "stats.<tag>.<op>.<route>.calls=N" etc., found the way an
// application would find them (the shim is never linked). "stats.<tag>=absent" without it.
inline void print_stats(const char* tag) {
  using GetStats = int (*)(zerocta_stats_t*);
  using OpName = const char* (*)(zerocta_op_t);
  using RouteName = const char* (*)(zerocta_route_t);
  auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "zerocta_get_stats"));
  auto op_name = reinterpret_cast<OpName>(dlsym(RTLD_DEFAULT, "zerocta_op_name"));
  auto route_name = reinterpret_cast<RouteName>(dlsym(RTLD_DEFAULT, "zerocta_route_name"));
  std::string prefix = std::string("stats.") + tag;
  zerocta_stats_t s;
  if (get == nullptr || op_name == nullptr || route_name == nullptr || get(&s) != 0) {
    out(prefix, "absent");
    return;
  }
  for (int o = 0; o < zerocta_op_count; ++o) {
    for (int r = 0; r < zerocta_route_count; ++r) {
      std::string key = prefix + "." + op_name(static_cast<zerocta_op_t>(o)) + "." +
                        route_name(static_cast<zerocta_route_t>(r));
      out(key + ".calls", static_cast<long long>(s.counters[o][r].calls));
      out(key + ".bytes", static_cast<long long>(s.counters[o][r].bytes));
    }
  }
  out(prefix + ".comms_created", static_cast<long long>(s.comms_created));
  out(prefix + ".comms_zero_policy", static_cast<long long>(s.comms_zero_policy));
  out(prefix + ".comms_ce_ready", static_cast<long long>(s.comms_ce_ready));
  out(prefix + ".pool_bytes", static_cast<long long>(s.pool_bytes));
  out(prefix + ".inner_calls", static_cast<long long>(s.inner_calls));
}

// Made-up device addresses and streams: the fake never dereferences them.
inline void* fake_buffer(uintptr_t n) { return reinterpret_cast<void*>(0xd0000000 + n * 0x100000); }
inline void* fake_stream(uintptr_t n) { return reinterpret_cast<void*>(0x5700 + n); }

}  // namespace drv
