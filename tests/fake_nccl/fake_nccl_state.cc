// Fake NCCL: the parts of NCCL 2.28's behaviour that an interposer runs into and that the
// plain fake used to skip (line numbers: NCCL v2.28.9-1 src/init.cc and src/group.cc).
//
// Always on (they only change what code using groups sees):
//   * Groups nest per thread. An init, split or shrink called inside a group is deferred to
//     the thread's outermost ncclGroupEnd (ncclAsyncLaunch queues the job): ncclCommInitRank*
//     hand out the handle at once, but the comm answers rank 0, count 0, device 0 (and
//     ncclSuccess: its asyncResult is still 0) until the group end; a split or shrink writes
//     *newcomm = NULL and the child's handle only at the group end, as NCCL's job does at its
//     end (init.cc:2572 and :1612).
//   * Collectives called inside a group are checked and logged at the call with " queued",
//     and launched at the outermost group end ("ncclGroupEnd:launch <call>"): communicators
//     in the order of a hash of their keys, as NCCL orders them by commHash, each one's ops in
//     call order.
//     ncclGroupSimulateEnd completes the inits but launches nothing (group.cc:604).
//     The group end's own line carries the summary: completes_init=, failed_init=,
//     in_progress=, launched=, simulated=.
//
// Opt-in (environment):
//   FAKE_NCCL_NONBLOCKING=1          non-blocking comms (config blocking=0, or
//                                    NCCL_COMM_BLOCKING=0) are in progress after their init:
//                                    the init returns ncclInProgress and ncclCommGetAsyncError
//                                    answers ncclInProgress for FAKE_NCCL_INPROGRESS_POLLS
//                                    polls (default 3). Meanwhile Count/UserRank/CuDevice,
//                                    collectives, Split/Shrink, Finalize and Destroy return
//                                    ncclInvalidArgument (ncclCommEnsureReady, init.cc:373);
//                                    GetAsyncError, Abort and Revoke are accepted. A split of
//                                    a non-blocking parent returns ncclSuccess with
//                                    *newcomm = NULL and puts the parent in progress; the
//                                    child's handle is written when the parent is polled
//                                    ready.
//   FAKE_NCCL_RENDEZVOUS_DIR=dir     an init of nranks > 1 completes only once every rank
//                                    has entered it: rank r creates
//                                    dir/<id hex>.<instance>.<r>, where <instance> counts the
//                                    inits of that id by that rank in this process. Blocking
//                                    init waits (1 ms polls) up to
//                                    FAKE_NCCL_RENDEZVOUS_TIMEOUT_MS (default 10000), then
//                                    returns ncclSystemError; a grouped init enters and
//                                    waits at the group end; a non-blocking one stays in
//                                    progress.
//                                    Splits: every parent rank (NCCL_SPLIT_NOCOLOR too) files
//                                    "<color> <key>" under <parent key>.s<n>; the child is the
//                                    ranks of one color ordered by (key, parent rank), as
//                                    NCCL's commGetSplitInfo all-gather makes it. Shrinks:
//                                    the members are the parent ranks not excluded, under
//                                    <parent key>.s<n>x<sorted excluded ranks>.
//   FAKE_NCCL_FAIL_RANK=r            the init of rank r (InitRank*, InitRankScalable) fails
//                                    with ncclSystemError and never enters the rendezvous,
//                                    so the other ranks time out, as in NCCL.
//   FAKE_NCCL_INNER_THREAD=1         a non-blocking init starts a fake "NCCL thread" that calls
//                                    ncclGetVersion and ncclCommGetAsyncError through the PLT
//                                    (logged "fakeNcclThread ..."); the comm is ready only
//                                    after it ended (the poll that would see it ready joins
//                                    it, so the number of polls in progress stays exact).
// FAKE_NCCL_COMM_ID is in fake_nccl_registry.cc (fill_unique_id).
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <utility>

#include "fake_nccl_internal.h"

