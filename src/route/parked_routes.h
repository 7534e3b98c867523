// What a torn-down route leaves behind while work it queued may still run.
//
// A teardown (Destroy, Finalize, Abort, Revoke, a failed init) never waits for the route's
// streams: their queued copies can sit behind an event of the application's stream, and that
// stream behind a kernel that never ends (another communicator's collective whose peer is gone,
// the hang an abort exists to break). So the teardown records an event on each of its streams
// and, when one has not passed yet, parks what those streams still address — the channel's
// registered flags, the peers' imported buffers, the exchange (all owned by the communicator's
// CaptureLife) — instead of freeing it. Parked leftovers are freed at a later safe point once
// every event passed, and until then their flags are released again now and then (host stores),
// since a stream's queued write of an older op number may overwrite the release and hold a wait
// that was queued behind it.
#pragma once

#include <cuda.h>

#include <memory>

namespace zc {

class CaptureLife;
class OpExchange;

// Frees `life` now if the work queued so far on `streams` (n of them; null entries skipped) has
// run, else parks it. events[k] is recorded on streams[k] to tell (the route's own events, free
// once it is torn down): taken over and set to null. `recorded`: one more event, recorded already
// (on the push issuer's stream, in its own context), taken over too (null: none). `ops`: the
// exchange `life` owns, whose flags are released again while parked (null: none). Makes no
// blocking CUDA call.
void free_when_drained(std::shared_ptr<CaptureLife> life, const CUstream* streams, CUevent* events,
                       int n, CUevent recorded, int device, OpExchange* ops, uint64_t seq);

// On an application thread: frees the parked leftovers whose streams have drained.
void collect_drained_routes();

// Any thread, host stores only: releases the flags of every parked route again.
void release_parked_flags();

// How many routes are parked (tests, stats).
int parked_routes();

}  // namespace zc
