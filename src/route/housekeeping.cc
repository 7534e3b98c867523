// The housekeeping thread (housekeeping.h): its life, and one tick's work over the exports and
// the registered communicators' imports.
#include "housekeeping.h"

#include <pthread.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda_driver.h"
#include "detached_thread.h"
#include "fd_exchange.h"
#include "log.h"
#include "peer_memory.h"

namespace zc {
namespace {

struct State {
  std::mutex mu;  // guards every field; never held across a driver or socket call
  std::condition_variable cv;
  uint64_t generation = 0;  // bumped by every start and stop: a thread of another one ends
  bool running = false;
  bool child = false;    // a child forked while the thread ran: it never runs here
  bool exiting = false;  // the at-exit handler ran: no further driver call
  bool exit_handler = false;
  bool told = false;  // the INFO line of the first start
  int in_driver = 0;  // threads inside a tick's driver calls (the at-exit handler waits for 0)
  std::map<uint64_t, PeerImports*> imports;  // id -> a communicator's imports
  uint64_t next_id = 1;
};
// Never freed: the detached thread and the at-exit handler may use it until the process ends.
State* const g = new State;

// A tick's driver calls, refused once the process exits (the driver tears itself down then).
class DriverWork {
 public:
  DriverWork() {
    std::lock_guard<std::mutex> lock(g->mu);
    ok_ = !g->exiting;
    if (ok_) ++g->in_driver;
  }
  ~DriverWork() {
    if (!ok_) return;
    std::lock_guard<std::mutex> lock(g->mu);
    --g->in_driver;
    g->cv.notify_all();
  }
  DriverWork(const DriverWork&) = delete;
  DriverWork& operator=(const DriverWork&) = delete;
  explicit operator bool() const { return ok_; }

 private:
  bool ok_ = false;
};

// The exports (sweep_exports), asked from the device of a communicator of the route: its
// primary context is retained already.
void sweep(const CudaDriver& cu) {
  int device = -1;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    if (!g->imports.empty()) device = g->imports.begin()->second->device();
  }
  DriverWork work;
  if (device < 0 || !work) return;
  ScopedDevice on(device);
  sweep_exports(cu);
}

// A communicator's imports and the questions for their owners.
struct Asked {
  uint64_t id = 0;
  std::vector<PeerImports::OwnerQuery> queries;
};

// One step of a communicator's releases: with `answers` (the first), what may go now, about
// kHousekeepingCallsPerStep driver calls' worth, taken out under the lock and released without
// it. False when nothing was (busy, its copies run, nothing left, or it is gone).
bool release_step(const CudaDriver& cu, uint64_t id,
                  const std::vector<PeerImports::OwnerQuery>& answers) {
  PeerImports::Release r;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    const auto it = g->imports.find(id);
    if (it == g->imports.end() ||
        !it->second->take_releasable(answers, kHousekeepingCallsPerStep, &r) || r.empty())
      return false;
  }
  DriverWork work;
  if (!work) return false;  // the process is ending: it frees them all
  PeerImports::release(cu, &r);
  return true;
}

// The imports: questions taken under the lock, asked without it; answered, and what may go
// released step by step while the communicator's copies stay idle. A communicator whose imports
// are busy waits for the next tick; one removed meanwhile is left alone.
void tend_imports(const CudaDriver& cu) {
  std::vector<Asked> asked;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    for (const auto& [id, imports] : g->imports) {
      Asked a;
      a.id = id;
      if (imports->owner_queries(&a.queries)) asked.push_back(std::move(a));
    }
  }
  for (Asked& a : asked)
    for (PeerImports::OwnerQuery& q : a.queries)
      q.answered = fd_published(q.address.c_str(), q.pid, q.tokens.data(), q.tokens.size(),
                                &q.published, kHousekeepingAskMs, nullptr);
  for (const Asked& a : asked)
    if (release_step(cu, a.id, a.queries))
      while (release_step(cu, a.id, {})) {
      }
}

// Whether thread `mine` may run another tick, after waiting for it.
bool next_tick(uint64_t mine) {
  std::unique_lock<std::mutex> lock(g->mu);
  const auto over = [mine] { return g->generation != mine || g->exiting; };
  g->cv.wait_for(lock, std::chrono::milliseconds(kHousekeepingTickMs), over);
  return !over();
}

void* housekeeping_main(void* arg) {
  const uint64_t mine = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(arg));
  const CudaDriver* cu = cuda_driver();
  if (!cu) return nullptr;
  {
    // This thread's calls must not count as unsafe in an application's global-mode capture.
    DriverWork work;
    CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (work) cu->cuThreadExchangeStreamCaptureMode(&relaxed);
  }
  while (next_tick(mine)) {
    sweep(*cu);
    tend_imports(*cu);
  }
  return nullptr;
}

// The process is ending: no further driver call, and the one in progress is given a moment.
void at_exit() {
  std::unique_lock<std::mutex> lock(g->mu);
  g->exiting = true;
  g->cv.notify_all();
  g->cv.wait_for(lock, std::chrono::milliseconds(kHousekeepingExitWaitMs),
                 [] { return g->in_driver == 0; });
}

// Starts the thread for `generation`; false if it could not be created.
bool spawn(uint64_t generation) {
  const int rc = start_detached_thread(
      housekeeping_main, reinterpret_cast<void*>(static_cast<uintptr_t>(generation)), "zerocta-hk");
  if (rc != 0) {
    ZC_WARN(
        "housekeeping: cannot start its thread: %s; freed memory is given back at routed "
        "all-gathers only",
        strerror(rc));
    return false;
  }
  return true;
}

// fork(): the state is copied whole (the lock is held across it), and the child has no thread.
// A child forked while it ran never starts one (its fd service is off as well, fd_exchange.h);
// one forked before (the ranks a launcher forks) is a process of its own.
void fork_prepare() { g->mu.lock(); }
void fork_parent() { g->mu.unlock(); }
void fork_child() {
  g->child = g->child || g->running;
  g->running = false;
  ++g->generation;
  g->in_driver = 0;
  g->mu.unlock();
}
// Registered when the library loads, so that no fork can come before the handlers.
const int g_atfork_registered = pthread_atfork(fork_prepare, fork_parent, fork_child);

}  // namespace

void housekeeping_start() {
  (void)g_atfork_registered;
  std::lock_guard<std::mutex> lock(g->mu);
  if (g->running || g->child || g->exiting || g->imports.empty()) return;
  if (!g->exit_handler) g->exit_handler = atexit(at_exit) == 0;
  if (!spawn(++g->generation)) return;
  g->running = true;
  if (g->told) return;
  g->told = true;
  ZC_INFO(
      "housekeeping: started: the exports and the peers' imports of allocations the "
      "application frees are released within %d ms of the free, with no NCCL call; the "
      "peers' memory mapped here is bounded at %llu B per communicator",
      2 * kHousekeepingTickMs + kHousekeepingAskMs,
      static_cast<unsigned long long>(kPeerHeldBudget));
}

void housekeeping_stop() {
  std::lock_guard<std::mutex> lock(g->mu);
  if (!g->running) return;
  g->running = false;
  ++g->generation;
  g->cv.notify_all();
}

uint64_t housekeeping_add(PeerImports* imports) {
  std::lock_guard<std::mutex> lock(g->mu);
  const uint64_t id = g->next_id++;
  g->imports[id] = imports;
  return id;
}

void housekeeping_remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(g->mu);
  g->imports.erase(id);
}

}  // namespace zc
