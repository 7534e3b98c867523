// Reaching the applications' own buffers across ranks, for the zero-copy all-gather.
//
//   describe   what a rank posts about one of its buffers (op_exchange.h): its address, for
//              the GPUs of its own process, and the physical allocations it lies in, exported
//              as POSIX file descriptors (or FABRIC handles' bytes) kept in this process's fd
//              service (fd_exchange.h), for the other processes.
//   resolve    the other side: a peer's buffer range as a span of this process's address space.
//              In the peer's process, its address (peer access enabled once per pair of
//              devices); elsewhere, its allocations imported, cached by (process, block id) — a
//              block id names one physical allocation for the life of its process, so an
//              address the peer's allocator reuses never hits a stale entry — and mapped whole,
//              back to back as they lie in the peer's address space.
//
// Which memory can be reached how:
//   cudaMalloc memory   by address in its process; not across processes (legacy IPC would need
//                       a release protocol: the exporter may free while a peer still maps it).
//   cuMem memory        by address in its process when cuMemGetAccess grants the peer's device;
//                       across processes when its allocation allows POSIX fds (PyTorch's
//                       expandable segments do) or FABRIC handles (what they may allow alone on
//                       an IMEX node; fd preferred where both are). An import keeps the exporter's
//                       memory alive until it is unmapped, even after the exporter freed it, and so
//                       does an export (the fd service's duplicate of its descriptor): both go
//                       within two housekeeping periods of the free (housekeeping.h), with no NCCL
//                       call; the imports are bounded (kPeerHeldBudget), and `held_bytes` (and the
//                       stats' pool_bytes and peer_held_bytes gauges) report what this rank
//                       holds of its peers. Descriptors are bounded too (fd_headroom.h).
//   anything else       (host, managed, stream-ordered pools): not reachable; the op then goes
//                       to NCCL when this rank decides it (op_exchange.h).
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda_driver.h"
#include "direct_plan.h"
#include "op_exchange.h"
#include "unmap_queue.h"

namespace zc {

// The peers' memory one communicator keeps mapped before it releases the least recently used
// imports (once the ops that used them finished): an import keeps memory alive that its owner
// may have freed. Stated in the stats (peer_held_budget_bytes) and the housekeeping's INFO line.
constexpr uint64_t kPeerHeldBudget = uint64_t{16} << 30;

// Who must be able to reach a rank's buffers.
struct ReachNeeds {
  bool by_pointer = false;  // a peer in this process
  bool by_extents = false;  // a peer in another process
  int peer_devices[kMaxRanks] = {};
  int npeer_devices = 0;  // the devices of the peers in this process
};

// Fills `out` for [addr, addr + bytes) and returns whether every peer that needs it can reach
// it. Call on the application's thread with the buffer's device current.
bool describe_buffer(const CudaDriver& cu, uint64_t addr, uint64_t bytes, const ReachNeeds& needs,
                     OpBuffer* out);
// The same for [addr, addr + bytes) lying inside `outer`, described by describe_buffer in this
// op (an in-place all-gather's send chunk inside its receive buffer): its extents are those of
// `outer` that it touches, with no driver query of their own. A buffer outside `outer` is
// described afresh.
bool describe_inside(const CudaDriver& cu, uint64_t addr, uint64_t bytes, const ReachNeeds& needs,
                     const OpBuffer& outer, OpBuffer* out);

// Exported allocations: withdraws the fd-service entries of allocations no longer mapped where
// they were (freed by the application): one driver query per export, made with no lock held
// (the housekeeping thread calls it every period, housekeeping.h; the application's thread now
// and then). An export keeps its allocation alive, so they must not outlive their use.
// Exports are bounded by the descriptors the process may open (fd_headroom.h): one that would
// pass the bound is not made, and the buffer across it is unreachable for that op.
void sweep_exports(const CudaDriver& cu);
// Exports the stage allocated at `addr` (stage_buffer.h) now, with what is left of the
// descriptors' reserve if need be (fd_headroom.h): a rank stages only once an op's verdict sent
// it to the copy engines, and its later peers then cannot do without its stage.
bool export_stage(const CudaDriver& cu, uint64_t addr);
// Withdraws every export: when no communicator of this process can post them any more (they
// are made again on demand). The peers' imports hold references of their own.
void withdraw_all_exports();

// When the copies of one op that touched a peer's buffers have finished: the flag this rank's
// push stream writes after them (done[p][me] = the op's number, direct_plan.h). Flags only
// grow, so a later op's value means this one finished too.
struct DoneMark {
  const uint32_t* flag = nullptr;  // host memory the device writes; null: nothing to wait for
  uint32_t value = 0;
  // Whether the op has finished (flags compare as wrapping counters).
  bool passed() const {
    return !flag || static_cast<int32_t>(__atomic_load_n(flag, __ATOMIC_ACQUIRE) - value) >= 0;
  }
};

// A graph's hold on a view (captured_ops.h): while the count is above zero the view stays
// mapped, whatever its owner freed or the budget says. Decremented by the graph's destruction
// (an atomic store, no CUDA call).
using ViewPin = std::shared_ptr<std::atomic<int>>;

// One communicator's imports of its peers' allocations, on `device`. An allocation is imported
// once (cached by process and block id); the runs of consecutive allocations that ops touch are
// mapped back to back ("views"), so a buffer its owner laid across several allocations (PyTorch's
// expandable segments: 20 MiB each) is one range here and one copy per peer, not one per
// allocation. A view goes when the last op that used it has finished and one of its allocations
// was freed by its owner, or when there are too many views; an import goes when no view maps it
// and either its owner no longer exports it (it freed it: keeping the import would keep the
// memory alive, out of its allocator's sight) or the imports hold more than their budget (least
// recently used first). A view that goes is unmapped a few allocations an op (unmap_queue.h),
// and, below a bound on the freed memory held, only while this rank's copies are not running:
// releasing while they ran slowed them (4xH200, 1 GiB in place: the ten ops during which the
// previous size's freed buffers went ran 2.9-3.1 ms against 2.08; never releasing, 1.00x NCCL
// CE's copy-engine path; docs/PERFORMANCE.md, "Three and four GPUs").
//
// Every public call takes the object's lock. The housekeeping thread (housekeeping.h) also
// releases what may go — imports whose owner freed them, views no op uses — without any NCCL
// call: it takes the lock only with try_lock and only for bookkeeping (owner_queries,
// take_releasable), and makes its socket and driver calls (release) with no lock held, so the
// application's thread never waits behind a driver call of its.
class PeerImports {
 public:
  explicit PeerImports(int device);  // registered with the housekeeping thread
  ~PeerImports();  // releases every mapping: the caller made sure nothing uses them any more
  PeerImports(const PeerImports&) = delete;
  PeerImports& operator=(const PeerImports&) = delete;

