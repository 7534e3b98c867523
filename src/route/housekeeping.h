// The housekeeping thread: what the route must do on time whether or not the application calls
// NCCL again — give back the memory of allocations the application freed. An export (the fd
// service's duplicate of its descriptor) and a peer's import both keep an allocation alive
// after its owner freed it (peer_memory.h); without this thread they went only around later
// routed all-gathers, so after PyTorch's empty_cache(), an OOM retry, or an evaluation or
// checkpoint phase without all-gathers, that memory never came back.
//
// One detached thread per process, "zerocta-hk", started at the first export or import of a
// communicator that committed to the route and prepared it (never in the default mode, nor in a
// process whose ranks all live in it), told to stop when the last route communicator of the
// process ends. Every kHousekeepingTickMs it
//   1. withdraws the exports of allocations no longer mapped where they were (one driver query
//      per export, sweep_exports);
//   2. asks each owner's fd service which of the allocations imported from it it still exports
//      (a status request, no descriptor) and, of each communicator whose copies are idle (their
//      `done` flags in host memory: every op that used a view has finished), takes out the views
//      over freed allocations and the imports only they mapped, and unmaps and releases them,
//      a few driver calls at a time, checking between them that the copies are still idle.
// So an allocation a rank frees is no longer held by any export or import anywhere within two
// ticks of the free, with no NCCL call; the application's threads still release at their routed
// ops as before (the tick only comes sooner in an idle phase).
//
// Why its driver calls are safe beside the application's threads (a helper thread's CUDA call
// once waited for the driver lock held by an application thread's lazy module load, whose
// module load waited for GPU work that waited for that helper):
//   - nothing waits for it: no stream, no flag, no application thread depends on a tick; it may
//     block in the driver as long as the driver likes;
//   - it holds no lock of the route while inside a driver call or a socket call: a
//     communicator's imports it takes only with try_lock, for bookkeeping (skipped till the next
//     tick when the application holds them), and it unmaps what it took out with no lock held;
//     the exports' lock it holds for bookkeeping only too (sweep_exports);
//   - its capture mode is relaxed, so a call of its never invalidates an application's capture
//     in global mode (PyTorch's);
//   - the contexts it makes current were retained by the route's preparation (ScopedDevice):
//     no context is created under a lock on its behalf.
// The fd service's thread still makes no CUDA call (fd_exchange.h).
//
// Stop, teardown, exit, fork: stopping sets a generation and notifies; the thread is detached
// and nobody joins or waits for it (a teardown never waits on a peer or a stream through it).
// An at-exit handler (registered at the first start, so it runs before the driver's own, which
// were registered earlier) tells it to make no further driver call and waits for the one in
// progress at most kHousekeepingExitWaitMs. In a child forked after it started it does not
// exist, and it never starts there (the child has no fd service either).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zc {

class PeerImports;

// One tick: long enough that a tick's driver calls are a negligible share of a core, short
// enough that two (the owner's withdrawal, then the importer's release) fit well within the
// second this thread promises.
constexpr int kHousekeepingTickMs = 200;
// How long an owner's fd service may take to answer the thread's status request.
constexpr int kHousekeepingAskMs = 100;
// Driver calls (cuMemUnmap, cuMemRelease: ~100 us of host time each) between two checks that a
// communicator's copies are still idle: unmapping slows copies in flight (peer_memory.h), so
// an op that starts meanwhile meets at most this many (or one view).
constexpr size_t kHousekeepingCallsPerStep = 8;
// How long the at-exit handler waits for a driver call of the thread in progress.
constexpr int kHousekeepingExitWaitMs = 200;

// Starts the thread unless it runs, the process is a forked child, or no communicator's imports
// are registered (no route prepared: a unit test describing buffers). Cheap; any thread.
void housekeeping_start();
// Tells the thread to end after its current tick (the last route communicator ended).
void housekeeping_stop();
// A communicator's imports, tended every tick from now on; returns its entry's id.
uint64_t housekeeping_add(PeerImports* imports);
// Before they go: the thread never touches them after this returns (it waits at most for the
// thread's bookkeeping, never for a driver or socket call).
void housekeeping_remove(uint64_t id);

}  // namespace zc
