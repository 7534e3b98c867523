#include "nccl_ranks.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "cuda_check.h"
#include "gpu_hello.h"

namespace zcb {

namespace {

void send_hello(Channel* ch, int rank, int nccl_version, const ShimProbe& shim) {
  HelloMsg h = gpu_hello(rank, rank);
  h.nccl_version = nccl_version;
  h.shim_loaded = shim.loaded;
  h.shim_version = shim.version;
  ch->send(kMsgHello, &h, sizeof(h));
}

// The comparison is only honest if each path runs exactly as labelled.
void check_shim(PathId path, const ShimProbe& shim) {
  if (path_uses_shim(path) && !shim.loaded) {
    const char* pre = getenv("LD_PRELOAD");
    fatal("libzerocta.so is not loaded in this process (LD_PRELOAD=%s); path %s measures nothing",
          pre ? pre : "", path_name(path));
  }
  if (!path_uses_shim(path) && shim.loaded)
    fatal(
        "libzerocta.so is loaded in this process but path %s must run without it; remove it "
        "from LD_PRELOAD",
        path_name(path));
}

// Rank 0's id reaches the other processes through the parent; a process holding every rank
// makes its own.
ncclUniqueId unique_id(bool first_rank_here, bool every_rank_here, Channel* ch) {
  ncclUniqueId id;
  if (first_rank_here) {
    ZCB_NCCL(ncclGetUniqueId(&id));
    if (every_rank_here) return id;
    UniqueIdMsg m;
    memcpy(m.bytes, id.internal, sizeof(m.bytes));
    ch->send(kMsgUniqueId, &m, sizeof(m));
    return id;
  }
  UniqueIdMsg m;
  if (!ch->receive(kMsgUniqueIdFwd, &m, sizeof(m))) fatal("no NCCL unique id from the parent");
  memcpy(id.internal, m.bytes, sizeof(m.bytes));
  return id;
}

// ncclGroupStart/End around the calls of several local ranks (one thread must not block in
// one GPU's call while its peers' calls are not issued yet); nothing around a single rank,
// which makes the plain calls an application makes.
class LocalGroup {
 public:
  explicit LocalGroup(bool several) : several_(several) {
    if (several_) ZCB_NCCL(ncclGroupStart());
  }
  ~LocalGroup() {
    if (several_) ZCB_NCCL(ncclGroupEnd());
  }

