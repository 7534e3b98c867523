#include "rs_scratch.h"

#include <unistd.h>

#include <map>
#include <mutex>
#include <vector>

#include "fd_exchange.h"
#include "stats.h"

namespace zc {
namespace {

// How long the import of a peer's scratch may take: the peer's fd service answers from a
// thread of its own, so this bounds a dead or stuck process, not a busy one.
constexpr int kFetchTimeoutMs = 10000;

// The other GPUs of this process that can reach `device` by P2P.
int peers_of(const CudaDriver& cu, int device, int* out, int most) {
  int count = 0, n = 0;
  CUdevice me;
  if (cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || cu.cuDeviceGet(&me, device) != CUDA_SUCCESS)
    return 0;
  for (int d = 0; d < count && n < most; ++d) {
    CUdevice other;
    int can = 0;
    if (d != device && cu.cuDeviceGet(&other, d) == CUDA_SUCCESS &&
        cu.cuDeviceCanAccessPeer(&can, other, me) == CUDA_SUCCESS && can)
      out[n++] = d;
  }
  return n;
}

// This process's scratches by address, for their peers in this process (rs_scratch.h).
struct LocalScratches {
  std::mutex mu;
  std::map<uint64_t, std::weak_ptr<MappedAllocation>> by_addr;
};
LocalScratches& local_scratches() {
  static LocalScratches* l = new LocalScratches;  // a scratch may go during exit
  return *l;
}

// Released with its last holder: its owner's scratch or a peer's in this process.
void release_own(MappedAllocation* m) {
  {
    LocalScratches& l = local_scratches();
    std::lock_guard<std::mutex> lock(l.mu);
    l.by_addr.erase(m->va);
  }
  if (const CudaDriver* cu = cuda_driver()) {
    stats_pool_bytes_add(-static_cast<int64_t>(m->bytes));
    release_mapping(*cu, m);
  }
  delete m;
}

}  // namespace

bool RsScratch::create(const CudaDriver& cu, int device, uint64_t bytes, const char** why) {
  int also[kMaxRanks];
  const int nalso = peers_of(cu, device, also, kMaxRanks - 1);
  MappedAllocation m;
  if (!create_exportable(cu, bytes, device, also, nalso, &m)) {
    *why = "cannot allocate the reduce-scatter's scratch";
    return false;
  }
  int fd = -1;
  FdService* service = fd_service();
  if (cu.cuMemExportToShareableHandle(&fd, m.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) !=
      CUDA_SUCCESS) {
    fd = -1;
  }
  const uint64_t token = fd >= 0 && service ? service->publish(fd) : 0;
  if (fd >= 0) close(fd);  // the service keeps its own duplicate
  if (token == 0) {
    release_mapping(cu, &m);
    *why = "cannot export the reduce-scatter's scratch";
    return false;
  }
  facts_ = ScratchFacts{m.va, m.bytes, token};
  stats_pool_bytes_add(static_cast<int64_t>(m.bytes));
  own_.reset(new MappedAllocation(m), release_own);
  LocalScratches& l = local_scratches();
  std::lock_guard<std::mutex> lock(l.mu);
  l.by_addr[m.va] = own_;
  return true;
}

bool RsScratch::map_peer(const CudaDriver& cu, int peer, const ScratchFacts& f, bool same_process,
                         const char* fd_address, int pid, int device, const char** why) {
  if (peer_addr_[peer]) return true;
  if (f.addr == 0 || f.bytes == 0) {
    *why = "a peer has no reduce-scatter scratch";
    return false;
  }
  if (same_process) {
    LocalScratches& l = local_scratches();
    std::lock_guard<std::mutex> lock(l.mu);
    auto it = l.by_addr.find(f.addr);
    local_peer_[peer] = it == l.by_addr.end() ? nullptr : it->second.lock();
    if (!local_peer_[peer]) {
      *why = "a peer in this process no longer has its reduce-scatter scratch";
      return false;
    }
    peer_addr_[peer] = f.addr;
    return true;
  }
  std::vector<int> fds;
  if (!fd_fetch(fd_address, pid, &f.token, 1, &fds, kFetchTimeoutMs, why)) return false;
  const int fd = fds.empty() ? -1 : fds[0];
  if (fd < 0) {
    *why = "a peer no longer exports its reduce-scatter scratch";
    return false;
  }
  MappedAllocation& m = imported_[peer];
  const bool imported = import_allocation(cu, fd, &m.handle);
  close(fd);
  const uint64_t size = f.bytes;
  if (!imported || !map_back_to_back(cu, &m.handle, &size, 1, &device, 1, &m.va)) {
    if (imported) cu.cuMemRelease(m.handle);
    m = MappedAllocation{};
    *why = "cannot map a peer's reduce-scatter scratch";
    return false;
  }
  m.bytes = f.bytes;
  peer_addr_[peer] = m.va;
  stats_pool_bytes_add(static_cast<int64_t>(m.bytes));
  return true;
}

RsScratch::~RsScratch() {
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  for (MappedAllocation& m : imported_)
    if (m) {
      stats_pool_bytes_add(-static_cast<int64_t>(m.bytes));
      release_mapping(*cu, &m);
    }
  for (std::shared_ptr<MappedAllocation>& p : local_peer_) p.reset();
  if (facts_.token)
    if (FdService* service = fd_service()) service->withdraw(facts_.token);
  own_.reset();
}

}  // namespace zc
