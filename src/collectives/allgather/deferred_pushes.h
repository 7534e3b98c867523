// An eager all-gather's pushes into ranks in other processes: handed to the push issuer
// (push_issuer.h) when this rank's call returns, issued by it at once where this rank arrived
// later, else as each later rank claims its pair. The op's plan (direct_plan.h) marks those peers `deferred`: this
// rank's push stream waits for the job's `pushed` flag before it tells them done.
#pragma once

#include <cstdint>
#include <memory>

#include "comm_state.h"
#include "direct_plan.h"
#include "op_exchange.h"

namespace zc {

// Whether this rank's pushes of eager ops can be deferred on this communicator now: its route
// has the issuer's stream (made at prepare) and the issuer runs.
bool can_defer_pushes(const CommState& st);

// Hands op `seq`'s pushes to the peers marked deferred in `view` to the push issuer; `st` the
// communicator (kept alive by the job), `before` the ranks that arrived before this one (their
// pairs this rank settled "each pushes" itself; the others it waits to see claimed), `mine`
// this rank's post (what a later rank's post must match). The job finishes this rank's reading
// of the op's posts (PostsRead).
void defer_pushes(std::shared_ptr<CommState> st, uint64_t seq, uint64_t before,
                  const OpPost& mine, const DirectOpView& view);

}  // namespace zc
