#include "nccl_rank.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "cuda_check.h"
#include "gpu_hello.h"

namespace zcb {

namespace {

void send_hello(Channel* ch, int rank, int device, int nccl_version, const ShimProbe& shim) {
  HelloMsg h = gpu_hello(rank, device);
  h.nccl_version = nccl_version;
  h.shim_loaded = shim.loaded;
  h.shim_version = shim.version;
  ch->send(kMsgHello, &h, sizeof(h));
}

}  // namespace

NcclRank::NcclRank(PathId path, int rank, int nranks, Channel* ch)
    : path_(path), rank_(rank), nranks_(nranks) {
  ZCB_CUDA(cudaSetDevice(rank));
  int version = 0;
  ZCB_NCCL(ncclGetVersion(&version));
  shim_ = probe_shim();
  send_hello(ch, rank, rank, version, shim_);

  // The comparison is only honest if each path runs exactly as labelled.
  if (path_uses_shim(path) && !shim_.loaded) {
    const char* pre = getenv("LD_PRELOAD");
    fatal("libzerocta.so is not loaded in this rank (LD_PRELOAD=%s); path %s measures nothing",
          pre ? pre : "", path_name(path));
  }
  if (!path_uses_shim(path) && shim_.loaded)
    fatal(
        "libzerocta.so is loaded in this rank but path %s must run without it; remove it "
        "from LD_PRELOAD",
        path_name(path));

  ncclUniqueId id;
  if (rank == 0) {
    ZCB_NCCL(ncclGetUniqueId(&id));
    UniqueIdMsg m;
    memcpy(m.bytes, id.internal, sizeof(m.bytes));
    ch->send(kMsgUniqueId, &m, sizeof(m));
  } else {
    UniqueIdMsg m;
    if (!ch->receive(kMsgUniqueIdFwd, &m, sizeof(m))) fatal("no NCCL unique id from the parent");
    memcpy(id.internal, m.bytes, sizeof(m.bytes));
  }

  // The init time is the communicator's alone: the CUDA context exists (cudaFree(0)) and every
  // rank starts the call together, so no rank's process start-up is counted by its peers.
  ZCB_CUDA(cudaFree(nullptr));
  ch->agree_max(0);
  const auto start = std::chrono::steady_clock::now();
  if (path_sets_zero_policy(path)) {
    // The zero-CTA policy in the config: what NCCL 2.28 requires for its CE all-gather
    // (nccl-ce), and all nccl-policy changes.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    ZCB_NCCL(ncclCommInitRankConfig(&comm_, nranks, id, rank, &config));
  } else {
    ZCB_NCCL(ncclCommInitRank(&comm_, nranks, id, rank));
  }
  init_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

void* NcclRank::alloc(size_t bytes) {
  Buffer b{nullptr, nullptr};
  if (path_ == PathId::kNcclCe) {
    // nccl-ce also needs both buffers in symmetric windows over ncclMemAlloc (cuMem) memory.
    ZCB_NCCL(ncclMemAlloc(&b.ptr, bytes));
    ZCB_NCCL(ncclCommWindowRegister(comm_, b.ptr, bytes, &b.win, NCCL_WIN_COLL_SYMMETRIC));
    if (b.win == nullptr)
      fatal(
          "ncclCommWindowRegister returned no window for %zu bytes: NCCL cannot use its "
          "copy-engine path on this machine (symmetric memory unsupported)",
          bytes);
  } else {
    ZCB_CUDA(cudaMalloc(&b.ptr, bytes));
  }
  buffers_.push_back(b);
  return b.ptr;
}

void NcclRank::allgather(const void* send, void* recv, size_t count, ncclDataType_t type,
                         cudaStream_t stream) {
  collective(CollOp::kAllGather, send, recv, count, type, stream);
}

void NcclRank::collective(CollOp op, const void* send, void* recv, size_t count,
                          ncclDataType_t type, cudaStream_t stream) {
  switch (op) {
    case CollOp::kAllGather:
      ZCB_NCCL(ncclAllGather(send, recv, count, type, comm_, stream));
      break;
    case CollOp::kAllReduce:
      ZCB_NCCL(ncclAllReduce(send, recv, count, type, ncclSum, comm_, stream));
      break;
    case CollOp::kReduceScatter:
      ZCB_NCCL(ncclReduceScatter(send, recv, count, type, ncclSum, comm_, stream));
      break;
    case CollOp::kBroadcast:
      ZCB_NCCL(ncclBroadcast(send, recv, count, type, kBroadcastRoot, comm_, stream));
      break;
  }
}

void NcclRank::check_async_error() {
  ncclResult_t async = ncclSuccess;
  ZCB_NCCL(ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess && async != ncclInProgress)
    fatal("communicator error: %s (%d)", ncclGetErrorString(async), static_cast<int>(async));
}

NcclRank::~NcclRank() {
  cudaDeviceSynchronize();
  for (auto it = buffers_.rbegin(); it != buffers_.rend(); ++it) {
    if (path_ == PathId::kNcclCe) {
      ncclCommWindowDeregister(comm_, it->win);
      ncclMemFree(it->ptr);
    } else {
      cudaFree(it->ptr);
    }
  }
  if (comm_) ncclCommDestroy(comm_);
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
