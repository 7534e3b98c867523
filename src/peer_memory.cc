#include "peer_memory.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "fd_exchange.h"
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

bool block_at(const CudaDriver& cu, uint64_t p, Block* b) {
  CUdeviceptr base = 0;
  size_t bytes = 0;
  unsigned long long id = 0;
  uint64_t handle_types = 0;
  if (!attribute(cu, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p, &base) ||
      !attribute(cu, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p, &bytes) ||
      !attribute(cu, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, p, &id) || base == 0 || bytes == 0 ||
      p < base || p - base >= bytes)
    return false;
  attribute(cu, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, p, &handle_types);
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

uint64_t export_block(const CudaDriver& cu, const Block& b) {
  std::lock_guard<std::mutex> lock(g_exports_mu);
  auto it = exports().find(b.id);
  if (it != exports().end()) return it->second.token;
  FdService* service = fd_service();
  if (!service) return 0;
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
  if (token) exports()[b.id] = Exported{b.base, b.bytes, token};
  return token;
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

void sweep_exports(const CudaDriver& cu) {
  std::lock_guard<std::mutex> lock(g_exports_mu);
  FdService* service = fd_service();
  for (auto it = exports().begin(); it != exports().end();) {
    Block b;
    const bool live = block_at(cu, it->second.base, &b) && b.id == it->first;
    if (live) {
      ++it;
      continue;
    }
    if (service) service->withdraw(it->second.token);
    it = exports().erase(it);
  }
}

void withdraw_all_exports() {
  std::lock_guard<std::mutex> lock(g_exports_mu);
  if (FdService* service = fd_service())
    for (const auto& [id, e] : exports()) service->withdraw(e.token);
  exports().clear();
}

// Extents [first, last] of `buf` are imported (those not imported yet, in one request to their
// owner's fd service).
bool PeerImports::import_missing(const CudaDriver& cu, const OpBuffer& buf, uint32_t first,
                                 uint32_t last, int pid, const char* fd_address,
                                 const char** why) {
  std::vector<uint64_t> tokens;
  std::vector<const OpExtent*> wanted;
  for (uint32_t i = first; i <= last; ++i)
    if (!imports_.count({pid, buf.extents[i].block_id})) {
      tokens.push_back(buf.extents[i].token);
      wanted.push_back(&buf.extents[i]);
    }
  if (tokens.empty()) return true;
  owners_[pid] = fd_address;
  const auto started = std::chrono::steady_clock::now();
  uint64_t imported = 0, imported_bytes = 0;
  // Descriptors and FABRIC blobs (tokens with kFdBlobToken) come in one request each.
  std::vector<uint64_t> fd_tokens, blob_tokens;
  for (uint64_t t : tokens) (t & kFdBlobToken ? blob_tokens : fd_tokens).push_back(t);
  std::vector<int> got_fds;
  std::vector<FdBlob> blobs;
  std::vector<bool> found;
  if ((!fd_tokens.empty() && !fd_fetch(fd_address, pid, fd_tokens.data(), fd_tokens.size(),
                                       &got_fds, kFdTimeoutMs, why)) ||
      (!blob_tokens.empty() && !fd_fetch_blobs(fd_address, pid, blob_tokens.data(),
                                               blob_tokens.size(), &blobs, &found, kFdTimeoutMs,
                                               why))) {
    for (int fd : got_fds)
      if (fd >= 0) close(fd);
    return false;
  }
  // Back in the order of `wanted`: fds[i] >= 0, or blob_of[i] >= 0 for a found blob.
  std::vector<int> fds(tokens.size(), -1), blob_of(tokens.size(), -1);
  for (size_t i = 0, nf = 0, nb = 0; i < tokens.size(); ++i) {
    if (tokens[i] & kFdBlobToken) {
      if (found[nb]) blob_of[i] = static_cast<int>(nb);
      ++nb;
    } else {
      fds[i] = got_fds[nf++];
    }
  }
  bool ok = true;
  for (size_t i = 0; i < fds.size(); ++i) {
    CUmemGenericAllocationHandle h = 0;
    const bool present = fds[i] >= 0 || blob_of[i] >= 0;
    const bool imported_it =
        ok && present &&
        (fds[i] >= 0 ? import_allocation(cu, fds[i], &h)
                     : import_fabric_allocation(cu, blobs[static_cast<size_t>(blob_of[i])].bytes,
                                                &h));
    if (imported_it) {
      Import& kept = imports_[{pid, wanted[i]->block_id}];
      kept.handle = h;
      kept.bytes = wanted[i]->bytes;
      kept.token = wanted[i]->token;
      held_ += kept.bytes;
      stats_pool_bytes_add(static_cast<int64_t>(kept.bytes));
      ++imported;
      imported_bytes += kept.bytes;
    } else if (ok) {
      ok = false;
      *why = !present ? "a peer no longer exports a buffer it posted"
                      : "could not import a peer's buffer";
    }
    if (fds[i] >= 0) close(fds[i]);  // the handle holds the memory now
  }
  const auto took = std::chrono::steady_clock::now() - started;
  stats_peer_mapped(
      imported, imported_bytes,
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
  v->last_seq = seq;
  if (pin) {
    if (!v->pins) v->pins = std::make_shared<std::atomic<int>>(0);
    v->pins->fetch_add(1);
    *pin = v->pins;
  } else {
    v->done = done;
  }
  for (uint32_t i = first; i <= last; ++i) imports_[{pid, buf.extents[i].block_id}].last_seq = seq;
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

void PeerImports::release_import(const CudaDriver& cu, std::map<Key, Import>::iterator it) {
  if (it->second.freed) {
    --freed_;
    freed_held_ -= it->second.bytes;
  }
  cu.cuMemRelease(it->second.handle);
  held_ -= it->second.bytes;
  stats_pool_bytes_add(-static_cast<int64_t>(it->second.bytes));
  stats_peer_unmapped(it->second.bytes);
  imports_.erase(it);
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
    if (views_[i].idle() && over_freed(views_[i])) retire_view(i);
}

// Asks every owner which of our imports' allocations it still exports. An owner that does not
// answer (its process is gone, or busy past the time limit) leaves its imports as they are.
void PeerImports::mark_freed() {
  for (const auto& [pid, address] : owners_) {
    std::vector<uint64_t> tokens;
    std::vector<Import*> asked;
    for (auto it = imports_.lower_bound({pid, 0}); it != imports_.end() && it->first.first == pid;
         ++it) {
      tokens.push_back(it->second.token);
      asked.push_back(&it->second);
    }
    std::vector<bool> published;
    if (tokens.empty() || !fd_published(address.c_str(), pid, tokens.data(), tokens.size(),
                                        &published, kFdAskTimeoutMs, nullptr))
      continue;
    for (size_t i = 0; i < asked.size(); ++i)
      if (!published[i] && !asked[i]->freed) {
        asked[i]->freed = true;
        ++freed_;
        freed_held_ += asked[i]->bytes;
      }
  }
}

void PeerImports::tidy(const CudaDriver& cu, bool ask_owners, uint64_t budget) {
  // Called after every op: it walks its views and imports only when an owner freed some of
  // them (until they are gone), a bound is exceeded or views wait to be unmapped.
  if (ask_owners) mark_freed();
  if (freed_ > 0) retire_freed();
  while (views_.size() > kMaxViews) {
    size_t oldest = views_.size();
    for (size_t i = 0; i < views_.size(); ++i)
      if (views_[i].idle() &&
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
  if (unmapping_.empty() && freed_ == 0 && held_ <= budget) return;
  for (const View& v : views_)
    if (!v.done.passed()) return;  // this rank's copies may still run
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
      if (v.idle())
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
  for (size_t i = views_.size(); i-- > 0;)
    if (views_[i].idle()) retire_view(i);
  drain_unmaps(cu, SIZE_MAX);
  for (auto it = imports_.begin(); it != imports_.end();)
    if (it->second.views == 0)
      release_import(cu, it++);
    else
      ++it;
}

PeerImports::~PeerImports() {
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
