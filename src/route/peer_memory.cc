#include "peer_memory.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "fd_exchange.h"
#include "fd_headroom.h"
#include "housekeeping.h"
#include "route_memory.h"
#include "stats.h"

namespace zc {
namespace {

constexpr int kFdTimeoutMs = 5000;
// Asking an owner which allocations it still exports is housekeeping on the application's
// thread: it gives up soon and tries again later.
constexpr int kFdAskTimeoutMs = 50;
// Views (runs of a peer's allocations mapped back to back) a communicator keeps: one per buffer
// its ops use, so a program that cycles through more buffers than this remaps some each time.
constexpr size_t kMaxViews = 64;
// Driver calls (cuMemUnmap, cuMemRelease; ~100 us of host time each, driver 580) that releasing
// makes at one op: what the host's lead over its GPU absorbs (unmap_queue.h: what a whole view
// at once cost).
constexpr size_t kReleaseCallsPerOp = 4;
// Peers' freed memory a rank may keep mapped while its own copies run (peer_memory.h:
// releasing slows the copies in flight); above it, the release goes on anyway.
constexpr uint64_t kFreedHeldWhileBusy = uint64_t{512} << 20;

template <typename T>
bool attribute(const CudaDriver& cu, CUpointer_attribute a, uint64_t p, T* out) {
  *out = T{};
  return cu.cuPointerGetAttribute(out, a, static_cast<CUdeviceptr>(p)) == CUDA_SUCCESS;
}

// The physical allocation (cuMem mapping) at `p`.
struct Block {
  uint64_t base = 0, bytes = 0, id = 0;
  bool posix_fd = false;
  bool fabric = false;  // exportable as a FABRIC handle (IMEX nodes; PyTorch may pick only it)
};

// One driver call for the four attributes where the driver has cuPointerGetAttributes: a post
// asks this of every allocation its buffers lie in (PyTorch's expandable segments: one per
// 20 MiB, 80 for an FSDP2 all-gather of 805 MB a rank), and four calls each were most of a
// post's host time (34-42 us median, 2xH200 FSDP2).
bool block_at(const CudaDriver& cu, uint64_t p, Block* b) {
  CUdeviceptr base = 0;
  size_t bytes = 0;
  unsigned long long id = 0;
  uint64_t handle_types = 0;
  if (cu.cuPointerGetAttributes) {
    CUpointer_attribute which[] = {
        CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
        CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES};
    void* into[] = {&base, &bytes, &id, &handle_types};
    if (cu.cuPointerGetAttributes(4, which, into, static_cast<CUdeviceptr>(p)) != CUDA_SUCCESS)
      return false;
  } else if (!attribute(cu, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p, &base) ||
             !attribute(cu, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p, &bytes) ||
             !attribute(cu, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, p, &id)) {
    return false;
  } else {
    attribute(cu, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p, &handle_types);
  }
  if (base == 0 || bytes == 0 || p < base || p - base >= bytes) return false;
  b->base = base;
  b->bytes = bytes;
  b->id = id;
  b->posix_fd = handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  b->fabric = handle_types & CU_MEM_HANDLE_TYPE_FABRIC;
  return true;
}

// This process's exported allocations: block id -> where it is mapped and the fd service's
// token for its descriptor.
struct Exported {
  uint64_t base, bytes, token;
};
std::mutex g_exports_mu;
std::map<uint64_t, Exported>& exports() {
  static auto* m = new std::map<uint64_t, Exported>;
  return *m;
}
uint64_t g_fd_exports = 0;  // of them, descriptors the fd service keeps (guarded by g_exports_mu)

// Forgets export `it` (under g_exports_mu) and withdraws it from the service.
void withdraw_export(FdService* service, std::map<uint64_t, Exported>::iterator it) {
  if (service) service->withdraw(it->second.token);
  if (!(it->second.token & kFdBlobToken)) --g_fd_exports;
  exports().erase(it);
}

// Whether one more descriptor may be kept for an export with at least `floor` free
// (fd_headroom.h); says so once if not.
bool room_for_fd_export(int64_t floor) {
  if (g_fd_exports < fd_export_cap() && fd_headroom() >= floor) return true;
  fd_export_refused(g_fd_exports);
  return false;
}

// The allocation `b` exported (known by its block id after the first time): its token, 0 when it
// cannot be. A descriptor export leaves at least `floor` descriptors free.
uint64_t export_block(const CudaDriver& cu, const Block& b, int64_t floor = kFdOpReserve) {
  std::lock_guard<std::mutex> lock(g_exports_mu);
  auto it = exports().find(b.id);
  if (it != exports().end()) return it->second.token;
  FdService* service = fd_service();
  if (!service || (b.posix_fd && !room_for_fd_export(floor))) return 0;
  CUmemGenericAllocationHandle h = 0;
  if (cu.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(b.base)) != CUDA_SUCCESS) return 0;
  // A descriptor where the allocation has one, else its FABRIC handle's bytes (a blob the
  // importer fetches inline: fd_exchange.h).
  uint64_t token = 0;
  if (b.posix_fd) {
    int fd = -1;
    if (cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
        CUDA_SUCCESS) {
      token = service->publish(fd);
      close(fd);
    }
  } else {
    CUmemFabricHandle fabric{};
    FdBlob blob{};
    static_assert(sizeof fabric == sizeof blob.bytes, "a FABRIC handle is one blob");
    if (cu.cuMemExportToShareableHandle(&fabric, h, CU_MEM_HANDLE_TYPE_FABRIC, 0) ==
        CUDA_SUCCESS) {
      memcpy(blob.bytes, &fabric, sizeof fabric);
      token = service->publish_blob(blob);
    }
  }
  cu.cuMemRelease(h);  // the retain's reference; the application's own stays
  if (!token) return 0;
  exports()[b.id] = Exported{b.base, b.bytes, token};
  if (b.posix_fd) {
    ++g_fd_exports;
    fd_headroom_opened(1);
    fd_export_made();
  }
  housekeeping_start();  // which withdraws it once the application frees the allocation
  return token;
}

// Whether the allocation exported as block `id` at `base` is gone: the address holds another
// allocation, or none (CUDA_ERROR_INVALID_VALUE). Any other failure (no context, a driver
// shutting down) tells nothing, and the export stays.
bool export_freed(const CudaDriver& cu, uint64_t base, uint64_t id) {
  unsigned long long now = 0;
  const CUresult r = cu.cuPointerGetAttribute(&now, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, base);
  return r == CUDA_ERROR_INVALID_VALUE || (r == CUDA_SUCCESS && now != id);
}

// The extent of the allocation at `p`, exported. An allocation exported before is known by its
// block id alone — one driver query, where a new one takes four: a buffer of PyTorch's
// expandable segments lies in one allocation per 20 MiB, and every op describes its buffers.
// Block ids are never reused in a process, so a known id at `p` is that allocation, still
// mapped where it was when it was exported.
bool exported_extent(const CudaDriver& cu, uint64_t p, OpExtent* out) {
  unsigned long long id = 0;
  if (attribute(cu, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, p, &id) && id != 0) {
    std::lock_guard<std::mutex> lock(g_exports_mu);
    auto it = exports().find(id);
    if (it != exports().end() && p >= it->second.base && p - it->second.base < it->second.bytes) {
      *out = OpExtent{it->second.base, it->second.bytes, id, it->second.token};
      return true;
    }
  }
  Block b;
  if (!block_at(cu, p, &b) || !(b.posix_fd || b.fabric)) return false;
  const uint64_t token = export_block(cu, b);
  *out = OpExtent{b.base, b.bytes, b.id, token};
  return token != 0;
}

bool describe_extents(const CudaDriver& cu, uint64_t addr, uint64_t bytes, OpBuffer* out) {
  for (uint64_t p = addr; p < addr + bytes;) {
    if (out->nextents == kMaxExtents || !exported_extent(cu, p, &out->extents[out->nextents]))
      return false;
    const OpExtent& e = out->extents[out->nextents++];
    p = e.base + e.bytes;
  }
  return true;
}

bool pointer_reachable(const CudaDriver& cu, uint64_t addr, const ReachNeeds& needs) {
  unsigned type = 0;
  uint64_t legacy_ipc = 0, managed = 0;  // booleans of the driver's own width: read as nonzero
  if (!attribute(cu, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr, &type) || type != CU_MEMORYTYPE_DEVICE)
    return false;
  attribute(cu, CU_POINTER_ATTRIBUTE_IS_MANAGED, addr, &managed);
  if (managed) return false;
  // cudaMalloc memory: any peer context with peer access enabled reaches it.
  if (attribute(cu, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, addr, &legacy_ipc) &&
      legacy_ipc)
    return true;
  // cuMem memory: only the devices its owner granted access.
  for (int i = 0; i < needs.npeer_devices; ++i) {
    CUmemLocation loc{};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = needs.peer_devices[i];
    unsigned long long flags = 0;
    if (cu.cuMemGetAccess(&flags, &loc, static_cast<CUdeviceptr>(addr)) != CUDA_SUCCESS ||
        flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      return false;
  }
  return true;
}

}  // namespace

bool mapped_block_at(const CudaDriver& cu, uint64_t p, MappedBlock* out) {
  Block b;
  if (!block_at(cu, p, &b)) return false;
  *out = MappedBlock{b.base, b.bytes, b.id};
  return true;
}

bool describe_buffer(const CudaDriver& cu, uint64_t addr, uint64_t bytes, const ReachNeeds& needs,
                     OpBuffer* out) {
  out->addr = addr;
  out->bytes = bytes;
  out->nextents = 0;
  if (needs.by_pointer && !pointer_reachable(cu, addr, needs)) return false;
  if (needs.by_extents && !describe_extents(cu, addr, bytes, out)) return false;
  return true;
}

bool describe_inside(const CudaDriver& cu, uint64_t addr, uint64_t bytes, const ReachNeeds& needs,
                     const OpBuffer& outer, OpBuffer* out) {
  const uint64_t end = addr + bytes;
  if (!needs.by_extents || addr < outer.addr || end > outer.addr + outer.bytes || bytes == 0)
    return describe_buffer(cu, addr, bytes, needs, out);
  out->addr = addr;
  out->bytes = bytes;
  out->nextents = 0;
  if (needs.by_pointer && !pointer_reachable(cu, addr, needs)) return false;
  // outer's extents are its allocations back to back from the one holding outer.addr, each
  // queried in this op: the ones [addr, end) touches are the inner buffer's.
  for (uint32_t i = 0; i < outer.nextents; ++i) {
    const OpExtent& e = outer.extents[i];
    if (e.base + e.bytes <= addr || e.base >= end) continue;
    out->extents[out->nextents++] = e;
  }
  return out->nextents > 0 && out->extents[0].base <= addr &&
         out->extents[out->nextents - 1].base + out->extents[out->nextents - 1].bytes >= end;
}

bool export_stage(const CudaDriver& cu, uint64_t addr) {
  Block b;
  return block_at(cu, addr, &b) && export_block(cu, b, kFdImportSpare) != 0;
}

void sweep_exports(const CudaDriver& cu) {
  // The driver is asked with no lock held: the application's thread takes g_exports_mu to post,
  // and must never wait behind a driver call of the housekeeping thread (housekeeping.h).
  std::vector<std::pair<uint64_t, Exported>> known;
  {
    std::lock_guard<std::mutex> lock(g_exports_mu);
    known.assign(exports().begin(), exports().end());
  }
  std::vector<std::pair<uint64_t, uint64_t>> gone;  // (block id, token)
  for (const auto& [id, e] : known)
    if (export_freed(cu, e.base, id)) gone.emplace_back(id, e.token);
  if (gone.empty()) return;
  std::lock_guard<std::mutex> lock(g_exports_mu);
  FdService* service = fd_service();
  for (const auto& [id, token] : gone) {
    const auto it = exports().find(id);
    if (it != exports().end() && it->second.token == token) withdraw_export(service, it);
  }
}

void withdraw_all_exports() {
  std::lock_guard<std::mutex> lock(g_exports_mu);
  FdService* service = fd_service();
  while (!exports().empty()) withdraw_export(service, exports().begin());
}

PeerImports::PeerImports(int device) : device_(device) {
  stats_peer_held_budget(kPeerHeldBudget);
  housekeeping_id_ = housekeeping_add(this);
}

void PeerImports::keep_import(int pid, const OpExtent& e, CUmemGenericAllocationHandle h) {
  Import& kept = imports_[{pid, e.block_id}];
  kept.handle = h;
  kept.bytes = e.bytes;
  kept.token = e.token;
  held_ += kept.bytes;
  stats_pool_bytes_add(static_cast<int64_t>(kept.bytes));
  stats_peer_held_add(static_cast<int64_t>(kept.bytes));
}

// The allocations of `wanted` exported as descriptors, imported a batch at a time: each batch's
// descriptors are closed once imported, before the next is asked for, so that a process near its
// descriptor limit receives no more than it can hold (fd_headroom.h).
bool PeerImports::import_descriptors(const CudaDriver& cu,
                                     const std::vector<const OpExtent*>& wanted, int pid,
                                     const char* fd_address, const char** why) {
  if (wanted.empty()) return true;
  const int64_t batch = fd_import_batch();
  if (batch == 0) {
    *why = "out of file descriptors (RLIMIT_NOFILE) to import a peer's buffer";
    return false;
  }
  std::vector<uint64_t> tokens;
  for (const OpExtent* e : wanted) tokens.push_back(e->token);
  const char* failed = nullptr;
  auto take = [&](size_t first, const int* fds, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      CUmemGenericAllocationHandle h = 0;
      if (fds[i] < 0)
        failed = failed ? failed : "a peer no longer exports a buffer it posted";
      else if (failed || !import_allocation(cu, fds[i], &h))
        failed = failed ? failed : "could not import a peer's buffer";
      else
        keep_import(pid, *wanted[first + i], h);
      if (fds[i] >= 0) close(fds[i]);  // the handle holds the memory now
    }
    return failed == nullptr;
  };
  if (fd_fetch_batches(fd_address, pid, tokens.data(), tokens.size(), static_cast<size_t>(batch),
                       take, kFdTimeoutMs, why))
    return true;
  if (failed) *why = failed;
  return false;
}

