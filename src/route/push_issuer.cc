#include "push_issuer.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda_driver.h"
#include "detached_thread.h"
#include "direct_plan.h"
#include "log.h"
#include "monotonic_clock.h"

namespace zc {
namespace {

// How the thread waits while it has jobs none of which could move: it spins first (a peer
// usually claims within microseconds, and while the GPUs are caught up every microsecond here
// delays the op's end on both), then yields, then sleeps a little. Idle with no job, it sleeps
// on its condition variable.
constexpr int64_t kSpinUs = 200;
constexpr int64_t kYieldUs = 2000;
constexpr int kSleepUs = 20;

struct Issuer {
  std::mutex mu;
  std::condition_variable cv;      // a job came (thread), a step ended (forget)
  std::deque<std::unique_ptr<IssuerJob>> jobs;
  const void* busy = nullptr;      // the owner of the job whose step runs now
  bool running = false, exiting = false;
  pid_t pid = 0;                   // the process that made the contexts
  CUcontext contexts[kMaxRanks] = {};
  bool tried[kMaxRanks] = {};
};

Issuer* g = new Issuer;  // never freed: the thread may outlive static destruction

bool in_child() { return g->pid != 0 && g->pid != getpid(); }

// Runs one pass over the jobs: the oldest job of every communicator gets one step. A later op's
// copies must not be issued on the communicator's stream before an earlier op's: the earlier
// op's end on a peer may wait for them (its ready for the later op comes after it). Returns
// whether any job moved.
bool one_pass(const CudaDriver& cu, CUcontext* current) {
  bool moved = false;
  std::vector<const void*> stepped;
  std::unique_lock<std::mutex> lock(g->mu);
  for (size_t i = 0; i < g->jobs.size() && !g->exiting;) {
    IssuerJob* job = g->jobs[i].get();
    bool older = false;
    for (const void* o : stepped) older |= o == job->owner();
    stepped.push_back(job->owner());
    if (older) {
      ++i;
      continue;
    }
    const int dev = job->device();
    CUcontext want = dev >= 0 && dev < kMaxRanks ? g->contexts[dev] : nullptr;
    g->busy = job->owner();
    lock.unlock();
    if (want != *current && cu.cuCtxSetCurrent(want) == CUDA_SUCCESS) *current = want;
    const IssuerJob::Step s = want ? job->step() : IssuerJob::Step::kFailed;
    lock.lock();
    g->busy = nullptr;
    g->cv.notify_all();
    // forget() may have dropped it meanwhile (and waited for this step): look for it again.
    size_t at = i;
    while (at < g->jobs.size() && g->jobs[at].get() != job) ++at;
    if (at == g->jobs.size()) continue;
    if (s == IssuerJob::Step::kPending) {
      i = at + 1;
      continue;
    }
    moved = true;
    std::unique_ptr<IssuerJob> gone = std::move(g->jobs[at]);
    g->jobs.erase(g->jobs.begin() + static_cast<long>(at));
    i = at;
    if (s == IssuerJob::Step::kFailed) {
      lock.unlock();
      gone->fail();
      gone.reset();
      lock.lock();
    }
  }
  return moved;
}

void* issuer_main(void*) {
  const CudaDriver* cu = cuda_driver();
  CUcontext current = nullptr;
  int64_t last_progress = monotonic_us();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(g->mu);
      if (g->jobs.empty()) last_progress = 0;
      g->cv.wait(lock, [] { return !g->jobs.empty() || g->exiting; });
      if (g->exiting) {
        g->running = false;
        g->cv.notify_all();
        return nullptr;
      }
    }
    const int64_t now = monotonic_us();
    if (last_progress == 0 || one_pass(*cu, &current)) {
      last_progress = now;
      continue;
    }
    const int64_t idle = now - last_progress;
    if (idle < kSpinUs) continue;
    if (idle < kYieldUs)
      sched_yield();
    else
      usleep(kSleepUs);
  }
}

// At exit no step may be running while the driver tears down: the thread stops between steps.
void at_exit() {
  std::unique_lock<std::mutex> lock(g->mu);
  g->exiting = true;
  g->cv.notify_all();
  g->cv.wait(lock, [] { return g->busy == nullptr; });
}

}  // namespace

CUcontext push_issuer_context(int device) {
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->own_context_ok || device < 0 || device >= kMaxRanks) return nullptr;
  std::lock_guard<std::mutex> lock(g->mu);
  if (in_child() || g->exiting) return nullptr;
  if (g->tried[device]) return g->contexts[device];
  g->tried[device] = true;
  g->pid = getpid();
  CUdevice dev;
  size_t free_before = 0, free_after = 0, total = 0;
  const bool sized = cu->cuMemGetInfo(&free_before, &total) == CUDA_SUCCESS;
  CUcontext made = nullptr;
  if (cu->cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
      cu->cuCtxCreate_v2(&made, 0, dev) != CUDA_SUCCESS) {
    ZC_INFO("push issuer: no context of its own on GPU %d: an earlier rank waits for the later "
            "ones on its own thread",
            device);
    return nullptr;
  }
  // cuCtxCreate made it current here; the caller's context comes back.
  CUcontext popped = nullptr;
  cu->cuCtxPopCurrent(&popped);
  {
    ScopedContext in(made);
    if (!sized || cu->cuMemGetInfo(&free_after, &total) != CUDA_SUCCESS) free_after = free_before;
  }
  g->contexts[device] = made;
  ZC_INFO("push issuer: a context of its own on GPU %d (%.0f MiB of GPU memory): an earlier "
          "rank's pushes to later ranks in other processes are issued from it, and the "
          "all-gather call returns without waiting for them",
          device, (free_before > free_after ? free_before - free_after : 0) / 1048576.0);
  return made;
}

bool push_issuer_available(int device) {
  if (device < 0 || device >= kMaxRanks) return false;
  std::lock_guard<std::mutex> lock(g->mu);
  if (!g->contexts[device] || in_child() || g->exiting) return false;
  if (!g->running) {
    static const bool exit_handler = atexit(at_exit) == 0;
    (void)exit_handler;
    g->running = start_detached_thread(issuer_main, nullptr, "zerocta-push") == 0;
  }
  return g->running;
}

void push_issuer_submit(std::unique_ptr<IssuerJob> job) {
  std::lock_guard<std::mutex> lock(g->mu);
  g->jobs.push_back(std::move(job));
  g->cv.notify_all();
}

void push_issuer_forget(const void* owner) {
  std::deque<std::unique_ptr<IssuerJob>> dropped;
  {
    std::unique_lock<std::mutex> lock(g->mu);
    for (auto it = g->jobs.begin(); it != g->jobs.end();) {
      if ((*it)->owner() == owner) {
        dropped.push_back(std::move(*it));
        it = g->jobs.erase(it);
      } else {
        ++it;
      }
    }
    g->cv.wait(lock, [owner] { return g->busy != owner; });
  }
  // Destroyed outside the lock: a job's destructor may log.
}

int push_issuer_jobs() {
  std::lock_guard<std::mutex> lock(g->mu);
  return static_cast<int>(g->jobs.size());
}

}  // namespace zc