 private:
  bool several_;
};

}  // namespace

NcclRanks::NcclRanks(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch)
    : o_(o), path_(path), nranks_(nranks), ch_(ch) {
  const bool every = worker_rank < 0;
  for (int r = every ? 0 : worker_rank; r < (every ? nranks : worker_rank + 1); ++r) {
    ranks_.emplace_back();
    ranks_.back().rank = r;
  }
  int version = 0;
  ZCB_NCCL(ncclGetVersion(&version));
  shim_ = probe_shim();
  for (const Rank& k : ranks_) {
    ZCB_CUDA(cudaSetDevice(k.rank));
    send_hello(ch, k.rank, version, shim_);
  }
  check_shim(path, shim_);
  const ncclUniqueId id = unique_id(ranks_.front().rank == 0, every, ch);
  std::vector<int> local;
  for (const Rank& k : ranks_) local.push_back(k.rank);
  scalars_ = std::make_unique<DeviceScalars>(o.reduction(), o.dtype.nccl, local, nranks);

  // The init time is the communicators' alone: the CUDA contexts exist (cudaFree(0)) and every
  // process starts together, so no process's start-up is counted by its peers.
  for (const Rank& k : ranks_) {
    ZCB_CUDA(cudaSetDevice(k.rank));
    ZCB_CUDA(cudaFree(nullptr));
  }
  ch->agree_max(0);
  const auto start = std::chrono::steady_clock::now();
  create_comms(id);
  init_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void NcclRanks::create_comms(const ncclUniqueId& id) {
  LocalGroup group(size() > 1);  // ncclCommInitAll's way: one group over every local rank
  for (Rank& k : ranks_) {
    ZCB_CUDA(cudaSetDevice(k.rank));
    if (path_sets_zero_policy(path_)) {
      // The zero-CTA policy in the config: what NCCL 2.28 requires for its CE all-gather
      // (nccl-ce), and all nccl-policy changes.
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
      ZCB_NCCL(ncclCommInitRankConfig(&k.comm, nranks_, id, k.rank, &config));
    } else {
      ZCB_NCCL(ncclCommInitRank(&k.comm, nranks_, id, k.rank));
    }
  }
}

void NcclRanks::set_device(int i) const { ZCB_CUDA(cudaSetDevice(ranks_[i].rank)); }

const WindowCalls kNcclWindowCalls = {ncclGroupStart, ncclCommWindowRegister, ncclGroupEnd};

std::vector<ncclWindow_t> register_windows(const WindowCalls& nccl,
                                           const std::vector<ncclComm_t>& comms,
                                           const std::vector<void*>& ptrs, size_t bytes) {
  std::vector<ncclWindow_t> wins(comms.size(), nullptr);  // sized now: NCCL writes at group end
  const bool group = comms.size() > 1;
  ncclResult_t r = group ? nccl.group_start() : ncclSuccess;
  if (r != ncclSuccess)
    fatal("ncclGroupStart failed: %s (%d)", ncclGetErrorString(r), static_cast<int>(r));
  for (size_t i = 0; i < comms.size(); ++i) {
    r = nccl.window_register(comms[i], ptrs[i], bytes, &wins[i], NCCL_WIN_COLL_SYMMETRIC);
    if (r != ncclSuccess)
      fatal("ncclCommWindowRegister(%zu bytes) failed on local rank %zu: %s (%d)", bytes, i,
            ncclGetErrorString(r), static_cast<int>(r));
  }
  r = group ? nccl.group_end() : ncclSuccess;
  if (r != ncclSuccess)
    fatal("ncclGroupEnd after ncclCommWindowRegister(%zu bytes) failed: %s (%d)", bytes,
          ncclGetErrorString(r), static_cast<int>(r));
  return wins;
}

std::vector<char*> NcclRanks::alloc(size_t bytes) {
  std::vector<char*> out;
  for (Rank& k : ranks_) {
    ZCB_CUDA(cudaSetDevice(k.rank));  // ncclMemAlloc, cuMem and cudaMalloc use the current GPU
    Buffer b;
    if (path_ == PathId::kNcclCe || o_.alloc == BufferAlloc::kNcclMem) {
      ZCB_NCCL(ncclMemAlloc(&b.ptr, bytes));
      b.nccl_mem = true;
    } else if (o_.alloc == BufferAlloc::kCuMem) {
      b.cumem = std::make_unique<CumemBuffer>(k.rank, bytes, o_.cumem_chunk_bytes, o_.cumem_props);
      b.ptr = b.cumem->ptr();
    } else {
      ZCB_CUDA(cudaMalloc(&b.ptr, bytes));
    }
    out.push_back(static_cast<char*>(b.ptr));
    k.buffers.push_back(std::move(b));
  }
  if (path_ == PathId::kNcclCe) register_windows(bytes);
  return out;
}

double NcclRanks::take_windows_ms() {
  const double ms = windows_ms_;
  windows_ms_ = 0;
  return ms;
}

void NcclRanks::register_windows(size_t bytes) {
  std::vector<ncclComm_t> comms;
  std::vector<void*> ptrs;
  for (const Rank& k : ranks_) {
    comms.push_back(k.comm);
    ptrs.push_back(k.buffers.back().ptr);
  }
  // Registration waits in a barrier for every peer: entered together, its time is NCCL's work,
  // not a peer's later ncclMemAlloc.
  ch_->agree_max(0);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<ncclWindow_t> wins =
      zcb::register_windows(kNcclWindowCalls, comms, ptrs, bytes);
  windows_ms_ +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < ranks_.size(); ++i) {
    // NCCL 2.28 answers success without a window only when the communicator has no symmetric
    // memory and NCCL_LOCAL_REGISTER=0 (src/dev_runtime.cc, ncclCommWindowRegister).
    if (wins[i] == nullptr)
      fatal(
          "ncclCommWindowRegister returned no window for %zu bytes on rank %d: the communicator "
          "has no symmetric memory (NCCL wants one node, every GPU pair P2P-connected, cuMem, "
          "NCCL_WIN_ENABLE=1) and NCCL_LOCAL_REGISTER=0, so NCCL's copy-engine all-gather "
          "cannot run",
          bytes, ranks_[i].rank);
    ranks_[i].buffers.back().win = wins[i];
  }
}

void NcclRanks::collective(CollOp op, const std::vector<Placement>& place, size_t count,
                           ncclDataType_t type, const std::vector<cudaStream_t>& streams,
                           RedOp redop) {
  LocalGroup group(size() > 1);
  for (int i = 0; i < size(); ++i) {
    if (size() > 1) set_device(i);
    const ncclComm_t comm = ranks_[i].comm;
    const void* send = place[i].send;
    void* recv = place[i].recv;
    switch (op) {
      case CollOp::kAllGather:
        ZCB_NCCL(ncclAllGather(send, recv, count, type, comm, streams[i]));
        break;
      case CollOp::kAllReduce: {
        const CallRedOp red(kPublicPreMulCalls, redop, type, rank(i), nranks_, comm,
                            scalars_->get(i));
        ZCB_NCCL(ncclAllReduce(send, recv, count, type, red.get(), comm, streams[i]));
        break;
      }
      case CollOp::kReduceScatter: {
        const CallRedOp red(kPublicPreMulCalls, redop, type, rank(i), nranks_, comm,
                            scalars_->get(i));
        ZCB_NCCL(ncclReduceScatter(send, recv, count, type, red.get(), comm, streams[i]));
        break;
      }
      case CollOp::kBroadcast:
        ZCB_NCCL(ncclBroadcast(send, recv, count, type, kBroadcastRoot, comm, streams[i]));
        break;
    }
  }
}

void NcclRanks::check_async_error() {
  for (const Rank& k : ranks_) {
    ncclResult_t async = ncclSuccess;
    ZCB_NCCL(ncclCommGetAsyncError(k.comm, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      fatal("rank %d: communicator error: %s (%d)", k.rank, ncclGetErrorString(async),
            static_cast<int>(async));
  }
}

void NcclRanks::free_buffers() {
  for (const Rank& k : ranks_) {
    cudaSetDevice(k.rank);
    cudaDeviceSynchronize();
  }
  // Windows first, in one group (deregistration is collective), then the memory.
  if (path_ == PathId::kNcclCe) {
    ncclGroupStart();
    for (Rank& k : ranks_)
      for (auto it = k.buffers.rbegin(); it != k.buffers.rend(); ++it)
        if (it->win) ncclCommWindowDeregister(k.comm, it->win);
    ncclGroupEnd();
  }
  for (Rank& k : ranks_) {
    cudaSetDevice(k.rank);
    for (auto it = k.buffers.rbegin(); it != k.buffers.rend(); ++it) {
      if (it->nccl_mem)
        ncclMemFree(it->ptr);
      else if (!it->cumem)
        cudaFree(it->ptr);
      it->cumem.reset();
    }
    k.buffers.clear();
  }
}

NcclRanks::~NcclRanks() {
  free_buffers();
  if (size() > 1) {
    // One thread finalizing several communicators: in one group, or the first one's
    // finalization would wait for its peers' forever.
    ncclGroupStart();
    for (const Rank& k : ranks_)
      if (k.comm) ncclCommFinalize(k.comm);
    ncclGroupEnd();
  }
  for (const Rank& k : ranks_)
    if (k.comm) ncclCommDestroy(k.comm);
}

void send_shim_totals(Channel* ch, int rank, zerocta_op_t op) {
  zerocta_stats_t s;
  if (!shim_stats(&s)) return;
  ShimTotalsMsg m{};
  m.rank = rank;
  for (int i = 0; i < zerocta_route_count; ++i) m.op_calls[i] = s.counters[op][i].calls;
  m.comms_created = s.comms_created;
  m.comms_zero_policy = s.comms_zero_policy;
  m.comms_ce_ready = s.comms_ce_ready;
  ch->send(kMsgShimTotals, &m, sizeof(m));
}

}  // namespace zcb