namespace fake {
namespace {

std::mutex g_mu;

struct QueuedOp {
  std::string line;
  ncclComm_t comm;
};

struct Group {
  int depth = 0;
  std::vector<Comm*> inits;  // deferred inits, splits and shrinks, in call order
  std::vector<QueuedOp> ops;
  std::vector<std::pair<ncclWindow_t*, ncclWindow_t>> windows;  // written at the group's end
};
thread_local Group t_group;
// The fake's own "NCCL thread": its polls are NCCL asking itself, they make no progress.
thread_local bool t_nccl_thread = false;

long long now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long n = strtol(v, &end, 10);
  return end != nullptr && *end == '\0' ? static_cast<int>(n) : fallback;
}

bool env_is_1(const char* name) {
  const char* v = getenv(name);
  return v != nullptr && strcmp(v, "1") == 0;
}

int inprogress_polls() { return std::max(0, env_int("FAKE_NCCL_INPROGRESS_POLLS", 3)); }
int rendezvous_timeout_ms() { return env_int("FAKE_NCCL_RENDEZVOUS_TIMEOUT_MS", 10000); }

std::string rendezvous_dir() {
  const char* v = getenv("FAKE_NCCL_RENDEZVOUS_DIR");
  return v != nullptr ? v : "";
}

// The id's bytes in hex, trailing zero bytes left out; a hash when that is still long.
std::string id_key(const ncclUniqueId& id) {
  const auto* b = reinterpret_cast<const unsigned char*>(id.internal);
  size_t n = sizeof(id.internal);
  while (n > 0 && b[n - 1] == 0) --n;
  if (n == 0) return "00";
  if (n <= 64) return hex_bytes(b, n);
  unsigned long long h = 1469598103934665603ull;  // FNV-1a
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    h ^= b[i];
    h *= 1099511628211ull;
  }
  return strf("h%016llx", h);
}

// 1 for the first init of (id, rank) in this process, 2 for the next, ...: threads of one
// process that hold different ranks of one communicator get the same instance.
int next_instance(const std::string& idkey, int rank) {
  static std::mutex mu;
  static auto* counts = new std::map<std::string, int>();  // never destroyed: used at exit
  std::lock_guard<std::mutex> lock(mu);
  return ++(*counts)[idkey + "/" + std::to_string(rank)];
}

// Creates prefix + rank holding `content`, atomically (written aside, then renamed).
void enter(const std::string& prefix, int rank, const std::string& content) {
  static std::atomic<int> serial{0};
  const std::string path = prefix + std::to_string(rank);
  const std::string dir = path.substr(0, path.rfind('/') + 1);
  const std::string tmp = dir + strf(".fake-nccl-tmp.%d.%ld.%d", static_cast<int>(getpid()),
                                     static_cast<long>(syscall(SYS_gettid)), serial++);
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    log_line("fakeRendezvous cannot create " + tmp + ": " + strerror(errno));
    return;
  }
  ssize_t w = write(fd, content.data(), content.size());
  (void)w;
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    log_line("fakeRendezvous cannot create " + path + ": " + strerror(errno));
    unlink(tmp.c_str());
  }
}

bool read_small_file(const std::string& path, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n < 0) return false;
  out->assign(buf, static_cast<size_t>(n));
  return true;
}

// One look at the files. Split: once all are there, sets the child's size and rank.
bool check(Rendezvous& rv, int* nranks, int* rank) {
  if (!rv.active || rv.done) return true;
  int entered = 0;
  std::vector<std::pair<int, int>> same_color;  // (key, parent rank)
  for (int member : rv.members) {
    const std::string path = rv.prefix + std::to_string(member);
    if (rv.split) {
      std::string text;
      int color = 0, key = 0;
      if (!read_small_file(path, &text) || sscanf(text.c_str(), "%d %d", &color, &key) != 2)
        continue;
      if (color == rv.color) same_color.emplace_back(key, member);
    } else if (access(path.c_str(), F_OK) != 0) {
      continue;
    }
    ++entered;
  }
  rv.entered = entered;
  if (entered < static_cast<int>(rv.members.size())) return false;
  rv.done = true;
  if (rv.split) {
    std::sort(same_color.begin(), same_color.end());
    *nranks = static_cast<int>(same_color.size());
    for (size_t i = 0; i < same_color.size(); ++i)
      if (same_color[i].second == rv.parent_rank) *rank = static_cast<int>(i);
  }
  return true;
}