// The allocations of `wanted` exported as FABRIC handles: their bytes in one request (no
// descriptor travels).
bool PeerImports::import_blobs(const CudaDriver& cu, const std::vector<const OpExtent*>& wanted,
                               int pid, const char* fd_address, const char** why) {
  if (wanted.empty()) return true;
  std::vector<uint64_t> tokens;
  for (const OpExtent* e : wanted) tokens.push_back(e->token);
  std::vector<FdBlob> blobs;
  std::vector<bool> found;
  if (!fd_fetch_blobs(fd_address, pid, tokens.data(), tokens.size(), &blobs, &found, kFdTimeoutMs,
                      why))
    return false;
  for (size_t i = 0; i < wanted.size(); ++i) {
    CUmemGenericAllocationHandle h = 0;
    if (!found[i]) {
      *why = "a peer no longer exports a buffer it posted";
      return false;
    }
    if (!import_fabric_allocation(cu, blobs[i].bytes, &h)) {
      *why = "could not import a peer's buffer";
      return false;
    }
    keep_import(pid, *wanted[i], h);
  }
  return true;
}

// Extents [first, last] of `buf` are imported (those not imported yet): descriptors in batches,
// FABRIC handles' bytes in one request.
bool PeerImports::import_missing(const CudaDriver& cu, const OpBuffer& buf, uint32_t first,
                                 uint32_t last, int pid, const char* fd_address, const char** why) {
  std::vector<const OpExtent*> fds, blobs;
  for (uint32_t i = first; i <= last; ++i)
    if (!imports_.count({pid, buf.extents[i].block_id}))
      (buf.extents[i].token & kFdBlobToken ? blobs : fds).push_back(&buf.extents[i]);
  if (fds.empty() && blobs.empty()) return true;
  owners_[pid] = fd_address;
  housekeeping_start();  // which releases the imports once their owner frees them
  const auto started = std::chrono::steady_clock::now();
  const uint64_t held_before = held_;
  const size_t count_before = imports_.size();
  const bool ok = import_descriptors(cu, fds, pid, fd_address, why) &&
                  import_blobs(cu, blobs, pid, fd_address, why);
  const auto took = std::chrono::steady_clock::now() - started;
  stats_peer_mapped(
      imports_.size() - count_before, held_ - held_before,
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(took).count()));
  return ok;
}

