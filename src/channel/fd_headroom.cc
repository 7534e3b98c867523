// Counting this process's descriptors against its limit (fd_headroom.h).
#include "fd_headroom.h"

#include <dirent.h>
#include <sys/resource.h>

#include <atomic>
#include <mutex>

#include "log.h"
#include "monotonic_clock.h"

namespace zc {
namespace {

// A count walks /proc/self/fd (10-20 us for a few hundred descriptors: too much for every op).
// One this recent is good enough while it left more than kCountNearLimit free, adjusted for the
// exports made since (fd_headroom_opened): the application would have to open the difference
// (some 200 descriptors) within the age of a count to eat the reserve. Nearer the limit, every
// question counts afresh.
constexpr int64_t kCountNearLimit = 4 * kFdOpReserve;
constexpr int64_t kCountMaxAgeUs = 100 * 1000;
// Free descriptors that end a shortage (fd_room_for_op).
constexpr int64_t kFdRecovered = 2 * kFdOpReserve;

int64_t soft_limit() {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY ||
      r.rlim_cur > static_cast<rlim_t>(INT64_MAX))
    return INT64_MAX;
  return static_cast<int64_t>(r.rlim_cur);
}

// Descriptors open now, -1 when /proc cannot tell.
int64_t open_descriptors() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int64_t n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;  // less the directory's own descriptor
}

std::mutex g_count_mu;
int64_t g_counted_open = -1;  // guarded by g_count_mu
int64_t g_counted_at_us = 0;

std::atomic<bool> g_short{false};         // a shortage was logged and has not ended
std::atomic<bool> g_export_short{false};  // ... an export refusal

void say_shortage(bool now_short, int64_t headroom) {
  if (now_short == g_short.load(std::memory_order_relaxed) ||
      g_short.exchange(now_short) == now_short)
    return;
  if (now_short)
    ZC_INFO(
        "descriptors: %lld free of RLIMIT_NOFILE %lld, fewer than the %lld an op needs: this "
        "rank posts its all-gathers' buffers as unreachable until more are free (an op it "
        "is the first to arrive at goes to NCCL on every rank)",
        static_cast<long long>(headroom), static_cast<long long>(soft_limit()),
        static_cast<long long>(kFdOpReserve));
  else
    ZC_INFO("descriptors: %lld free again: all-gathers' buffers are posted as reachable",
            static_cast<long long>(headroom));
}

}  // namespace

int64_t fd_headroom() {
  const int64_t limit = soft_limit();
  if (limit == INT64_MAX) return INT64_MAX;
  std::lock_guard<std::mutex> lock(g_count_mu);
  const int64_t now = monotonic_us();
  if (g_counted_open < 0 || now - g_counted_at_us > kCountMaxAgeUs ||
      limit - g_counted_open < kCountNearLimit) {
    g_counted_open = open_descriptors();
    g_counted_at_us = now;
  }
  return g_counted_open < 0 ? INT64_MAX : limit - g_counted_open;
}

void fd_headroom_opened(int64_t n) {
  std::lock_guard<std::mutex> lock(g_count_mu);
  if (g_counted_open >= 0) g_counted_open += n;
}

uint64_t fd_export_cap() {
  const int64_t limit = soft_limit();
  return limit == INT64_MAX ? UINT64_MAX : static_cast<uint64_t>(limit / 2);
}

bool fd_room_for_op() {
  const int64_t headroom = fd_headroom();
  // Once short, twice the reserve ends the shortage: a process hovering at the reserve neither
  // flips its ops between the routes nor logs every flip.
  const bool was_short = g_short.load(std::memory_order_relaxed);
  const bool room = headroom >= (was_short ? kFdRecovered : kFdOpReserve);
  say_shortage(!room, headroom);
  return room;
}

int64_t fd_import_batch() {
  const int64_t headroom = fd_headroom();
  if (headroom >= kFdImportBatch + kFdImportSpare) return kFdImportBatch;
  return headroom > kFdImportSpare ? headroom - kFdImportSpare : 0;
}

void fd_export_refused(uint64_t kept) {
  if (g_export_short.exchange(true)) return;
  ZC_INFO(
      "descriptors: an allocation was not exported (the fd service keeps %llu of at most "
      "%llu, %lld descriptors free): a buffer across it is posted as unreachable",
      static_cast<unsigned long long>(kept), static_cast<unsigned long long>(fd_export_cap()),
      static_cast<long long>(fd_headroom()));
}

void fd_export_made() { g_export_short.store(false, std::memory_order_relaxed); }

}  // namespace zc