bool progress(Comm* c) { return check(c->rv, &c->nranks, &c->rank); }

std::string timeout_text(const Rendezvous& rv) {
  return strf(" rendezvous_timeout_ms=%d entered=%d/%zu", rendezvous_timeout_ms(), rv.entered,
              rv.members.size());
}

// Polls every 1 ms until each comm's rendezvous is done or past its deadline.
void wait_all(const std::vector<Comm*>& comms) {
  for (;;) {
    bool pending = false;
    const long long t = now_ms();
    for (Comm* c : comms)
      if (!progress(c) && t < c->rv.deadline_ms) pending = true;
    if (!pending) return;
    usleep(1000);
  }
}

void start_deadline(Rendezvous& rv) {
  if (rv.active && rv.deadline_ms == 0) rv.deadline_ms = now_ms() + rendezvous_timeout_ms();
}

// The end of an init job: ready or failed; a split child's handle is written now, even on
// failure, as NCCL's ncclCommInitRankFunc does at its exit. Returns the init's result and
// appends why it failed to *why.
ncclResult_t finish_init(Comm* c, std::string* why) {
  ncclResult_t r = c->init_result;
  if (r != ncclSuccess) {
    *why += strf(" fail_rank=%d", c->rank);
  } else if (!progress(c)) {
    r = ncclSystemError;
    *why += timeout_text(c->rv);
  }
  c->async_error = r;
  c->state.store(r == ncclSuccess ? State::kReady : State::kFailed);
  if (c->slot != nullptr)
    __atomic_store_n(c->slot, reinterpret_cast<ncclComm_t>(c), __ATOMIC_RELEASE);
  c->slot = nullptr;
  return r;
}

void start_inner_thread(Comm* c) {
  c->inner = std::thread([c] {
    t_nccl_thread = true;
    log_line("fakeNcclThread comm=" + name_of(c) +
             strf(" tid=%ld calls ncclGetVersion ncclCommGetAsyncError",
                  static_cast<long>(syscall(SYS_gettid))));
    // Plain calls of the exported functions: through the PLT, so a preloaded shim sees them
    // coming from this library, on a thread the application never created.
    int version = 0;
    ncclGetVersion(&version);
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(reinterpret_cast<ncclComm_t>(c), &state);
  });
}

// Makes a deferred comm's init asynchronous: the comm (a root init) or its parent (a split)
// is in progress from now on. Called with g_mu held.
void go_in_progress(Comm* c) {
  start_deadline(c->rv);
  c->state.store(State::kInProgress);
  if (c->parent != nullptr) {
    c->parent->children.push_back(c);
    c->parent->polls_left = inprogress_polls();
    c->parent->state.store(State::kInProgress);
  } else {
    c->polls_left = inprogress_polls();
  }
}

std::string names(const std::vector<Comm*>& comms) {
  std::string s;
  for (Comm* c : comms) s += (s.empty() ? "" : ",") + name_of(c);
  return s;
}

}  // namespace

std::mutex& state_mutex() { return g_mu; }

bool nonblocking_model() { return env_is_1("FAKE_NCCL_NONBLOCKING"); }

bool config_nonblocking(const ncclConfig_t* config, bool inherited) {
  const char* env = getenv("NCCL_COMM_BLOCKING");
  const bool env_nonblocking = env != nullptr && strcmp(env, "0") == 0;
  if (config == nullptr) return inherited || env_nonblocking;
  if (!config_magic_ok(config) || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int))
    return env_nonblocking;
  if (config->blocking == NCCL_CONFIG_UNDEF_INT) return env_nonblocking;
  return config->blocking == 0;
}

