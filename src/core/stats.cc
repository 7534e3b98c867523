// Counters behind zerocta_get_stats and ZEROCTA_STATS.
//
// Hot path: one relaxed fetch_add per field, no lock, no allocation. The counters are plain
// zero-initialised globals (constant initialisation), so counting works before any constructor
// has run and costs no static-init guard.
//
// Reporting happens at exit and must not touch CUDA or NCCL: by then the application may have
// torn its contexts down, and NCCL's own exit handlers may already have run.
#include "stats.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "config.h"
#include "host_time_histogram.h"
#include "log.h"
#include "stats_snapshot.h"

namespace zc {
namespace {

struct AtomicCounter {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes{0};
};

AtomicCounter g_counters[zerocta_op_count][zerocta_route_count];
std::atomic<uint64_t> g_comms_created{0};
std::atomic<uint64_t> g_comms_zero_policy{0};
std::atomic<uint64_t> g_comms_ce_ready{0};
std::atomic<int64_t> g_pool_bytes{0};  // signed: a free may be counted before its alloc is seen
std::atomic<int64_t> g_peer_held_bytes{0};    // ... and of it, the peers' memory mapped here
std::atomic<uint64_t> g_peer_held_budget{0};  // its bound per communicator, once one prepared
std::atomic<uint64_t> g_inner_calls{0};
std::atomic<uint64_t> g_pairs_each{0}, g_pairs_later_both{0};
std::atomic<uint64_t> g_peer_mappings{0}, g_peer_mapped_bytes{0}, g_peer_map_micros{0};
std::atomic<uint64_t> g_peer_unmapped_bytes{0};
std::atomic<uint64_t> g_staged_ops{0};
std::atomic<uint64_t> g_pushes_deferred{0}, g_deferred_claim_micros{0};
std::atomic<uint64_t> g_captured_ops{0};
std::atomic<uint64_t> g_local_group_ops{0};
std::atomic<uint64_t> g_host_ops{0}, g_host_post{0}, g_host_arrive{0}, g_host_pair_wait{0},
    g_host_reach{0}, g_host_issue{0};
// The same host times per op as distributions (medians and tails for the report), in the
// order of RouteStats::host_quantiles: each phase, then the whole call.
HostTimeHistogram g_host_times[kHostPhases];
HostTimeHistogram g_nccl_call_times;
// The route's counters, each with its RouteStats field and JSON name, in the JSON's order: the
// snapshot, the reset and the file all walk this one table.
struct RouteCounter {
  const char* name;
  std::atomic<uint64_t>* counter;
  uint64_t RouteStats::*field;
};
const RouteCounter kRouteCounters[] = {
    {"pairs_each_pushes", &g_pairs_each, &RouteStats::pairs_each_pushes},
    {"pairs_later_does_both", &g_pairs_later_both, &RouteStats::pairs_later_does_both},
    {"peer_mappings", &g_peer_mappings, &RouteStats::peer_mappings},
    {"peer_mapped_bytes", &g_peer_mapped_bytes, &RouteStats::peer_mapped_bytes},
    {"peer_map_micros", &g_peer_map_micros, &RouteStats::peer_map_micros},
    {"peer_unmapped_bytes", &g_peer_unmapped_bytes, &RouteStats::peer_unmapped_bytes},
    {"staged_ops", &g_staged_ops, &RouteStats::staged_ops},
    {"pushes_deferred", &g_pushes_deferred, &RouteStats::pushes_deferred},
    {"deferred_claim_micros", &g_deferred_claim_micros, &RouteStats::deferred_claim_micros},
    {"captured_ops", &g_captured_ops, &RouteStats::captured_ops},
    {"local_group_ops", &g_local_group_ops, &RouteStats::local_group_ops},
    {"host_ops", &g_host_ops, &RouteStats::host_ops},
    {"host_post_micros", &g_host_post, &RouteStats::host_post_micros},
    {"host_arrive_micros", &g_host_arrive, &RouteStats::host_arrive_micros},
    {"host_pair_wait_micros", &g_host_pair_wait, &RouteStats::host_pair_wait_micros},
    {"host_reach_micros", &g_host_reach, &RouteStats::host_reach_micros},
    {"host_issue_micros", &g_host_issue, &RouteStats::host_issue_micros},
};
// The process whose counters these are; the exit report runs only there.
std::atomic<pid_t> g_owner_pid{0};

// The last JSON file written (stats_write_now) and what it holds, so that an unchanged
// snapshot is not written again; guarded by g_write_lock, re-initialised in a forked child.
pthread_mutex_t g_write_lock = PTHREAD_MUTEX_INITIALIZER;
std::string* g_last_path = nullptr;  // leaked on purpose: used by the exit handler
zerocta_stats_t g_last_written;
bool g_write_warned = false;

constexpr auto kRelaxed = std::memory_order_relaxed;

void reset_counters() {
  for (auto& per_op : g_counters) {
    for (AtomicCounter& c : per_op) {
      c.calls.store(0, kRelaxed);
      c.bytes.store(0, kRelaxed);
    }
  }
  g_comms_created.store(0, kRelaxed);
  g_comms_zero_policy.store(0, kRelaxed);
  g_comms_ce_ready.store(0, kRelaxed);
  g_inner_calls.store(0, kRelaxed);
  for (const RouteCounter& c : kRouteCounters) c.counter->store(0, kRelaxed);
  for (HostTimeHistogram& h : g_host_times) h.reset();
  g_nccl_call_times.reset();
}

// A forked child inherits a copy of the parent's counters; without this it would report the
// parent's work a second time. CUDA contexts do not survive fork, so the child holds no pool
// memory either. Only atomic stores and getpid(): safe in an atfork child handler.
void on_fork_child() {
  reset_counters();
  g_pool_bytes.store(0, kRelaxed);
  g_peer_held_bytes.store(0, kRelaxed);
  g_owner_pid.store(getpid(), kRelaxed);
  // Another thread of the parent may have held the lock at fork(); the child has one thread.
  // The child writes its own file (its pid or rank differs), so it forgets the last one.
  g_write_lock = PTHREAD_MUTEX_INITIALIZER;
  if (g_last_path != nullptr) g_last_path->clear();
  g_write_warned = false;
}

// Writes the JSON file of ZEROCTA_STATS=PATH unless it already holds this snapshot.
void write_json_if_changed(const std::string& mode) {
  zerocta_stats_t s;
  stats_snapshot(&s);
  const std::string path = stats_expand_path(mode.c_str(), stats_path_fields());
  pthread_mutex_lock(&g_write_lock);
  if (g_last_path == nullptr) g_last_path = new std::string();
  if (*g_last_path != path || memcmp(&g_last_written, &s, sizeof(s)) != 0) {
    const int err = stats_write_json(path.c_str(), s);
    if (err == 0) {
      *g_last_path = path;
      g_last_written = s;
    } else if (!g_write_warned) {
      g_write_warned = true;
      ZC_WARN("stats: cannot write the ZEROCTA_STATS file %s: %s", path.c_str(), strerror(err));
    }
  }
  pthread_mutex_unlock(&g_write_lock);
}

// ZEROCTA_STATS names a file (not unset, empty, 0 or 1).
bool stats_to_file(const std::string& mode) { return !mode.empty() && mode != "0" && mode != "1"; }

// "3221225472" -> "3.00 GiB"; for the human table only (the JSON carries exact bytes).
void human_bytes(uint64_t bytes, char* buf, size_t len) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    v /= 1024.0;
    ++unit;
  }
  if (unit == 0) {
    snprintf(buf, len, "%" PRIu64 " B", bytes);
  } else {
    snprintf(buf, len, "%.2f %s", v, kUnits[unit]);
  }
}

