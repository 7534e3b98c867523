#include "peer_memory.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
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

template <typename T>
bool attribute(const CudaDriver& cu, CUpointer_attribute a, uint64_t p, T* out) {
  *out = T{};
  return cu.cuPointerGetAttribute(out, a, static_cast<CUdeviceptr>(p)) == CUDA_SUCCESS;
}

// The physical allocation (cuMem mapping) at `p`.
struct Block {
  uint64_t base = 0, bytes = 0, id = 0;
  bool posix_fd = false;
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
  return true;
}

// This process's exported allocations: block id -> the fd service's token for its descriptor.
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
  int fd = -1;
  const bool ok = cu.cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                  0) == CUDA_SUCCESS;
  cu.cuMemRelease(h);  // the retain's reference; the application's own stays
  if (!ok) return 0;
  const uint64_t token = service->publish(fd);
  close(fd);
  if (token) exports()[b.id] = Exported{b.base, b.bytes, token};
  return token;
}

bool describe_extents(const CudaDriver& cu, uint64_t addr, uint64_t bytes, OpBuffer* out) {
  for (uint64_t p = addr; p < addr + bytes;) {
    Block b;
    if (out->nextents == kMaxExtents || !block_at(cu, p, &b) || !b.posix_fd) return false;
    const uint64_t token = export_block(cu, b);
    if (!token) return false;
    out->extents[out->nextents++] = OpExtent{b.base, b.bytes, b.id, token};
    p = b.base + b.bytes;
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

bool describe_buffer(const CudaDriver& cu, uint64_t addr, uint64_t bytes, const ReachNeeds& needs,
                     OpBuffer* out) {
  out->addr = addr;
  out->bytes = bytes;
  out->nextents = 0;
  if (needs.by_pointer && !pointer_reachable(cu, addr, needs)) return false;
  if (needs.by_extents && !describe_extents(cu, addr, bytes, out)) return false;
  return true;
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

bool PeerImports::import_missing(const CudaDriver& cu, const OpBuffer& buf, int pid,
                                 const char* fd_address, uint64_t addr, uint64_t bytes,
                                 const char** why) {
  std::vector<uint64_t> tokens;
  std::vector<const OpExtent*> wanted;
  for (uint32_t i = 0; i < buf.nextents && i < kMaxExtents; ++i) {
    const OpExtent& e = buf.extents[i];
    if (e.base >= addr + bytes || e.base + e.bytes <= addr) continue;
    if (maps_.count({pid, e.block_id})) continue;
    tokens.push_back(e.token);
    wanted.push_back(&e);
  }
  if (tokens.empty()) return true;
  owners_[pid] = fd_address;
  const auto started = std::chrono::steady_clock::now();
  uint64_t mapped = 0, mapped_bytes = 0;
  std::vector<int> fds;
  if (!fd_fetch(fd_address, pid, tokens.data(), tokens.size(), &fds, kFdTimeoutMs, why))
    return false;
  bool ok = true;
  for (size_t i = 0; i < fds.size(); ++i) {
    MappedAllocation m;
    if (ok && fds[i] >= 0 && import_mapping(cu, fds[i], wanted[i]->bytes, device_, &m)) {
      Mapping& kept = maps_[{pid, wanted[i]->block_id}];
      kept.va = m.va;
      kept.bytes = m.bytes;
      kept.handle = m.handle;
      kept.token = wanted[i]->token;
      held_ += m.bytes;
      stats_pool_bytes_add(static_cast<int64_t>(m.bytes));
      ++mapped;
      mapped_bytes += m.bytes;
    } else if (ok) {
      ok = false;
      *why = fds[i] < 0 ? "a peer no longer exports a buffer it posted"
                        : "could not map a peer's buffer";
    }
    if (fds[i] >= 0) close(fds[i]);  // the mapping holds the memory now
  }
  const auto took = std::chrono::steady_clock::now() - started;
  stats_peer_mapped(
      mapped, mapped_bytes,
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(took).count()));
  return ok;
}

bool PeerImports::resolve(const CudaDriver& cu, const OpBuffer& buf, int pid,
                          const char* fd_address, uint64_t addr, uint64_t bytes, uint64_t seq,
                          DoneMark done, std::vector<Span>* out, const char** why) {
  out->clear();
  if (addr < buf.addr || bytes > buf.bytes || addr - buf.addr > buf.bytes - bytes) {
    *why = "a peer posted a buffer smaller than the op";
    return false;
  }
  if (!import_missing(cu, buf, pid, fd_address, addr, bytes, why)) return false;
  uint64_t p = addr;
  for (uint32_t i = 0; i < buf.nextents && i < kMaxExtents && p < addr + bytes; ++i) {
    const OpExtent& e = buf.extents[i];
    if (p < e.base || p >= e.base + e.bytes) continue;
    Mapping& m = maps_[{pid, e.block_id}];
    m.last_seq = seq;
    m.done = done;
    const uint64_t n = std::min(addr + bytes, e.base + e.bytes) - p;
    out->push_back(Span{m.va + (p - e.base), n});
    p += n;
  }
  if (p != addr + bytes) {
    *why = "a peer's buffer extents do not cover the op";
    return false;
  }
  return true;
}

void PeerImports::release(const CudaDriver& cu, Mapping* m) {
  MappedAllocation a;
  a.va = m->va;
  a.bytes = m->bytes;
  a.handle = m->handle;
  release_mapping(cu, &a);
  held_ -= m->bytes;
  stats_pool_bytes_add(-static_cast<int64_t>(m->bytes));
  stats_peer_unmapped(m->bytes);
}

// Asks every owner which of our mappings' allocations it still exports. An owner that does not
// answer (its process is gone, or busy past the time limit) leaves its mappings as they are.
void PeerImports::mark_freed() {
  for (const auto& [pid, address] : owners_) {
    std::vector<uint64_t> tokens;
    std::vector<Mapping*> asked;
    for (auto it = maps_.lower_bound({pid, 0}); it != maps_.end() && it->first.first == pid; ++it) {
      tokens.push_back(it->second.token);
      asked.push_back(&it->second);
    }
    std::vector<bool> published;
    if (tokens.empty() || !fd_published(address.c_str(), pid, tokens.data(), tokens.size(),
                                        &published, kFdAskTimeoutMs, nullptr))
      continue;
    for (size_t i = 0; i < asked.size(); ++i)
      if (!published[i]) asked[i]->freed = true;
  }
}

void PeerImports::tidy(const CudaDriver& cu, bool ask_owners, uint64_t budget) {
  if (ask_owners) mark_freed();
  std::vector<std::map<Key, Mapping>::iterator> idle;  // finished, still wanted
  for (auto it = maps_.begin(); it != maps_.end();) {
    if (!it->second.done.passed()) {
      ++it;
    } else if (it->second.freed) {
      release(cu, &it->second);
      it = maps_.erase(it);
    } else {
      idle.push_back(it++);
    }
  }
  if (held_ <= budget) return;
  std::sort(idle.begin(), idle.end(),
            [](const auto& a, const auto& b) { return a->second.last_seq < b->second.last_seq; });
  for (auto it : idle) {
    if (held_ <= budget) break;
    release(cu, &it->second);
    maps_.erase(it);
  }
}

PeerImports::~PeerImports() {
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  ScopedDevice on(device_);
  for (auto& [key, m] : maps_) release(*cu, &m);
}

bool enable_peer_access(const CudaDriver& cu, int device, int peer_device) {
  CUcontext peer = primary_context_of(peer_device);
  if (!peer) return false;
  ScopedDevice on(device);
  const CUresult r = cu.cuCtxEnablePeerAccess(peer, 0);
  return r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
}

}  // namespace zc