int group_depth() { return t_group.depth; }
void group_start() { ++t_group.depth; }
void group_leave() {
  if (t_group.depth > 0) --t_group.depth;
}

bool queue_if_grouped(const std::string& line, ncclComm_t comm) {
  if (t_group.depth == 0) return false;
  t_group.ops.push_back({line, comm});
  log_line(line + " -> 0 queued");
  return true;
}

ncclResult_t ensure_ready(ncclComm_t comm) {
  Comm* c = find_comm(comm);
  if (c == nullptr) return ncclSuccess;
  switch (c->state.load()) {
    case State::kInProgress:
      return ncclInvalidArgument;
    case State::kFailed:
      return c->async_error;
    default:
      return ncclSuccess;
  }
}

bool defer_window_if_grouped(ncclWindow_t* out, ncclWindow_t win) {
  if (t_group.depth == 0) return false;
  t_group.windows.emplace_back(out, win);
  return true;
}

// As NCCL's groupLaunch: the group's communicators in the order of their hashes (NCCL inserts
// each into the group's list by commHash, ncclGroupCommJoin), each one's ops in call order. So
// a group whose ranks name its communicators in different orders launches alike everywhere.
void launch_order(std::vector<QueuedOp>* ops) {
  auto hash_of = [](ncclComm_t comm) -> size_t {
    const Comm* c = find_comm(comm);
    return c ? std::hash<std::string>()(c->key) : 0;
  };
  std::stable_sort(ops->begin(), ops->end(), [&](const QueuedOp& a, const QueuedOp& b) {
    return hash_of(a.comm) < hash_of(b.comm);
  });
}

ncclResult_t group_finish(bool simulate, std::string* summary) {
  std::vector<Comm*> inits;
  std::vector<QueuedOp> ops;
  inits.swap(t_group.inits);
  ops.swap(t_group.ops);
  // As NCCL 2.28: a window registered inside a group is handed out only now.
  for (auto& [out, win] : t_group.windows) *out = win;
  if (!t_group.windows.empty()) *summary += strf(" windows=%zu", t_group.windows.size());
  t_group.windows.clear();

  std::vector<Comm*> now, async;
  for (Comm* c : inits) {
    if (!is_registered(Kind::kComm, c)) continue;  // destroyed inside the group
    if (c->rv.enter_rank >= 0) {
      enter(c->rv.prefix, c->rv.enter_rank, c->rv.enter_content);
      c->rv.enter_rank = -1;
    }
    (c->async_init ? async : now).push_back(c);
  }
  for (Comm* c : now) start_deadline(c->rv);
  wait_all(now);

  ncclResult_t result = ncclSuccess;
  std::vector<Comm*> completed, failed;
  std::string why;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (Comm* c : now) {
      ncclResult_t r = finish_init(c, &why);
      (r == ncclSuccess ? completed : failed).push_back(c);
      if (r != ncclSuccess && result == ncclSuccess) result = r;
    }
    for (Comm* c : async) go_in_progress(c);
  }
  for (Comm* c : async)
    if (c->parent == nullptr && env_is_1("FAKE_NCCL_INNER_THREAD")) start_inner_thread(c);
  if (!async.empty() && result == ncclSuccess) result = ncclInProgress;

  launch_order(&ops);
  int launched = 0, simulated = 0;
  for (const QueuedOp& op : ops) {
    if (simulate) {
      ++simulated;
      continue;
    }
    ncclResult_t r = ncclSuccess;
    if (Comm* c = find_comm(op.comm))
      if (c->state.load() == State::kFailed) r = c->async_error;
    log_line("ncclGroupEnd:launch " + op.line + strf(" -> %d", static_cast<int>(r)));
    ++launched;
    if (r != ncclSuccess && (result == ncclSuccess || result == ncclInProgress)) result = r;
  }

  if (!completed.empty()) *summary += " completes_init=" + names(completed);
  if (!failed.empty()) *summary += " failed_init=" + names(failed) + why;
  if (!async.empty()) *summary += " in_progress=" + names(async);
  if (launched) *summary += strf(" launched=%d", launched);
  if (simulated) *summary += strf(" simulated=%d", simulated);
  return result;
}