// A view of `pid` that maps extents [first, last] of `buf` (the same allocations at the same
// places), or null.
PeerImports::View* PeerImports::find_view(const OpBuffer& buf, uint32_t first, uint32_t last,
                                          int pid) {
  const uint64_t begin = buf.extents[first].base;
  const uint64_t end = buf.extents[last].base + buf.extents[last].bytes;
  for (View& v : views_) {
    if (v.pid != pid || begin < v.peer_base || end > v.peer_base + v.bytes) continue;
    uint64_t at = v.peer_base;
    size_t k = 0;
    while (k < v.blocks.size() && at < begin) at += v.sizes[k++];
    bool same = at == begin;
    for (uint32_t i = first; same && i <= last; ++i, ++k)
      same = k < v.blocks.size() && v.blocks[k] == buf.extents[i].block_id &&
             v.sizes[k] == buf.extents[i].bytes;
    if (same) return &v;
  }
  return nullptr;
}

// Maps extents [first, last] of `buf` (imported) back to back as a new view.
PeerImports::View* PeerImports::map_view(const CudaDriver& cu, const OpBuffer& buf,
                                         uint32_t first, uint32_t last, int pid,
                                         const char** why) {
  View v;
  v.pid = pid;
  v.peer_base = buf.extents[first].base;
  std::vector<CUmemGenericAllocationHandle> handles;
  for (uint32_t i = first; i <= last; ++i) {
    handles.push_back(imports_[{pid, buf.extents[i].block_id}].handle);
    v.blocks.push_back(buf.extents[i].block_id);
    v.sizes.push_back(buf.extents[i].bytes);
    v.bytes += buf.extents[i].bytes;
  }
  if (!map_back_to_back(cu, handles.data(), v.sizes.data(), handles.size(), &device_, 1,
                        &v.va)) {
    *why = "could not map a peer's buffer";
    return nullptr;
  }
  for (uint64_t id : v.blocks) imports_[{pid, id}].views++;
  views_.push_back(std::move(v));
  return &views_.back();
}