  // One owner's question for the housekeeping thread: which of `tokens` (the imports of
  // `block_ids` from process `pid`, whose fd service is at `address`) it still exports.
  struct OwnerQuery {
    int pid = 0;
    std::string address;
    std::vector<uint64_t> tokens, block_ids;
    std::vector<bool> published;  // the answer
    bool answered = false;
  };
  // What the housekeeping thread unmaps and releases, out of any PeerImports: views no op uses
  // any more, then the imports that only they mapped.
  struct Release {
    int device = -1;
    std::vector<UnmapQueue::View> views;
    std::vector<CUmemGenericAllocationHandle> handles;
    bool empty() const { return views.empty() && handles.empty(); }
  };

  // [addr, addr + bytes) of the peer's buffer `buf` (posted by process `pid` whose fd service
  // is at `fd_address`) as one span here, for op `seq` whose copies end with `done`; false with
  // *why when it cannot be mapped. `pin` (captured ops): the view is pinned, *pin holds it.
  bool resolve(const CudaDriver& cu, const OpBuffer& buf, int pid, const char* fd_address,
               uint64_t addr, uint64_t bytes, uint64_t seq, DoneMark done, Span* out,
               const char** why, ViewPin* pin = nullptr);
  // After an op: takes out of use what may go (see the class comment), and releases it, a few
  // driver calls' worth (peer_memory.cc, kReleaseCallsPerOp), only past a bound.
  // `ask_owners`: first ask each owner's fd service which allocations it still exports (a
  // socket round trip per owner process).
  void tidy(const CudaDriver& cu, bool ask_owners, uint64_t budget);
  // Before an op: the same few calls' worth of releases, if every earlier op's copies have
  // finished (told by their `done` flags; no CUDA call).
  void release_while_idle(const CudaDriver& cu, uint64_t budget);
  // Releases every view no live graph pins and whose ops have finished, and the imports no
  // view maps any more (a suspended communicator), all at once.
  void release_idle(const CudaDriver& cu);
  uint64_t held_bytes();
  int device() const { return device_; }
  // From now on no view is unmapped before this object is destroyed: the communicator failed
  // and its flags were released (op_exchange.h, release_all), so a view's done flag no longer
  // says its copies finished — copies queued on the route's streams and the push issuer's may
  // still run into it. Destruction waits for those streams (parked_routes.h). Call before
  // releasing the flags; lock-free (any thread, any lock held).
  void freeze() { frozen_.store(true, std::memory_order_seq_cst); }