void print_table(const zerocta_stats_t& s) {
  char human[32];
  for (int op = 0; op < zerocta_op_count; ++op) {
    for (int route = 0; route < zerocta_route_count; ++route) {
      const zerocta_counter_t& c = s.counters[op][route];
      if (c.calls == 0 && c.bytes == 0) continue;
      human_bytes(c.bytes, human, sizeof(human));
      log_report("stats %s %s calls=%" PRIu64 " bytes=%" PRIu64 " (%s)",
                 zerocta_op_name(static_cast<zerocta_op_t>(op)),
                 zerocta_route_name(static_cast<zerocta_route_t>(route)), c.calls, c.bytes, human);
    }
  }
  human_bytes(s.pool_bytes, human, sizeof(human));
  log_report("stats comms created=%" PRIu64 " zero_policy=%" PRIu64 " ce_ready=%" PRIu64
             " pool_bytes=%" PRIu64 " (%s) inner_calls=%" PRIu64,
             s.comms_created, s.comms_zero_policy, s.comms_ce_ready, s.pool_bytes, human,
             s.inner_calls);
}

// The all-gather's pairs, mappings and special ops, where there were any.
void print_route_allgather(const RouteStats& r) {
  if (r.pairs_each_pushes + r.pairs_later_does_both + r.peer_mappings + r.staged_ops +
          r.captured_ops + r.local_group_ops ==
      0)
    return;
  char mapped[32], unmapped[32], held[32], budget[32];
  human_bytes(r.peer_mapped_bytes, mapped, sizeof(mapped));
  human_bytes(r.peer_unmapped_bytes, unmapped, sizeof(unmapped));
  human_bytes(r.peer_held_bytes, held, sizeof(held));
  human_bytes(r.peer_held_budget_bytes, budget, sizeof(budget));
  log_report(
      "stats route pairs each_pushes=%" PRIu64 " later_does_both=%" PRIu64 " peer_mappings=%" PRIu64
      " (%s, %.1f ms) unmapped=%s held=%s (bound %s per "
      "communicator) staged_ops=%" PRIu64 " captured_ops=%" PRIu64 " local_group_ops=%" PRIu64
      " pushes_deferred=%" PRIu64 " (claimed %.1f us after the call on average)",
      r.pairs_each_pushes, r.pairs_later_does_both, r.peer_mappings, mapped,
      static_cast<double>(r.peer_map_micros) / 1000.0, unmapped, held, budget, r.staged_ops,
      r.captured_ops, r.local_group_ops, r.pushes_deferred,
      r.pushes_deferred ? static_cast<double>(r.deferred_claim_micros) /
                              static_cast<double>(r.pushes_deferred)
                        : 0.0);
}

