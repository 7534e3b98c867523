// What zerocta knows about one communicator, and the registry that maps NCCL's handles to it.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ce_plan.h"
#include "cuda_driver.h"

namespace zc {

// The copy-engine resources of one communicator: its arena (an NCCL symmetric window) and
// the internal streams and events the plan runs on. Exists only once every rank agreed.
struct CeComm {
  ArenaLayout layout;
  RankView view;
  void* arena = nullptr;  // ncclMemAlloc'ed, registered as `window`
  ncclWindow_t window = nullptr;
  // Index 0 unused (the user's stream), then copy-in, pull, local (PlanStream order).
  CUstream streams[kPlanStreams] = {};
  CUevent events[kPlanEvents] = {};
  uint64_t slot_cursor = 0;  // running slot counter, identical on every rank
  // Captured ops: their own streams, events and slot range (a graph replay must never share
  // a flag with an eager op in flight).
  CUstream capture_streams[kPlanStreams] = {};
  CUevent capture_events[kPlanEvents] = {};
  uint64_t capture_cursor = 0;
  std::vector<PlanOp> plan;  // reused buffer for building plans
};

struct CommState;

// Non-blocking communicators are set up when the application first sees them ready (see
// nonblocking_setup.h). Communicators created together by one thread (one group) share one
// of these, because their set-up collectives must be grouped too.
struct PendingSetup {
  std::mutex mu;      // held by the thread running the set-up
  bool done = false;  // under mu
  std::vector<std::weak_ptr<CommState>> comms;
};

struct AppWindow {
  uintptr_t base, size;
  ncclWindow_t win;
};

struct CommState {
  ncclComm_t comm = nullptr;
  int rank = -1, nranks = 0, device = -1;
  bool zero_policy = false;  // NCCL_CTA_POLICY_ZERO was requested for it
  bool nonblocking = false;
  std::atomic<bool> ce_ready{false};
  const char* ce_missing = "copy-engine pool not set up";
  std::unique_ptr<CeComm> ce;
  // Serialises issuing on this comm (NCCL forbids concurrent use of one comm anyway; this
  // only protects our own state against misuse) and the teardown.
  std::mutex issue_mu;
  // First error after a route was fixed: the communicator is poisoned and every later call
  // returns it, as NCCL does with an asynchronous error.
  std::atomic<int> poisoned{ncclSuccess};
  // Non-blocking comms whose pool is not set up yet: `setup_pending` is the cheap check,
  // `pending` (under pending_mu) what to run.
  std::atomic<bool> setup_pending{false};
  std::mutex pending_mu;
  std::shared_ptr<PendingSetup> pending;
  std::mutex windows_mu;
  std::vector<AppWindow> app_windows;
  std::atomic<bool> has_app_windows{false};
  // NCCL 2.28's CE path fails on the legacy default stream; ops that may take it are moved
  // to this stream, ordered with the caller's by events (created on first need).
  CUstream side_stream = nullptr;
  CUevent side_events[2] = {};
};

std::shared_ptr<CommState> comm_lookup(ncclComm_t comm);
std::shared_ptr<CommState> comm_add(ncclComm_t comm);
std::shared_ptr<CommState> comm_remove(ncclComm_t comm);

}  // namespace zc