bool PeerImports::resolve(const CudaDriver& cu, const OpBuffer& buf, int pid,
                          const char* fd_address, uint64_t addr, uint64_t bytes, uint64_t seq,
                          DoneMark done, Span* out, const char** why, ViewPin* pin) {
  std::lock_guard<std::mutex> lock(mu_);
  if (addr < buf.addr || bytes > buf.bytes || addr - buf.addr > buf.bytes - bytes) {
    *why = "a peer posted a buffer smaller than the op";
    return false;
  }
  // The extents the range touches; a post's extents follow one another in its owner's address
  // space (describe_buffer walks them so), which is checked here all the same.
  const uint32_t n = std::min(buf.nextents, kMaxExtents);
  uint32_t first = 0;
  while (first < n && buf.extents[first].base + buf.extents[first].bytes <= addr) ++first;
  uint32_t last = first;
  while (last + 1 < n && buf.extents[last].base + buf.extents[last].bytes < addr + bytes &&
         buf.extents[last + 1].base == buf.extents[last].base + buf.extents[last].bytes)
    ++last;
  if (first == n || addr < buf.extents[first].base ||
      addr + bytes > buf.extents[last].base + buf.extents[last].bytes) {
    *why = "a peer's buffer extents do not cover the op";
    return false;
  }
  if (!import_missing(cu, buf, first, last, pid, fd_address, why)) return false;
  View* v = find_view(buf, first, last, pid);
  if (!v && !(v = map_view(cu, buf, first, last, pid, why))) return false;
  // The push issuer resolves an op's deferred pushes after the application's thread may have
  // resolved a later op's (deferred_pushes.h): the view keeps the newest op's done mark, whose
  // copies end last (a later op's copies into a peer follow the peer's ready for it, which
  // follows its end, which waits for this op's), and an older op never takes it back.
  const bool newest = !v->done.flag || seq >= v->last_seq;
  v->last_seq = std::max(v->last_seq, seq);
  if (pin) {
    if (!v->pins) v->pins = std::make_shared<std::atomic<int>>(0);
    v->pins->fetch_add(1);
    *pin = v->pins;
  } else if (newest) {
    v->done = done;
  }
  for (uint32_t i = first; i <= last; ++i) {
    uint64_t& used = imports_[{pid, buf.extents[i].block_id}].last_seq;
    used = std::max(used, seq);
  }
  *out = Span{v->va + (addr - v->peer_base), bytes};
  return true;
}