ncclResult_t create_root(const std::string& line, ncclComm_t* out, int nranks, int rank, int device,
                         const ncclConfig_t* config, const ncclUniqueId* id) {
  const bool nonblocking = config_nonblocking(config, false);
  const bool grouped = t_group.depth > 0;
  const bool async = nonblocking && nonblocking_model();
  const int fail_rank = env_int("FAKE_NCCL_FAIL_RANK", -1);
  const ncclResult_t planned = fail_rank >= 0 && rank == fail_rank ? ncclSystemError : ncclSuccess;

  std::string key;
  Rendezvous rv;
  const std::string dir = rendezvous_dir();
  if (!dir.empty()) {
    const std::string idkey = id != nullptr ? id_key(*id) : "noid";
    key = idkey + "." + std::to_string(next_instance(idkey, rank));
    rv.prefix = dir + "/" + key + ".";
    // NCCL's bootstrap of a grouped init runs at the group's end: no peer sees this rank
    // before then (an interposer's work just before that end included).
    if (planned == ncclSuccess && grouped) {
      rv.enter_rank = rank;
      rv.enter_content = strf("%d\n", static_cast<int>(getpid()));
    } else if (planned == ncclSuccess) {
      enter(rv.prefix, rank, strf("%d\n", static_cast<int>(getpid())));
    }
    // A failing rank never enters: it does not wait for the others either.
    rv.active = nranks > 1 && planned == ncclSuccess;
    for (int r = 0; r < nranks; ++r) rv.members.push_back(r);
  }

  if (!grouped && !async) {  // blocking: the init completes before the call returns
    if (planned != ncclSuccess) {
      *out = nullptr;
      log_line(line + strf(" -> %d fail_rank=%d", static_cast<int>(planned), rank));
      return planned;
    }
    start_deadline(rv);
    int unused_n = 0, unused_r = 0;
    while (!check(rv, &unused_n, &unused_r) && now_ms() < rv.deadline_ms) usleep(1000);
    if (!rv.done && rv.active) {
      *out = nullptr;
      log_line(line + strf(" -> %d", static_cast<int>(ncclSystemError)) + timeout_text(rv));
      return ncclSystemError;
    }
    Comm* c = new_comm(nranks, rank, device, config);
    c->key = key;
    c->nonblocking = nonblocking;
    *out = reinterpret_cast<ncclComm_t>(c);
    log_line(line + " -> 0 newcomm=" + name_of(c));
    nccl_debug_line(line + " -> 0 newcomm=" + name_of(c));
    if (nonblocking && env_is_1("FAKE_NCCL_INNER_THREAD")) {
      start_inner_thread(c);  // without FAKE_NCCL_NONBLOCKING the init ends with its thread
      c->inner.join();
    }
    return ncclSuccess;
  }

  Comm* c = new_comm(nranks, rank, device, config);
  c->key = key;
  c->nonblocking = nonblocking;
  c->async_init = async;
  c->init_result = planned;
  c->rv = rv;
  *out = reinterpret_cast<ncclComm_t>(c);
  if (grouped) {
    c->state.store(State::kGrouped);
    t_group.inits.push_back(c);
    log_line(line + " -> 0 newcomm=" + name_of(c));
    return ncclSuccess;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    go_in_progress(c);
  }
  if (env_is_1("FAKE_NCCL_INNER_THREAD")) start_inner_thread(c);
  log_line(line + strf(" -> %d newcomm=", static_cast<int>(ncclInProgress)) + name_of(c));
  return ncclInProgress;
}