// Every routed op's host time (all-gathers and reduce-scatters), and NCCL's own call's.
void print_route(const RouteStats& r) {
  print_route_allgather(r);
  if (r.host_ops == 0) return;
  const double n = static_cast<double>(r.host_ops);
  const uint64_t sums[kHostPhases] = {r.host_post_micros,      r.host_arrive_micros,
                                      r.host_pair_wait_micros, r.host_reach_micros,
                                      r.host_issue_micros,     0};
  uint64_t call = 0;
  for (int i = 0; i + 1 < kHostPhases; ++i) call += sums[i];
  std::string line;
  char part[96];
  for (int i = 0; i < kHostPhases; ++i) {
    const HostQuantiles& q = r.host_quantiles[i];
    snprintf(part, sizeof(part), " %s=%.1f/%.0f/%.0f/%.0f", kHostPhaseNames[i],
             static_cast<double>(i + 1 < kHostPhases ? sums[i] : call) / n, q.p50, q.p90,
             q.p99);
    line += part;
  }
  log_report("stats route host us per op, mean/median/p90/p99:%s (%" PRIu64 " ops)",
             line.c_str(), r.host_ops);
  if (r.nccl_calls > 0)
    log_report("stats nccl host us per forwarded collective (NCCL's own call), median/p90/p99: "
               "%.0f/%.0f/%.0f (%" PRIu64 " calls)",
               r.nccl_call.p50, r.nccl_call.p90, r.nccl_call.p99, r.nccl_calls);
}

void report_at_exit() {
  // A child made by vfork/clone without our atfork handler still shares this handler; it
  // must not report (or overwrite) the counters of the process that gathered them.
  if (getpid() != g_owner_pid.load(kRelaxed)) return;
  const std::string& mode = config().stats;
  if (mode == "1") {
    zerocta_stats_t s;
    stats_snapshot(&s);
    print_table(s);
    print_route(route_stats_snapshot());
    return;
  }
  if (stats_to_file(mode)) write_json_if_changed(mode);
}

