#include "local_aliases.h"

#include <mutex>
#include <vector>

#include "peer_memory.h"
#include "route_memory.h"

namespace zc {
namespace {

constexpr int kMaxDevices = 64;    // device ordinals an alias tracks events for
// Allocations one aliased buffer may lie across: as many as a post describes (op_exchange.h;
// a 1.6 GB FSDP2 buffer of 20 MiB allocations spans 77).
constexpr size_t kMaxBlocks = kMaxExtents;

struct Alias {
  std::vector<uint64_t> bases, sizes, ids;  // the owner's allocations, in address order
  CUdeviceptr va = 0;
  uint64_t devices = 0;            // bit d: device d may write through it
  CUevent used[kMaxDevices] = {};  // per device: after its last copies through the alias
  uint64_t last_use = 0;
  uint64_t bytes() const {
    uint64_t t = 0;
    for (uint64_t s : sizes) t += s;
    return t;
  }
};

std::mutex g_mu;
std::vector<Alias>& aliases() {  // never destroyed: an exit-time destructor must not call CUDA
  static auto* v = new std::vector<Alias>;
  return *v;
}
uint64_t g_clock = 0;

// The allocations [addr, addr + bytes) lies in, in address order.
bool blocks_of(const CudaDriver& cu, uint64_t addr, uint64_t bytes, std::vector<MappedBlock>* out) {
  out->clear();
  for (uint64_t p = addr; p < addr + bytes;) {
    MappedBlock b;
    if (out->size() == kMaxBlocks || !mapped_block_at(cu, p, &b)) return false;
    out->push_back(b);
    p = b.base + b.bytes;
  }
  return !out->empty();
}

// Whether the owner still maps every allocation of the alias where it was.
bool still_mapped(const CudaDriver& cu, const Alias& a) {
  for (size_t i = 0; i < a.ids.size(); ++i) {
    MappedBlock b;
    if (!mapped_block_at(cu, a.bases[i], &b) || b.id != a.ids[i]) return false;
  }
  return true;
}

// Whether every copy through the alias has finished.
bool idle(const CudaDriver& cu, const Alias& a) {
  for (int d = 0; d < kMaxDevices; ++d) {
    if (!a.used[d]) continue;
    ScopedDevice dev(d);
    if (cu.cuEventQuery(a.used[d]) == CUDA_ERROR_NOT_READY) return false;
  }
  return true;
}

void release(const CudaDriver& cu, Alias* a) {
  unmap_back_to_back(cu, a->va, a->sizes.data(), a->sizes.size());
  for (int d = 0; d < kMaxDevices; ++d)
    if (a->used[d]) {
      ScopedDevice dev(d);
      cu.cuEventDestroy(a->used[d]);
    }
}

// Releases the aliases `drop` picks that have gone idle. Called with g_mu held.
template <typename Drop>
void release_where(const CudaDriver& cu, Drop drop) {
  std::vector<Alias>& v = aliases();
  for (size_t i = 0; i < v.size();) {
    if (drop(v[i]) && idle(cu, v[i])) {
      release(cu, &v[i]);
      v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    ++i;
  }
}

}  // namespace

bool local_alias(const CudaDriver& cu, uint64_t addr, uint64_t bytes, const int* devices,
                 int ndevices, uint64_t* out) {
  std::vector<MappedBlock> blocks;
  if (ndevices < 1 || !blocks_of(cu, addr, bytes, &blocks)) return false;
  uint64_t want = 0;
  for (int i = 0; i < ndevices; ++i) {
    if (devices[i] < 0 || devices[i] >= kMaxDevices) return false;
    want |= uint64_t{1} << devices[i];
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (Alias& a : aliases()) {
    if ((a.devices & want) != want || a.ids.size() != blocks.size()) continue;
    bool same = true;
    for (size_t i = 0; i < blocks.size() && same; ++i) same = a.ids[i] == blocks[i].id;
    if (!same) continue;
    a.last_use = ++g_clock;
    *out = a.va + (addr - a.bases[0]);
    return true;
  }
  Alias a;
  std::vector<CUmemGenericAllocationHandle> handles;
  for (const MappedBlock& b : blocks) {
    CUmemGenericAllocationHandle h = 0;
    if (cu.cuMemRetainAllocationHandle(&h, reinterpret_cast<void*>(b.base)) != CUDA_SUCCESS) break;
    handles.push_back(h);
    a.bases.push_back(b.base);
    a.sizes.push_back(b.bytes);
    a.ids.push_back(b.id);
  }
  const bool mapped =
      handles.size() == blocks.size() && map_back_to_back(cu, handles.data(), a.sizes.data(),
                                                          handles.size(), devices, ndevices, &a.va);
  for (CUmemGenericAllocationHandle h : handles) cu.cuMemRelease(h);  // the mapping holds its own
  if (!mapped) return false;
  a.devices = want;
  a.last_use = ++g_clock;
  *out = a.va + (addr - a.bases[0]);
  aliases().push_back(std::move(a));
  return true;
}

bool local_alias_used(const CudaDriver& cu, uint64_t alias_addr, int device, CUstream stream) {
  if (device < 0 || device >= kMaxDevices) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  for (Alias& a : aliases()) {
    if (alias_addr < a.va || alias_addr >= a.va + a.bytes()) continue;
    ScopedDevice dev(device);
    if (!a.used[device] &&
        cu.cuEventCreate(&a.used[device], CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
      a.used[device] = nullptr;
      return false;
    }
    return cu.cuEventRecord(a.used[device], stream) == CUDA_SUCCESS;
  }
  return false;
}

void tidy_local_aliases(const CudaDriver& cu) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (aliases().empty()) return;
  release_where(cu, [&](const Alias& a) { return !still_mapped(cu, a); });
  // Beyond the bound, the least recently used first.
  while (aliases().size() > static_cast<size_t>(kMaxLocalAliases)) {
    uint64_t oldest = UINT64_MAX;
    for (const Alias& a : aliases()) oldest = a.last_use < oldest ? a.last_use : oldest;
    const size_t before = aliases().size();
    release_where(cu, [oldest](const Alias& a) { return a.last_use == oldest; });
    if (aliases().size() == before) break;  // still in use: next time
  }
}

void release_idle_local_aliases(const CudaDriver& cu) {
  std::lock_guard<std::mutex> lock(g_mu);
  release_where(cu, [](const Alias&) { return true; });
}

}  // namespace zc