ncclResult_t create_child(const std::string& line, Comm* parent, bool shrink, int color, int key,
                          const int* exclude, int exclude_count, ncclComm_t* newcomm,
                          const ncclConfig_t* config) {
  if (ncclResult_t r = ensure_ready(reinterpret_cast<ncclComm_t>(parent))) {
    log_line(line + strf(" -> %d", static_cast<int>(r)));
    return r;
  }
  int counter;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    counter = ++parent->splits;
  }
  // Today's fake answers (no rendezvous): a split child has the parent's size and rank, a
  // shrunk one the parent's size less the excluded ranks, rank 0.
  int nranks = shrink ? parent->nranks - exclude_count : parent->nranks;
  int rank = shrink ? 0 : parent->rank;
  std::string base = (parent->key.empty() ? std::string("nokey") : parent->key) +
                     strf(".s%d", counter),
              child_key;
  Rendezvous rv;
  if (shrink) {
    std::vector<int> excluded;
    if (exclude != nullptr) excluded.assign(exclude, exclude + exclude_count);
    std::sort(excluded.begin(), excluded.end());
    base += "x";
    for (size_t i = 0; i < excluded.size(); ++i) base += strf(i ? "-%d" : "%d", excluded[i]);
    for (int r = 0; r < parent->nranks; ++r)
      if (!std::binary_search(excluded.begin(), excluded.end(), r)) rv.members.push_back(r);
    child_key = base;
  } else {
    for (int r = 0; r < parent->nranks; ++r) rv.members.push_back(r);
    rv.split = true;
    rv.color = color;
    rv.parent_rank = parent->rank;
    child_key = base + strf("c%d", color);
  }
  const std::string dir = rendezvous_dir();
  if (!dir.empty()) {
    if (shrink) {
      auto it = std::find(rv.members.begin(), rv.members.end(), parent->rank);
      if (it == rv.members.end()) {  // NCCL: an excluded rank must not call ncclCommShrink
        log_line(line + strf(" -> %d", static_cast<int>(ncclInvalidArgument)));
        return ncclInvalidArgument;
      }
      nranks = static_cast<int>(rv.members.size());
      rank = static_cast<int>(it - rv.members.begin());
    }
    rv.prefix = dir + "/" + base + ".";
    enter(rv.prefix, parent->rank, strf("%d %d\n", color, key));
    rv.active = rv.members.size() > 1;
  }
  if (!shrink && color == NCCL_SPLIT_NOCOLOR) {  // took part in the exchange, gets nothing
    *newcomm = nullptr;
    log_line(line + " -> 0 newcomm=NULL");
    return ncclSuccess;
  }

  const bool grouped = t_group.depth > 0;
  const bool async = parent->nonblocking && nonblocking_model();
  const bool child_nonblocking = config_nonblocking(config, parent->nonblocking);
  if (!grouped && !async) {
    start_deadline(rv);
    while (!check(rv, &nranks, &rank) && now_ms() < rv.deadline_ms) usleep(1000);
    if (!rv.done && rv.active) {
      *newcomm = nullptr;
      log_line(line + strf(" -> %d", static_cast<int>(ncclSystemError)) + timeout_text(rv));
      return ncclSystemError;
    }
    Comm* c = new_comm(nranks, rank, parent->device, config);
    c->key = child_key;
    c->nonblocking = child_nonblocking;
    *newcomm = reinterpret_cast<ncclComm_t>(c);
    log_line(line + " -> 0 newcomm=" + name_of(c));
    return ncclSuccess;
  }
  // NCCL: "*newcomm should be NCCL_COMM_NULL until comm split fully complete".
  *newcomm = nullptr;
  Comm* c = new_comm(nranks, rank, parent->device, config);
  c->key = child_key;
  c->nonblocking = child_nonblocking;
  c->async_init = async;
  c->parent = parent;
  c->slot = newcomm;
  c->rv = rv;
  if (grouped) {
    c->state.store(State::kGrouped);
    t_group.inits.push_back(c);
  } else {
    std::lock_guard<std::mutex> lock(g_mu);
    go_in_progress(c);
  }
  log_line(line + " -> 0 newcomm=" + name_of(c) + " pending");
  return ncclSuccess;
}