void append_field(std::string* out, const char* key, uint64_t value) {
  char buf[64];
  snprintf(buf, sizeof(buf), "\"%s\":%" PRIu64 ",", key, value);
  *out += buf;
}

}  // namespace

void stats_count(zerocta_op_t op, zerocta_route_t route, uint64_t bytes) {
  if (static_cast<unsigned>(op) >= zerocta_op_count ||
      static_cast<unsigned>(route) >= zerocta_route_count) {
    return;
  }
  AtomicCounter& c = g_counters[op][route];
  c.calls.fetch_add(1, kRelaxed);
  c.bytes.fetch_add(bytes, kRelaxed);
}

void stats_comm_created(bool zero_policy) {
  g_comms_created.fetch_add(1, kRelaxed);
  if (zero_policy) g_comms_zero_policy.fetch_add(1, kRelaxed);
}

void stats_comm_ce_ready() { g_comms_ce_ready.fetch_add(1, kRelaxed); }

void stats_pool_bytes_add(int64_t delta) { g_pool_bytes.fetch_add(delta, kRelaxed); }

void stats_inner_call() { g_inner_calls.fetch_add(1, kRelaxed); }

void stats_pair_settled(bool each_pushes) {
  (each_pushes ? g_pairs_each : g_pairs_later_both).fetch_add(1, kRelaxed);
}

void stats_peer_mapped(uint64_t mappings, uint64_t bytes, uint64_t micros) {
  g_peer_mappings.fetch_add(mappings, kRelaxed);
  g_peer_mapped_bytes.fetch_add(bytes, kRelaxed);
  g_peer_map_micros.fetch_add(micros, kRelaxed);
}

void stats_peer_unmapped(uint64_t bytes) { g_peer_unmapped_bytes.fetch_add(bytes, kRelaxed); }

void stats_peer_held_add(int64_t delta) { g_peer_held_bytes.fetch_add(delta, kRelaxed); }

void stats_peer_held_budget(uint64_t bytes) { g_peer_held_budget.store(bytes, kRelaxed); }

void stats_op_staged() { g_staged_ops.fetch_add(1, kRelaxed); }

void stats_push_deferred(int64_t claim_waited_us) {
  g_pushes_deferred.fetch_add(1, kRelaxed);
  g_deferred_claim_micros.fetch_add(static_cast<uint64_t>(claim_waited_us < 0 ? 0 : claim_waited_us),
                                    kRelaxed);
}
void stats_op_captured() { g_captured_ops.fetch_add(1, kRelaxed); }
void stats_op_local_group() { g_local_group_ops.fetch_add(1, kRelaxed); }

void stats_nccl_call_time(int64_t us) { g_nccl_call_times.add(us); }

void stats_op_host_times(const HostTimes& t) {
  auto add = [](std::atomic<uint64_t>& c, int64_t us) {
    c.fetch_add(us > 0 ? static_cast<uint64_t>(us) : 0, kRelaxed);
  };
  g_host_ops.fetch_add(1, kRelaxed);
  add(g_host_post, t.post);
  add(g_host_arrive, t.arrive);
  add(g_host_pair_wait, t.pair_wait);
  add(g_host_reach, t.reach);
  add(g_host_issue, t.issue);
  const int64_t phases[kHostPhases] = {t.post,  t.arrive, t.pair_wait, t.reach, t.issue,
                                       t.post + t.arrive + t.pair_wait + t.reach + t.issue};
  for (int i = 0; i < kHostPhases; ++i) g_host_times[i].add(phases[i]);
}