  // Housekeeping, from its thread (housekeeping.h); both only try the lock and return false
  // when the application's thread holds it. The questions to ask each owner (imports it has
  // not been found to free yet).
  bool owner_queries(std::vector<OwnerQuery>* out);
  // With the answers (if any): marks what the owners freed; then, when this rank's copies are
  // idle (or the freed memory held passes kFreedHeldWhileBusy, peer_memory.cc), takes out into
  // *out views waiting to be unmapped and freed imports no view maps any more, about
  // `max_calls` driver calls' worth (a whole view at least): the thread checks between such
  // steps that the copies are still idle, as unmapping slows the copies in flight.
  bool take_releasable(const std::vector<OwnerQuery>& answers, size_t max_calls, Release* out);
  // Unmaps and releases what take_releasable took out; no lock of any PeerImports.
  static void release(const CudaDriver& cu, Release* r);

 private:
  using Key = std::pair<int, uint64_t>;  // (pid, block id)
  struct Import {
    CUmemGenericAllocationHandle handle = 0;
    uint64_t bytes = 0;
    uint64_t token = 0;     // the owner's fd-service token for the allocation
    uint64_t last_seq = 0;  // the last op that used it
    int views = 0;          // views that map it
    bool freed = false;     // its owner no longer exports it
  };
  struct View {
    int pid = 0;
    uint64_t peer_base = 0, bytes = 0;  // the run in its owner's address space
    CUdeviceptr va = 0;                 // ... and here
    std::vector<uint64_t> blocks;       // block ids, in address order
    std::vector<uint64_t> sizes;        // their bytes
    uint64_t last_seq = 0;
    DoneMark done;  // when the last eager op that used it finished
    ViewPin pins;   // graphs holding it (null: none ever did)
    bool idle() const { return done.passed() && (!pins || pins->load() == 0); }
  };
  bool import_missing(const CudaDriver& cu, const OpBuffer& buf, uint32_t first, uint32_t last,
                      int pid, const char* fd_address, const char** why);
  bool import_descriptors(const CudaDriver& cu, const std::vector<const OpExtent*>& wanted, int pid,
                          const char* fd_address, const char** why);
  bool import_blobs(const CudaDriver& cu, const std::vector<const OpExtent*>& wanted, int pid,
                    const char* fd_address, const char** why);
  void keep_import(int pid, const OpExtent& e, CUmemGenericAllocationHandle h);
  View* find_view(const OpBuffer& buf, uint32_t first, uint32_t last, int pid);
  View* map_view(const CudaDriver& cu, const OpBuffer& buf, uint32_t first, uint32_t last, int pid,
                 const char** why);
  void queries_locked(std::vector<OwnerQuery>* out) const;
  void apply_answers(const std::vector<OwnerQuery>& answers);
  void mark_freed();
  void retire_freed();
  bool copies_idle() const;
  // Whether view `v` may go: its ops finished (read first: a released flag is seen only with
  // the freeze before it) and the communicator has not failed.
  bool may_go(const View& v) const {
    return v.idle() && !frozen_.load(std::memory_order_seq_cst);
  }
  // Takes view i out of use and queues its unmapping; its imports count it until it is done.
  void retire_view(size_t i);
  size_t drain_unmaps(const CudaDriver& cu, size_t max_calls);
  void release_some(const CudaDriver& cu, uint64_t budget);
  void release_import(const CudaDriver& cu, std::map<Key, Import>::iterator it);
  // Takes an import out of the books (its bytes, its freed mark); its handle is the caller's.
  CUmemGenericAllocationHandle forget_import(std::map<Key, Import>::iterator it);
  const int device_;
  uint64_t housekeeping_id_ = 0;  // its entry in the housekeeping thread's list
  std::atomic<bool> frozen_{false};
  std::mutex mu_;                 // guards everything below
  uint64_t held_ = 0;
  size_t freed_ = 0;         // imports whose owner freed them, still held
  uint64_t freed_held_ = 0;  // ... and their bytes
  std::map<Key, Import> imports_;
  std::vector<View> views_;
  UnmapQueue unmapping_;
  std::map<int, std::string> owners_;  // pid -> its fd service's address
};

// The cuMem allocation mapped at `p` in this process: its mapping's base and size and its block
// id (never reused in a process). False for any other memory.
struct MappedBlock {
  uint64_t base = 0, bytes = 0, id = 0;
};
bool mapped_block_at(const CudaDriver& cu, uint64_t p, MappedBlock* out);

// Lets `device`'s context reach cudaMalloc memory of `peer_device` by address. Tolerates
// "already enabled" (NCCL enables it too).
bool enable_peer_access(const CudaDriver& cu, int device, int peer_device);

}  // namespace zc