void PeerImports::retire_view(size_t i) {
  View& v = views_[i];
  unmapping_.add(v.va, std::move(v.sizes), v.pid, std::move(v.blocks));
  views_.erase(views_.begin() + static_cast<std::ptrdiff_t>(i));
}

size_t PeerImports::drain_unmaps(const CudaDriver& cu, size_t max_calls) {
  return unmapping_.drain(cu, max_calls, [this](int pid, const std::vector<uint64_t>& blocks) {
    for (uint64_t id : blocks) imports_[{pid, id}].views--;
  });
}

CUmemGenericAllocationHandle PeerImports::forget_import(std::map<Key, Import>::iterator it) {
  if (it->second.freed) {
    --freed_;
    freed_held_ -= it->second.bytes;
  }
  const CUmemGenericAllocationHandle h = it->second.handle;
  held_ -= it->second.bytes;
  stats_pool_bytes_add(-static_cast<int64_t>(it->second.bytes));
  stats_peer_held_add(-static_cast<int64_t>(it->second.bytes));
  stats_peer_unmapped(it->second.bytes);
  imports_.erase(it);
  return h;
}

void PeerImports::release_import(const CudaDriver& cu, std::map<Key, Import>::iterator it) {
  cu.cuMemRelease(forget_import(it));
}