RouteStats route_stats_snapshot() {
  RouteStats r;
  for (const RouteCounter& c : kRouteCounters) r.*c.field = c.counter->load(kRelaxed);
  auto quantiles = [](const HostTimeHistogram& h) {
    return HostQuantiles{h.quantile(0.5), h.quantile(0.9), h.quantile(0.99)};
  };
  for (int i = 0; i < kHostPhases; ++i) r.host_quantiles[i] = quantiles(g_host_times[i]);
  r.nccl_calls = g_nccl_call_times.count();
  r.nccl_call = quantiles(g_nccl_call_times);
  const int64_t held = g_peer_held_bytes.load(kRelaxed);
  r.peer_held_bytes = held > 0 ? static_cast<uint64_t>(held) : 0;
  r.peer_held_budget_bytes = g_peer_held_budget.load(kRelaxed);
  return r;
}

void stats_install_reporter() {
  // A function-local static: thread-safe, once per process, and after the first call only an
  // acquire load and a branch.
  static const bool installed = [] {
    // config() is a function-local static too. Constructing it before atexit() registers our
    // handler guarantees it is destroyed after the handler runs (reverse order of
    // registration), so the handler may read it.
    (void)config();
    g_owner_pid.store(getpid(), kRelaxed);
    if (pthread_atfork(nullptr, nullptr, &on_fork_child) != 0) {
      ZC_WARN("stats: pthread_atfork failed; a forked child would report its parent's counters");
    }
    if (std::atexit(&report_at_exit) != 0) {
      ZC_WARN("stats: atexit failed; ZEROCTA_STATS will not be reported");
    }
    return true;
  }();
  (void)installed;
}

void stats_write_now() {
  if (g_owner_pid.load(kRelaxed) != getpid()) return;  // not installed, or not our counters
  const std::string& mode = config().stats;
  if (stats_to_file(mode)) write_json_if_changed(mode);
}

void stats_snapshot(zerocta_stats_t* out) {
  for (int op = 0; op < zerocta_op_count; ++op) {
    for (int route = 0; route < zerocta_route_count; ++route) {
      out->counters[op][route].calls = g_counters[op][route].calls.load(kRelaxed);
      out->counters[op][route].bytes = g_counters[op][route].bytes.load(kRelaxed);
    }
  }
  out->comms_created = g_comms_created.load(kRelaxed);
  out->comms_zero_policy = g_comms_zero_policy.load(kRelaxed);
  out->comms_ce_ready = g_comms_ce_ready.load(kRelaxed);
  const int64_t pool = g_pool_bytes.load(kRelaxed);
  out->pool_bytes = pool > 0 ? static_cast<uint64_t>(pool) : 0;
  out->inner_calls = g_inner_calls.load(kRelaxed);
}

void stats_reset() { reset_counters(); }

std::string stats_json(const zerocta_stats_t& s, pid_t pid, const RouteStats& route) {
  std::string out = "{";
  char buf[160];
  snprintf(buf, sizeof(buf), "\"version\":\"%d.%d.%d\",\"pid\":%ld,", ZEROCTA_VERSION_MAJOR,
           ZEROCTA_VERSION_MINOR, ZEROCTA_VERSION_PATCH, static_cast<long>(pid));
  out += buf;
  append_field(&out, "comms_created", s.comms_created);
  append_field(&out, "comms_zero_policy", s.comms_zero_policy);
  append_field(&out, "comms_ce_ready", s.comms_ce_ready);
  append_field(&out, "pool_bytes", s.pool_bytes);
  append_field(&out, "inner_calls", s.inner_calls);
  out += "\"route\":{";
  for (const RouteCounter& c : kRouteCounters) append_field(&out, c.name, route.*c.field);
  for (int i = 0; i < kHostPhases; ++i) {
    const HostQuantiles& q = route.host_quantiles[i];
    snprintf(buf, sizeof(buf),
             "\"host_%s_p50_micros\":%.1f,\"host_%s_p90_micros\":%.1f,"
             "\"host_%s_p99_micros\":%.1f,",
             kHostPhaseNames[i], q.p50, kHostPhaseNames[i], q.p90, kHostPhaseNames[i], q.p99);
    out += buf;
  }
  append_field(&out, "nccl_calls", route.nccl_calls);
  snprintf(buf, sizeof(buf),
           "\"nccl_call_p50_micros\":%.1f,\"nccl_call_p90_micros\":%.1f,"
           "\"nccl_call_p99_micros\":%.1f,",
           route.nccl_call.p50, route.nccl_call.p90, route.nccl_call.p99);
  out += buf;
  append_field(&out, "peer_held_bytes", route.peer_held_bytes);
  append_field(&out, "peer_held_budget_bytes", route.peer_held_budget_bytes);
  out.back() = '}';
  out += ",\"ops\":{";
  bool first_op = true;
  for (int op = 0; op < zerocta_op_count; ++op) {
    bool first_route = true;
    for (int route = 0; route < zerocta_route_count; ++route) {
      const zerocta_counter_t& c = s.counters[op][route];
      if (c.calls == 0 && c.bytes == 0) continue;
      if (first_route) {
        if (!first_op) out += ",";
        first_op = false;
        out += "\"";
        out += zerocta_op_name(static_cast<zerocta_op_t>(op));
        out += "\":{";
      } else {
        out += ",";
      }
      first_route = false;
      snprintf(buf, sizeof(buf), "\"%s\":{\"calls\":%" PRIu64 ",\"bytes\":%" PRIu64 "}",
               zerocta_route_name(static_cast<zerocta_route_t>(route)), c.calls, c.bytes);
      out += buf;
    }
    if (!first_route) out += "}";
  }
  out += "}}\n";
  return out;
}

