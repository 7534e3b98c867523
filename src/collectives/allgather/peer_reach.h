// How an all-gather of this rank reaches its peers' buffers, and when a wait for a peer ends:
// shared by the op on the application's thread (ce_allgather.cc) and its pushes the push
// issuer completes later (deferred_pushes.h).
#pragma once

#include <cstdint>

#include "captured_ops.h"
#include "comm_state.h"
#include "direct_plan.h"
#include "op_exchange.h"

namespace zc {

// Peer p's buffer range [addr, addr + bytes) inside `buf` of its post for op `seq`, as this
// process addresses it: by address in its process, else imported. `hold`: a captured op's,
// which pins the views it uses (null for eager ops).
bool reach(CommState& st, int p, uint64_t seq, const OpPost& post, const OpBuffer& buf,
           uint64_t addr, uint64_t bytes, GraphHold* hold, Span* out, const char** why);

// Whether peer p runs in this process.
bool same_process(const CommState& st, int p);

// Whether a wait of an op for a peer must end: the communicator is poisoned here or by a
// peer, or a rank left it (aborted or revoked): nothing it has not yet done will come.
bool peer_failed(const CommState& st);

}  // namespace zc
