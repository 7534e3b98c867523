// What every routed collective of a communicator (allgather/, reduce_scatter/) does alike
// around its own protocol: whether an op may start on the route, how a failure poisons the
// communicator, what the ranks' posts say when they disagree, and the capture mode in which the
// route's host work runs during an application's capture.
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <cstddef>
#include <memory>

#include "comm_state.h"

namespace zc {

// Whether an op cannot start on the route, before it reaches any peer (*result: its error): the
// communicator failed (here, at a peer, or a peer aborted it), it was never prepared, or this
// rank's context failed (not asked in a capture). `name` names the collective in the log.
bool routed_op_refused(CommState& st, bool capturing, const char* name, ncclResult_t* result);

// A failure after the op was posted: logs why, poisons the communicator (its peers learn it
// through the channel and their waits on this rank are released) and returns `code`.
ncclResult_t routed_op_fail(CommState& st, const char* name, ncclResult_t code, const char* what,
                            const char* why);

// The error a kernel left in this rank's context (a device-side assert, as PyTorch's NaN check
// raises), or CUDA_SUCCESS. NCCL's kernel launch returns it at once; copies and stream memory
// operations do not, so the route asks its own push stream (never in a capture; a query costs
// about what a launch does) and fails the op as NCCL's launch would.
CUresult route_context_error(const CeComm& ce);

// Why the ranks disagree on op `a.seq`, with the numbers of a call-chain difference written
// into `buf` (the exchange's reasons are static text).
const char* mismatch_detail(const Arrival& a, const OpPost& mine, const OpPost* earlier, char* buf,
                            size_t len);

// Poisons the communicator when one of its graphs replayed an op whose peer graph is gone
// (captured_ops.h). Host-only: any thread, a watchdog's poll included.
void check_captured_replays(CommState& st);

// The thread's capture mode relaxed for a scope, when `on`: the route's imports, mappings and
// streams made during an application's capture (PyTorch captures in global mode, where they
// would invalidate it).
class RelaxedCapture {
 public:
  explicit RelaxedCapture(bool on);
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  bool on_;
  CUstreamCaptureMode mode_ = CU_STREAM_CAPTURE_MODE_RELAXED;
};

// The streams and events of the communicator's captured ops (CeComm::capture_streams), made at
// its first (in relaxed capture mode); false when CUDA refuses one.
bool make_capture_streams(const CudaDriver& cu, CeComm* ce);

// A flag block claimed for a captured op goes back unless the op's graph keeps it (its hold).
class BlockClaim {
 public:
  BlockClaim(CaptureBlocks& blocks, uint32_t me, CaptureRef ref)
      : blocks_(blocks), me_(me), ref_(ref) {}
  ~BlockClaim() {
    if (ref_.valid()) blocks_.drop(me_, ref_);
  }
  CaptureRef ref() const { return ref_; }
  void handed_over() { ref_ = CaptureRef{}; }
  BlockClaim(const BlockClaim&) = delete;
  BlockClaim& operator=(const BlockClaim&) = delete;

 private:
  CaptureBlocks& blocks_;
  uint32_t me_;
  CaptureRef ref_;
};

// A captured op's hold on what its graph replays (captured_ops.h), taking over the block its
// post claimed (`claim`); null with *why where the post has none (the driver cannot capture, or
// every block is held by a live graph).
std::unique_ptr<GraphHold> new_graph_hold(const CommState& st, uint64_t seq, BlockClaim& claim,
                                          const char** why);

// This rank is done with op `seq`'s posts, whatever happens after it arrived (where a job of
// the push issuer reads them later, PostsRead waits for it too).
class FinishPosts {
 public:
  FinishPosts(CeComm& ce, uint32_t me, uint64_t seq) : ce_(ce), me_(me), seq_(seq) {}
  ~FinishPosts() { ce_.posts_read.op_done(*ce_.ops, me_, seq_); }
  FinishPosts(const FinishPosts&) = delete;
  FinishPosts& operator=(const FinishPosts&) = delete;

 private:
  CeComm& ce_;
  uint32_t me_;
  uint64_t seq_;
};

}  // namespace zc