int stats_write_json(const char* path) {
  zerocta_stats_t s;
  stats_snapshot(&s);
  return stats_write_json(path, s);
}

int stats_write_json(const char* path, const zerocta_stats_t& s) {
  if (path == nullptr || path[0] == '\0') return EINVAL;
  const std::string json = stats_json(s, getpid(), route_stats_snapshot());

  // O_NOFOLLOW: a planted symlink cannot redirect the write (ELOOP). O_NONBLOCK: a planted FIFO
  // cannot block the exit path in open(); the fstat check below then refuses it.
  const int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
  if (fd < 0) return errno;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return err;
  }
  // Truncate only after checking: never clobber a device, a FIFO, or another user's file that
  // a shared directory (e.g. /tmp) let us open.
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    close(fd);
    return EPERM;
  }
  if (ftruncate(fd, 0) != 0) {
    const int err = errno;
    close(fd);
    return err;
  }
  size_t done = 0;
  while (done < json.size()) {
    const ssize_t n = write(fd, json.data() + done, json.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return err;
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) return errno;
  return 0;
}

std::string stats_expand_path(const char* pattern, const StatsPathFields& fields) {
  std::string out;
  for (const char* p = pattern; *p != '\0'; ++p) {
    if (p[0] != '%') {
      out += *p;
      continue;
    }
    switch (p[1]) {
      case 'h':
        out += fields.host;
        break;
      case 'p':
        out += std::to_string(fields.pid);
        break;
      case 'r':
        out += fields.rank;
        break;
      case '%':
        out += '%';
        break;
      default:  // kept as is, also a '%' at the end
        out += '%';
        continue;
    }
    ++p;
  }
  return out;
}

std::string stats_rank(const EnvLookup& getenv_fn, pid_t pid) {
  static const char* const kRankVars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                          "SLURM_PROCID"};
  for (const char* name : kRankVars) {
    const char* v = getenv_fn ? getenv_fn(name) : nullptr;
    if (v == nullptr || *v == '\0' || std::strlen(v) > 9) continue;
    bool digits = true;
    for (const char* c = v; *c != '\0'; ++c) digits = digits && *c >= '0' && *c <= '9';
    if (digits) return v;
  }
  return std::to_string(static_cast<long>(pid));
}

StatsPathFields stats_path_fields() {
  StatsPathFields f;
  char host[256] = "";
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') std::strcpy(host, "unknown");
  host[sizeof(host) - 1] = '\0';
  if (char* dot = std::strchr(host, '.')) *dot = '\0';
  f.host = host;
  f.pid = static_cast<long>(getpid());
  f.rank = stats_rank([](const char* name) { return getenv(name); }, getpid());
  return f;
}

}  // namespace zc