// Takes out of use every view over an allocation its owner freed, once its last op finished;
// release_some unmaps them and then releases the imports, a few calls an op.
void PeerImports::retire_freed() {
  auto over_freed = [&](const View& v) {
    for (uint64_t id : v.blocks)
      if (imports_[{v.pid, id}].freed) return true;
    return false;
  };
  for (size_t i = views_.size(); i-- > 0;)
    if (may_go(views_[i]) && over_freed(views_[i])) retire_view(i);
}

// For each owner, the tokens of the imports not known to be freed yet.
void PeerImports::queries_locked(std::vector<OwnerQuery>* out) const {
  for (const auto& [pid, address] : owners_) {
    OwnerQuery q;
    q.pid = pid;
    q.address = address;
    for (auto it = imports_.lower_bound({pid, 0}); it != imports_.end() && it->first.first == pid;
         ++it)
      if (!it->second.freed) {
        q.tokens.push_back(it->second.token);
        q.block_ids.push_back(it->first.second);
      }
    if (!q.tokens.empty()) out->push_back(std::move(q));
  }
}

// Marks the imports an owner answered it no longer exports. An owner that did not answer (its
// process is gone, or busy past the time limit) leaves its imports as they are; an import made
// again since the question (another token) is not the one asked about.
void PeerImports::apply_answers(const std::vector<OwnerQuery>& answers) {
  for (const OwnerQuery& q : answers) {
    if (!q.answered) continue;
    for (size_t i = 0; i < q.tokens.size(); ++i) {
      const auto it = imports_.find({q.pid, q.block_ids[i]});
      if (q.published[i] || it == imports_.end() || it->second.token != q.tokens[i] ||
          it->second.freed)
        continue;
      it->second.freed = true;
      ++freed_;
      freed_held_ += it->second.bytes;
    }
  }
}

// Asks every owner which of our imports' allocations it still exports, on the application's
// thread (a socket round trip per owner, kFdAskTimeoutMs at most).
void PeerImports::mark_freed() {
  std::vector<OwnerQuery> queries;
  queries_locked(&queries);
  for (OwnerQuery& q : queries)
    q.answered = fd_published(q.address.c_str(), q.pid, q.tokens.data(), q.tokens.size(),
                              &q.published, kFdAskTimeoutMs, nullptr);
  apply_answers(queries);
}

bool PeerImports::copies_idle() const {
  for (const View& v : views_)
    if (!v.done.passed()) return false;
  return !frozen_.load(std::memory_order_seq_cst);
}

void PeerImports::tidy(const CudaDriver& cu, bool ask_owners, uint64_t budget) {
  std::lock_guard<std::mutex> lock(mu_);
  // Called after every op: it walks its views and imports only when an owner freed some of
  // them (until they are gone), a bound is exceeded or views wait to be unmapped.
  if (ask_owners) mark_freed();
  if (freed_ > 0) retire_freed();
  while (views_.size() > kMaxViews) {
    size_t oldest = views_.size();
    for (size_t i = 0; i < views_.size(); ++i)
      if (may_go(views_[i]) &&
          (oldest == views_.size() || views_[i].last_seq < views_[oldest].last_seq))
        oldest = i;
    if (oldest == views_.size()) break;
    retire_view(oldest);
  }
  // The op just issued may be copying now: release only past a bound.
  if (freed_held_ > kFreedHeldWhileBusy || unmapping_.size() > kMaxViews || held_ > budget)
    release_some(cu, budget);
}

