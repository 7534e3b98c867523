// The diagnostic build's flag watcher (flag_watch.h).
#include "flag_watch.h"

#ifdef ZC_FLAG_WATCH
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "diagnostic_quantiles.h"
#include "monotonic_clock.h"
#include "op_exchange.h"

namespace zc {
namespace {

struct Seen {
  uint32_t seq;
  uint64_t ns;
};

struct Watch {
  OpExchange* ops = nullptr;
  uint32_t n = 0;
  std::atomic<bool> stop{false};
  std::thread thread;
  std::vector<std::vector<Seen>> ready;  // [r]
  std::vector<std::vector<Seen>> done;   // [r * n + p]: p done with r's buffers
};

Watch* g_watch = nullptr;

void spin(Watch* w) {
  const uint32_t n = w->n;
  std::vector<uint32_t> last_ready(n * kOpRing, 0), last_done(n * n * kOpRing, 0);
  while (!w->stop.load(std::memory_order_relaxed)) {
    const uint64_t t = monotonic_ns();
    for (uint32_t r = 0; r < n; ++r)
      for (uint32_t s = 0; s < kOpRing; ++s) {
        const uint32_t v = __atomic_load_n(w->ops->ready_flag(r, s), __ATOMIC_RELAXED);
        if (v != last_ready[r * kOpRing + s]) {
          last_ready[r * kOpRing + s] = v;
          w->ready[r].push_back({v, t});
        }
        for (uint32_t p = 0; p < n; ++p) {
          if (p == r) continue;
          const uint32_t d = __atomic_load_n(w->ops->done_flag(r, p, s), __ATOMIC_RELAXED);
          uint32_t& l = last_done[(r * n + p) * kOpRing + s];
          if (d != l) {
            l = d;
            w->done[r * n + p].push_back({d, t});
          }
        }
      }
  }
}

void report(Watch* w) {
  const uint32_t n = w->n;
  // seq -> time, per flag
  std::vector<std::map<uint32_t, uint64_t>> ready(n), done_into(n);
  std::vector<std::map<uint32_t, uint64_t>> done_first(n);
  for (uint32_t r = 0; r < n; ++r)
    for (const Seen& s : w->ready[r]) ready[r][s.seq] = s.ns;
  // done_into[r][seq]: the last peer's done for r's buffers; done_first: the first.
  for (uint32_t r = 0; r < n; ++r)
    for (uint32_t p = 0; p < n; ++p)
      for (const Seen& s : w->done[r * n + p]) {
        uint64_t& l = done_into[r][s.seq];
        l = std::max(l, s.ns);
        auto it = done_first[r].find(s.seq);
        if (it == done_first[r].end() || s.ns < it->second) done_first[r][s.seq] = s.ns;
      }
  std::vector<double> spread, copies, next_ready, done_spread;
  for (const auto& [seq, t0] : ready[0]) {
    uint64_t lo = t0, hi = t0;
    bool all = true;
    for (uint32_t r = 1; r < n; ++r) {
      auto it = ready[r].find(seq);
      if (it == ready[r].end()) {
        all = false;
        break;
      }
      lo = std::min(lo, it->second);
      hi = std::max(hi, it->second);
    }
    if (!all) continue;
    spread.push_back((hi - lo) / 1e3);
    for (uint32_t r = 0; r < n; ++r) {
      auto d = done_into[r].find(seq);
      if (d == done_into[r].end() || d->second < hi) continue;
      copies.push_back((d->second - hi) / 1e3);
      done_spread.push_back((d->second - done_first[r][seq]) / 1e3);
      auto nr = ready[r].find(seq + 1);
      if (nr != ready[r].end() && nr->second > d->second)
        next_ready.push_back((nr->second - d->second) / 1e3);
    }
  }
  print_quantiles("flag-watch", "ready: last rank's write minus first rank's", spread);
  print_quantiles("flag-watch", "last ready to the last done into a rank", copies);
  print_quantiles("flag-watch", "first to last done into a rank", done_spread);
  print_quantiles("flag-watch", "last done into a rank to its next op's ready", next_ready);
}

}  // namespace

void watch_flags(OpExchange* ops, int rank) {
  if (rank != 0 || g_watch) return;
  g_watch = new Watch;
  g_watch->ops = ops;
  g_watch->n = ops->nranks();
  g_watch->ready.resize(g_watch->n);
  g_watch->done.resize(g_watch->n * g_watch->n);
  g_watch->thread = std::thread(spin, g_watch);
}

void unwatch_flags(OpExchange* ops) {
  if (!g_watch || g_watch->ops != ops) return;
  g_watch->stop.store(true);
  g_watch->thread.join();
  report(g_watch);
  delete g_watch;
  g_watch = nullptr;
}

}  // namespace zc
#endif
