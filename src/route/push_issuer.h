// The push issuer: a thread of this process that issues, for the application's threads, the
// copies that can start only once a peer in another process arrives, so that an all-gather
// call returns after its own host work whenever its peers come (docs/ARCHITECTURE.md, "The
// caller never waits for a peer").
//
// An eager op's earlier rank cannot push its chunk into a later rank's receive buffer before
// that rank has posted where the buffer is. It used to wait for it on the application's thread
// (58-800 us median a call under FSDP2, 2.9 ms p90). Now it hands the pushes over as a job and
// returns; its push stream waits on the device for the flag the job writes after them
// (direct_plan.h, "issuer"). The thread polls its jobs (host memory only) and issues each
// job's copies on a stream of the job's communicator as the peers claim. (A build with
// -DZC_LATER_PUSHES_BY_ISSUER=1 hands over a later rank's pushes too, settled already: issuing a
// copy into a view of a peer's many allocations, and reaching it, are most of such a call's
// host time; not measured on GPUs yet.)
//
// It issues from a context of its own per GPU (cuCtxCreate), never the primary one: a stream
// of the primary context that waits on the device for the job (the application's stream, behind
// the op) can hold a lazy module load of the application's thread, which holds the driver's
// locks while it waits for the device, and a copy issued meanwhile in the same context waits for
// those locks: a deadlock (tests/gpu/probes/helper_issue_probe.cu). From a context of its own the
// same copy and the imports a first push needs were issued in 0.08 ms and 0.44 ms during such
// a load, pushes run at the same 392 GB/s, beside an SM-bound loop at the same speed, and the
// hand-over adds 4 us an op (2xH200, tests/gpu/probes/own_context_probe.cu,
// docs/plots/lifecycle-2xH200/own-context-probe.txt). The context costs GPU memory (524 MiB on
// an H200), made once per GPU at the first communicator that needs it and kept to the process's
// end; the INFO line says what it took. Where it cannot be made, the earlier rank waits as
// before (pair_wait.h).
//
// Locking: the issuer's mutex guards the job list; a job runs its steps with no lock of the
// issuer held, and never takes a communicator's locks (its failure is reported after the step,
// with the job already out of the list). forget() waits only for a step in progress (host work:
// reads of shared memory, imports, a few driver calls).
#pragma once

#include <cuda.h>

#include <memory>

namespace zc {

// What a job does; the issuer calls step() on its thread with the job's context current.
class IssuerJob {
 public:
  enum class Step { kPending, kDone, kFailed };
  virtual ~IssuerJob() = default;
  // Issues what has become possible; never waits.
  virtual Step step() = 0;
  // After kFailed, outside the issuer's lock: tells the communicator.
  virtual void fail() = 0;
  // The communicator it belongs to (forget's key).
  virtual const void* owner() const = 0;
  virtual int device() const = 0;
};

// The issuer's own context on `device`, made on first use (nullptr when it cannot be: no
// driver support, out of memory, a forked child). Called on an application's thread while a
// route is prepared.
CUcontext push_issuer_context(int device);

// Whether jobs on `device` can be handed over now: its context exists and the thread runs
// (started here on first use). Asked before an op is built to defer its pushes.
bool push_issuer_available(int device);

// Hands a job to the issuer thread (after push_issuer_available said yes). Never waits.
void push_issuer_submit(std::unique_ptr<IssuerJob> job);

// Drops the jobs of `owner` and returns once no step of theirs runs: before a communicator's
// route is released.
void push_issuer_forget(const void* owner);

// Jobs not finished yet (tests, stats).
int push_issuer_jobs();

}  // namespace zc