void PeerImports::release_while_idle(const CudaDriver& cu, uint64_t budget) {
  std::lock_guard<std::mutex> lock(mu_);
  if (unmapping_.empty() && freed_ == 0 && held_ <= budget) return;
  if (!copies_idle()) return;  // this rank's copies may still run
  if (freed_ > 0) retire_freed();
  release_some(cu, budget);
}

void PeerImports::release_some(const CudaDriver& cu, uint64_t budget) {
  size_t calls = drain_unmaps(cu, kReleaseCallsPerOp);
  for (auto it = imports_.begin();
       freed_ > 0 && calls < kReleaseCallsPerOp && it != imports_.end();)
    if (it->second.views == 0 && it->second.freed) {
      release_import(cu, it++);
      ++calls;
    } else {
      ++it;
    }
  // Imports beyond the budget, least recently used first (with their views, once those
  // finished and were unmapped).
  while (held_ > budget && calls < kReleaseCallsPerOp) {
    auto lru = imports_.end();
    for (auto it = imports_.begin(); it != imports_.end(); ++it)
      if (lru == imports_.end() || it->second.last_seq < lru->second.last_seq) lru = it;
    if (lru == imports_.end()) break;
    bool busy = false;
    for (size_t i = views_.size(); i-- > 0;) {
      const View& v = views_[i];
      if (v.pid != lru->first.first ||
          std::find(v.blocks.begin(), v.blocks.end(), lru->first.second) == v.blocks.end())
        continue;
      if (may_go(v))
        retire_view(i);
      else
        busy = true;
    }
    if (busy || lru->second.views > 0) break;  // in use, or not yet unmapped: later
    release_import(cu, lru);
    ++calls;
  }
}

void PeerImports::release_idle(const CudaDriver& cu) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = views_.size(); i-- > 0;)
    if (may_go(views_[i])) retire_view(i);
  drain_unmaps(cu, SIZE_MAX);
  for (auto it = imports_.begin(); it != imports_.end();)
    if (it->second.views == 0)
      release_import(cu, it++);
    else
      ++it;
}

uint64_t PeerImports::held_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

bool PeerImports::owner_queries(std::vector<OwnerQuery>* out) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock) return false;
  queries_locked(out);
  return true;
}

bool PeerImports::take_releasable(const std::vector<OwnerQuery>& answers, size_t max_calls,
                                  Release* out) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock) return false;
  apply_answers(answers);
  if (freed_ > 0) retire_freed();
  // Unmapping slows the copies in flight (peer_memory.h): while they run, the application's
  // thread releases at its ops as before, unless too much freed memory is held.
  if (unmapping_.empty() && freed_ == 0) return true;
  if (!copies_idle() && freed_held_ <= kFreedHeldWhileBusy) return true;
  out->device = device_;
  size_t calls = 0;
  UnmapQueue::View v;
  while (calls < max_calls && unmapping_.take_front(&v)) {
    // As good as unmapped for the books: nothing here maps it any more.
    for (uint64_t id : v.blocks) imports_[{v.pid, id}].views--;
    calls += v.sizes.size() - v.unmapped;
    out->views.push_back(std::move(v));
  }
  for (auto it = imports_.begin(); calls < max_calls && it != imports_.end();)
    if (it->second.views == 0 && it->second.freed) {
      out->handles.push_back(forget_import(it++));
      ++calls;
    } else {
      ++it;
    }
  return true;
}

void PeerImports::release(const CudaDriver& cu, Release* r) {
  ScopedDevice on(r->device);
  for (UnmapQueue::View& v : r->views) UnmapQueue::finish(cu, &v);
  for (CUmemGenericAllocationHandle h : r->handles) cu.cuMemRelease(h);
  r->views.clear();
  r->handles.clear();
}

PeerImports::~PeerImports() {
  housekeeping_remove(housekeeping_id_);
  std::lock_guard<std::mutex> lock(mu_);
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  ScopedDevice on(device_);
  while (!views_.empty()) retire_view(views_.size() - 1);
  drain_unmaps(*cu, SIZE_MAX);
  while (!imports_.empty()) release_import(*cu, imports_.begin());
}

bool enable_peer_access(const CudaDriver& cu, int device, int peer_device) {
  CUcontext peer = primary_context_of(peer_device);
  if (!peer) return false;
  ScopedDevice on(device);
  const CUresult r = cu.cuCtxEnablePeerAccess(peer, 0);
  return r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
}

}  // namespace zc