void key_local_comms(Comm* const* comms, int n) {
  if (rendezvous_dir().empty()) return;
  static std::atomic<int> serial{0};
  const std::string key = strf("initall%d.%d", static_cast<int>(getpid()), ++serial);
  for (int i = 0; i < n; ++i) comms[i]->key = key;
}

void defer_window_until_polled(Comm* c, ncclWindow_t* out, ncclWindow_t win) {
  std::lock_guard<std::mutex> lock(g_mu);
  c->pending_windows.emplace_back(out, win);
  c->window_polls_left = inprogress_polls();
}

ncclResult_t poll_async(Comm* c, std::string* extra) {
  if (c->state.load() == State::kReady) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!c->pending_windows.empty()) {
      if (c->window_polls_left > 0) {
        --c->window_polls_left;
        return ncclInProgress;
      }
      for (auto& [out, win] : c->pending_windows) *out = win;
      *extra += strf(" wrote_windows=%zu", c->pending_windows.size());
      c->pending_windows.clear();
    }
  }
  switch (c->state.load()) {
    case State::kGrouped:
      return ncclSuccess;  // NCCL: asyncResult is still 0 before the group end
    case State::kInProgress:
      break;
    default:
      return c->async_error;
  }
  if (t_nccl_thread) return ncclInProgress;
  std::unique_lock<std::mutex> lock(g_mu);
  if (c->state.load() != State::kInProgress) return c->async_error;
  if (c->polls_left > 0) {
    --c->polls_left;
    return ncclInProgress;
  }
  // The fake NCCL thread is part of the init: the poll that would see the comm ready waits
  // for it (it makes two quick calls), so the number of polls in progress stays exact.
  if (c->inner.joinable()) {
    std::thread inner = std::move(c->inner);
    lock.unlock();
    inner.join();
    lock.lock();
    if (c->state.load() != State::kInProgress) return c->async_error;
  }
  const long long t = now_ms();
  if (!progress(c) && t < c->rv.deadline_ms) return ncclInProgress;
  for (Comm* child : c->children)
    if (!progress(child) && t < child->rv.deadline_ms) return ncclInProgress;

  std::string why;
  ncclResult_t r = finish_init(c, &why);
  std::vector<Comm*> wrote;
  for (Comm* child : c->children) {
    ncclResult_t rc = finish_init(child, &why);
    child->parent = nullptr;
    wrote.push_back(child);
    // NCCL's split job belongs to the parent: its failure is the parent's async error.
    if (rc != ncclSuccess && r == ncclSuccess) r = rc;
  }
  c->children.clear();
  c->async_error = r;
  c->state.store(r == ncclSuccess ? State::kReady : State::kFailed);
  lock.unlock();
  if (!wrote.empty()) *extra += " wrote_newcomm=" + names(wrote);
  *extra += why;
  return r;
}

ncclResult_t query_value(Comm* c, int Comm::*field, int* value) {
  switch (c->state.load()) {
    case State::kGrouped:
      *value = 0;
      return ncclSuccess;
    case State::kInProgress:
      return ncclInvalidArgument;
    case State::kFailed:
      return c->async_error;
    default:
      *value = c->*field;
      return ncclSuccess;
  }
}

void before_free(Comm* c) {
  if (c->inner.joinable()) c->inner.join();
  auto& inits = t_group.inits;
  inits.erase(std::remove(inits.begin(), inits.end(), c), inits.end());
  std::vector<Comm*> orphans;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    orphans.swap(c->children);
    if (c->parent != nullptr) {
      auto& siblings = c->parent->children;
      siblings.erase(std::remove(siblings.begin(), siblings.end(), c), siblings.end());
    }
  }
  // Children whose split never completed: their handles were never handed out.
  for (Comm* child : orphans)
    if (unregister_object(Kind::kComm, child)) delete child;
}

}  // namespace fake
