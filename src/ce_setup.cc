#include "ce_setup.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <string>

#include "config.h"
#include "log.h"
#include "nonblocking_setup.h"
#include "real_nccl.h"
#include "staged_allgather.h"
#include "stats.h"

namespace zc {
namespace {

// The pool's layout for a communicator of `nranks`. Push sends a piece of up to
// ZEROCTA_CHUNK_BYTES to each peer through one slot (n-1 sub-slots); pull copies up to one
// chunk into a slot. Either way at least 8 slots (6 for eager ops, 2 for CUDA graphs): on
// H200 a slot handed back by a peer can take a whole piece's transfer time to come back
// (the flag queues behind that peer's own copy), so an op needs slots to spare.
ArenaLayout layout_for(const Config& cfg, int nranks) {
  const bool push = cfg.ce_direction == CeDirectionMode::kPush;
  uint64_t slot = cfg.chunk_bytes * static_cast<uint64_t>(push ? nranks - 1 : 1);
  const uint64_t eighth = (cfg.pool_bytes / 8) & ~uint64_t{4095};
  if (eighth > 0) slot = std::min(slot, eighth);
  return ArenaLayout::make(cfg.pool_bytes, slot);
}

constexpr uint64_t kFactsMagic = 0x7a65726f63746131ull;  // "zeroctа1"

// The first fields of NCCL 2.28's struct ncclWindow_vidmem (nccl_device/impl/core__types.h):
// the window handle points at this struct in device memory. Only read on NCCL 2.28.x, and
// every address derived from it is verified against a marker before use.
struct WindowHead {
  void* win_host;
  char* lsa_flat_base;
  int lsa_rank;
  int world_rank;
  uint32_t stride_4g;
};

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t host_hash() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string id(host);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string b;
  if (boot >> b) id += b;
  return fnv1a(id.data(), id.size());
}

// NCCL's window registration is its own collective, and these settings decide on each rank
// whether NCCL takes part in it at all: one rank with NCCL_WIN_ENABLE=0 leaves the others
// waiting inside ncclCommWindowRegister (seen on NCCL 2.28.3, where zerocta cannot step in).
// So they are compared with the facts, before anyone registers.
uint64_t nccl_env_hash() {
  std::string text;
  for (const char* name : {"NCCL_WIN_ENABLE", "NCCL_CUMEM_ENABLE"}) {
    const char* v = getenv(name);
    text += name;
    text += v ? std::string("=") + v : std::string(" unset");
    text += '\n';
  }
  return fnv1a(text.data(), text.size());
}

uint32_t marker_for(int rank, uint64_t fingerprint) {
  return 0x5a000000u ^ static_cast<uint32_t>(rank) ^ static_cast<uint32_t>(fingerprint << 8);
}

struct Scratch {
  CUdeviceptr dev = 0;  // nranks facts, then one int for the agreement all-reduce
  CUstream stream = nullptr;
  bool local_ok = true;
  const char* why = nullptr;
};

int local_ordinal_of(const CudaDriver& cu, const unsigned char uuid[16]) {
  int n = 0;
  cu.cuDeviceGetCount(&n);
  for (int i = 0; i < n; ++i) {
    CUdevice d;
    CUuuid u;
    if (cu.cuDeviceGet(&d, i) == CUDA_SUCCESS && cu.cuDeviceGetUuid(&u, d) == CUDA_SUCCESS &&
        memcmp(u.bytes, uuid, 16) == 0)
      return i;
  }
  return -1;
}

// One WARN per process and reason (rank 0 of the comm says it; every rank records it for
// the DEBUG route log). A machine without any copy-engine API is a plain fact, said at INFO.
void give_up(const std::vector<std::shared_ptr<CommState>>& comms, const char* why,
             bool expected = false) {
  static std::mutex mu;
  static std::set<std::string> said;
  for (auto& c : comms) c->ce_missing = why;
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu);
    first = said.insert(why).second;
  }
  if (!first) return;
  if (expected)
    ZC_INFO("copy-engine all-gather off: %s", why);
  else if (comms[0]->rank <= 0)
    ZC_WARN("copy-engine all-gather off for this communicator: %s", why);
}

}  // namespace

const char* facts_disagreement(const RankFacts* all, int nranks, bool staged) {
  for (int r = 0; r < nranks; ++r) {
    if (all[r].magic != kFactsMagic)
      return "a rank runs without zerocta (or another version): facts do not match";
    if (all[r].rank != r) return "facts arrived out of rank order";
  }
  for (int r = 1; r < nranks; ++r) {
    if (all[r].host_hash != all[0].host_hash) return "ranks are on several hosts";
    if (all[r].fingerprint != all[0].fingerprint)
      return "ranks run with different ZEROCTA_* configurations (fingerprint differs)";
    if (all[r].nccl_version != all[0].nccl_version) return "ranks run different NCCL versions";
    if (all[r].pool_bytes != all[0].pool_bytes) return "ranks disagree on the pool size";
    if (all[r].nccl_env_hash != all[0].nccl_env_hash)
      return "ranks run with different NCCL_WIN_ENABLE or NCCL_CUMEM_ENABLE (NCCL's window "
             "registration, which the pool needs, would hang)";
  }
  if (all[0].nccl_version < 22800 || all[0].nccl_version >= 22900)
    return "the copy-engine route is tested on NCCL 2.28 only";
  if (staged && all[0].nccl_version < kStagedMinNcclVersion)
    return "ZEROCTA_ALLGATHER=nccl-staged needs NCCL 2.28.9 or later (it hung on 2.28.3)";
  return nullptr;
}

void ce_setup(const std::vector<std::shared_ptr<CommState>>& comms) {
  if (comms.empty()) return;
  const Config& cfg = config();
  const RealNccl* nccl = real_nccl();
  const CudaDriver* cu = cuda_driver();
  if (!nccl) return;
  // Ranks whose mode wants no pool still exchange facts, so that a rank configured
  // differently learns it and every rank passes through (wrappers_comm.cc, joins_setup).
  // Before the exchange they give up only for reasons that are the same on every rank.
  const bool pool_wanted =
      cfg.allgather != AllGatherMode::kOff && cfg.allgather != AllGatherMode::kNccl;
  if (!cu || !cu->ce_ok) return give_up(comms, "the CUDA driver offers no copy-engine API", true);
  if (runtime_tier() != RuntimeTier::kFull)
    return give_up(comms, "the copy-engine route needs NCCL 2.28.x");
  if (!nccl->ncclCommWindowRegister || !nccl->ncclMemAlloc)
    return give_up(comms, "this NCCL has no window registration", !pool_wanted);
  for (auto& c : comms)
    if (c->nranks < 2 || c->nranks > kMaxRanks)
      return give_up(comms, "communicator size outside 2..64", !pool_wanted);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<Scratch> scratch(comms.size());

  // 1. Facts.
  for (size_t i = 0; i < comms.size(); ++i) {
    CommState& c = *comms[i];
    ScopedDevice dev(c.device);
    Scratch& s = scratch[i];
    RankFacts f{};
    f.magic = kFactsMagic;
    f.host_hash = host_hash();
    f.fingerprint = cfg.fingerprint;
    f.pool_bytes = layout_for(cfg, c.nranks).arena_bytes();
    f.nccl_version = real_nccl_version();
    f.rank = c.rank;
    f.nccl_env_hash = nccl_env_hash();
    CUdevice d;
    CUuuid u{};
    if (cu->cuDeviceGet(&d, c.device) == CUDA_SUCCESS) cu->cuDeviceGetUuid(&u, d);
    memcpy(f.uuid, u.bytes, 16);
    if (!dev.ok() || cu->cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
        cu->cuMemAlloc(&s.dev, sizeof(RankFacts) * (c.nranks + 1)) != CUDA_SUCCESS ||
        cu->cuMemcpyHtoD(s.dev + sizeof(RankFacts) * c.rank, &f, sizeof f) != CUDA_SUCCESS) {
      // Cannot even take part in the exchange: NCCL would hang the peers if we skipped the
      // collective, so this rank still joins it with garbage facts (magic 0) below.
      s.local_ok = false;
    }
  }
  // Non-blocking comms answer ncclInProgress; each step waits until NCCL has taken it.
  const ncclResult_t nr = grouped_calls(*nccl, comms, [&](size_t i) {
    const CommState& c = *comms[i];
    const Scratch& s = scratch[i];
    if (s.dev == 0) return ncclSuccess;  // see local_ok above; the peers will time out in NCCL
    CUdeviceptr mine = s.dev + sizeof(RankFacts) * c.rank;
    return nccl->ncclAllGather(reinterpret_cast<void*>(mine), reinterpret_cast<void*>(s.dev),
                               sizeof(RankFacts), ncclUint8, c.comm, s.stream);
  });
  const char* verdict = nullptr;
  for (size_t i = 0; i < comms.size(); ++i) {
    CommState& c = *comms[i];
    Scratch& s = scratch[i];
    ScopedDevice dev(c.device);
    std::vector<RankFacts> all(c.nranks);
    if (nr != ncclSuccess || s.dev == 0 || cu->cuStreamSynchronize(s.stream) != CUDA_SUCCESS ||
        cu->cuMemcpyDtoH(all.data(), s.dev, sizeof(RankFacts) * c.nranks) != CUDA_SUCCESS) {
      verdict = "the facts exchange failed";
      continue;
    }
    if (const char* why =
            facts_disagreement(all.data(), c.nranks, cfg.allgather == AllGatherMode::kNcclStaged))
      verdict = why;
    if (!pool_wanted) continue;  // the facts agree on that too (the mode is in the fingerprint)
    // 2. Local checks: direct P2P to every peer's device, then the arena itself.
    CUdevice me;
    cu->cuDeviceGet(&me, c.device);
    for (int p = 0; p < c.nranks && s.local_ok && !verdict; ++p) {
      if (p == c.rank) continue;
      int ord = local_ordinal_of(*cu, all[p].uuid), can = 0;
      CUdevice pd;
      if (ord < 0 || cu->cuDeviceGet(&pd, ord) != CUDA_SUCCESS ||
          cu->cuDeviceCanAccessPeer(&can, me, pd) != CUDA_SUCCESS || !can) {
        s.local_ok = false;
        s.why = "a peer's GPU is not reachable by direct P2P";
      }
    }
    if (s.local_ok && !verdict) {
      c.ce.reset(new CeComm);
      c.ce->layout = layout_for(cfg, c.nranks);
      const ArenaLayout& layout = c.ce->layout;
      c.ce->view.rank = c.rank;
      c.ce->view.nranks = c.nranks;
      if (nccl->ncclMemAlloc(&c.ce->arena, layout.arena_bytes()) != ncclSuccess) {
        s.local_ok = false;
        s.why = "ncclMemAlloc of the pool failed (out of GPU memory?)";
      }
    }
  }
  if (verdict || !pool_wanted) {
    for (size_t i = 0; i < comms.size(); ++i) {
      ScopedDevice dev(comms[i]->device);
      if (comms[i]->ce && comms[i]->ce->arena) nccl->ncclMemFree(comms[i]->ce->arena);
      comms[i]->ce.reset();
      if (scratch[i].dev) cu->cuMemFree(scratch[i].dev);
      if (scratch[i].stream) cu->cuStreamDestroy(scratch[i].stream);
    }
    if (verdict) return give_up(comms, verdict);
    return give_up(comms, "not requested (ZEROCTA_ALLGATHER is nccl or off on every rank)", true);
  }

  // Agreement helper: MIN over ranks of each comm's local_ok, in place in the scratch buffer.
  auto agree = [&](const char* what) -> bool {
    for (size_t i = 0; i < comms.size(); ++i) {
      ScopedDevice dev(comms[i]->device);
      int v = scratch[i].local_ok ? 1 : 0;
      cu->cuMemcpyHtoD(scratch[i].dev, &v, sizeof v);
    }
    const ncclResult_t r = grouped_calls(*nccl, comms, [&](size_t i) {
      void* p = reinterpret_cast<void*>(scratch[i].dev);
      return nccl->ncclAllReduce(p, p, 1, ncclInt32, ncclMin, comms[i]->comm, scratch[i].stream);
    });
    bool all_ok = r == ncclSuccess;
    for (size_t i = 0; i < comms.size(); ++i) {
      ScopedDevice dev(comms[i]->device);
      int v = 0;
      if (cu->cuStreamSynchronize(scratch[i].stream) != CUDA_SUCCESS ||
          cu->cuMemcpyDtoH(&v, scratch[i].dev, sizeof v) != CUDA_SUCCESS || v != 1)
        all_ok = false;
    }
    if (!all_ok) {
      const char* why = what;
      for (auto& s : scratch)
        if (s.why) why = s.why;
      verdict = why;
    }
    return all_ok;
  };

  bool registered = false;
  if (agree("a rank could not allocate its pool or reach a peer")) {
    // 3. Flags to their initial state, the marker, then the collective registration.
    for (size_t i = 0; i < comms.size(); ++i) {
      CommState& c = *comms[i];
      ScopedDevice dev(c.device);
      CUdeviceptr a = reinterpret_cast<CUdeviceptr>(c.ce->arena);
      CUstream st = scratch[i].stream;
      uint32_t marker = marker_for(c.rank, cfg.fingerprint);
      const ArenaLayout& layout = c.ce->layout;
      bool ok = cu->cuMemsetD32Async(a, 0, layout.flags_bytes / 4, st) == CUDA_SUCCESS;
      for (int s = 0; s < layout.nslots && ok; ++s)
        ok = cu->cuMemsetD32Async(a + layout.done_offset(s, 0), 1, kMaxRanks, st) == CUDA_SUCCESS;
      ok = ok && cu->cuMemsetD32Async(a + layout.one_offset(), 1, 1, st) == CUDA_SUCCESS;
      ok = ok && cu->cuMemsetD32Async(a + layout.marker_offset(), marker, 1, st) == CUDA_SUCCESS;
      ok = ok && cu->cuStreamSynchronize(st) == CUDA_SUCCESS;
      if (!ok) scratch[i].local_ok = false;
    }
    const ncclResult_t r = grouped_calls(*nccl, comms, [&](size_t i) {
      CommState& c = *comms[i];
      ScopedDevice dev(c.device);
      c.ce->window = nullptr;
      return nccl->ncclCommWindowRegister(c.comm, c.ce->arena, c.ce->layout.arena_bytes(),
                                          &c.ce->window, NCCL_WIN_COLL_SYMMETRIC);
    });
    registered = true;
    // 4. Peer pointers from the window, each verified by the marker its owner wrote.
    for (size_t i = 0; i < comms.size(); ++i) {
      CommState& c = *comms[i];
      Scratch& s = scratch[i];
      ScopedDevice dev(c.device);
      if (r != ncclSuccess || c.ce->window == nullptr) {
        s.local_ok = false;
        s.why = "NCCL did not register the pool as a symmetric window";
        continue;
      }
      WindowHead head{};
      if (cu->cuMemcpyDtoH(&head, reinterpret_cast<CUdeviceptr>(c.ce->window), sizeof head) !=
          CUDA_SUCCESS) {
        s.local_ok = false;
        s.why = "could not read the window descriptor";
        continue;
      }
      for (int p = 0; p < c.nranks; ++p) {
        int idx = head.lsa_rank + (p - head.world_rank);
        uint64_t base = reinterpret_cast<uint64_t>(head.lsa_flat_base) +
                        (static_cast<uint64_t>(static_cast<uint32_t>(idx) * head.stride_4g) << 32);
        c.ce->view.arena[p] = base;
        uint32_t seen = 0;
        if (cu->cuMemcpyDtoH(&seen, base + c.ce->layout.marker_offset(), sizeof seen) !=
                CUDA_SUCCESS ||
            seen != marker_for(p, cfg.fingerprint)) {
          s.local_ok = false;
          s.why = "a peer pointer derived from the window failed verification";
          break;
        }
      }
      // The own chunk goes into the arena through the local address, not the alias.
      c.ce->view.arena[c.rank] = reinterpret_cast<uint64_t>(c.ce->arena);
    }
  }
  bool ok = registered && agree("a rank failed to register or verify the pool window");
  for (size_t i = 0; i < comms.size(); ++i) {
    CommState& c = *comms[i];
    ScopedDevice dev(c.device);
    if (scratch[i].dev) cu->cuMemFree(scratch[i].dev);
    if (ok) {
      c.ce->streams[1] = scratch[i].stream;
      bool good = true;
      for (int k = 2; k < kPlanStreams && good; ++k)
        good = cu->cuStreamCreate(&c.ce->streams[k], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
      for (int k = 1; k < kPlanStreams && good; ++k)
        good =
            cu->cuStreamCreate(&c.ce->capture_streams[k], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
      for (int e = 0; e < kPlanEvents && good; ++e)
        good = cu->cuEventCreate(&c.ce->events[e], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
               cu->cuEventCreate(&c.ce->capture_events[e], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
      if (!good) {
        // Too late to disagree; the comm is poisoned on first use instead of hanging a peer.
        c.poisoned.store(ncclUnhandledCudaError);
        ZC_WARN("could not create the copy-engine streams; the communicator is poisoned");
      }
      c.ce_ready.store(true, std::memory_order_release);
      stats_comm_ce_ready();
      stats_pool_bytes_add(static_cast<int64_t>(c.ce->layout.arena_bytes()));
    } else {
      if (c.ce && c.ce->window) nccl->ncclCommWindowDeregister(c.comm, c.ce->window);
      if (c.ce && c.ce->arena) nccl->ncclMemFree(c.ce->arena);
      c.ce.reset();
      if (scratch[i].stream) cu->cuStreamDestroy(scratch[i].stream);
    }
  }
  if (!ok) return give_up(comms, verdict ? verdict : "pool setup failed");
  if (cfg.allgather == AllGatherMode::kNcclStaged) staged_warmup(comms);
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (auto& c : comms) {
    const ArenaLayout& layout = c->ce->layout;
    ZC_INFO(
        "copy-engine pool ready: rank %d/%d dev %d, %s, %d slots x %llu B (%llu B of GPU "
        "memory), set up in %.1f ms",
        c->rank, c->nranks, c->device, cfg.ce_direction == CeDirectionMode::kPush ? "push" : "pull",
        layout.nslots, static_cast<unsigned long long>(layout.slot_bytes),
        static_cast<unsigned long long>(layout.arena_bytes()), ms);
  }
}

void ce_release_waits(CommState& st) {
  CeComm* ce = st.ce.get();
  if (!ce || !ce->arena) return;  // nothing of ours can be waiting (and no driver is loaded)
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  ScopedDevice dev(st.device);
  // Set every ready/done flag to 1 from a fresh non-blocking stream, repeatedly, until our
  // streams drain: each wait then passes, and copies from a dead peer's memory are harmless
  // (NCCL's import keeps that memory alive). Bounded, so abort itself never hangs.
  CUstream s = nullptr;
  if (cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return;
  CUdeviceptr a = reinterpret_cast<CUdeviceptr>(ce->arena);
  for (int round = 0; round < 2000; ++round) {
    cu->cuMemsetD32Async(a, 1, ce->layout.one_offset() / 4, s);
    cu->cuStreamSynchronize(s);
    bool drained = true;
    for (int k = 1; k < kPlanStreams; ++k)
      drained = drained && cu->cuStreamQuery(ce->streams[k]) == CUDA_SUCCESS;
    if (drained) break;
    usleep(1000);
  }
  cu->cuStreamDestroy(s);
}

void ce_teardown(CommState& st, bool aborting) {
  std::unique_ptr<CeComm> ce = std::move(st.ce);
  st.ce_ready.store(false);
  if (st.side_stream) {  // the legacy-stream detour of NCCL-CE-capable ops (wrappers)
    const CudaDriver* cu = cuda_driver();
    ScopedDevice dev(st.device);
    if (!aborting) cu->cuStreamSynchronize(st.side_stream);
    cu->cuStreamDestroy(st.side_stream);
    for (CUevent& e : st.side_events)
      if (e) cu->cuEventDestroy(e), e = nullptr;
    st.side_stream = nullptr;
  }
  if (!ce) return;
  const CudaDriver* cu = cuda_driver();
  const RealNccl* nccl = real_nccl();
  if (!cu || !nccl) return;
  ScopedDevice dev(st.device);
  for (int i = 1; i < kPlanStreams; ++i) {
    if (ce->streams[i]) {
      if (!aborting) cu->cuStreamSynchronize(ce->streams[i]);
      cu->cuStreamDestroy(ce->streams[i]);
    }
    if (ce->capture_streams[i]) cu->cuStreamDestroy(ce->capture_streams[i]);
  }
  for (int e = 0; e < kPlanEvents; ++e) {
    if (ce->events[e]) cu->cuEventDestroy(ce->events[e]);
    if (ce->capture_events[e]) cu->cuEventDestroy(ce->capture_events[e]);
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (ce->window && !aborting)
    wait_in_progress(*nccl, {st.comm}, nccl->ncclCommWindowDeregister(st.comm, ce->window));
  const auto t1 = std::chrono::steady_clock::now();
  // After an abort NCCL has released the window itself; the arena is ours to free.
  if (ce->arena) {
    nccl->ncclMemFree(ce->arena);
    stats_pool_bytes_add(-static_cast<int64_t>(ce->layout.arena_bytes()));
  }
  using ms = std::chrono::duration<double, std::milli>;
  ZC_INFO("copy-engine pool released: rank %d, window deregistered in %.1f ms, freed in %.1f ms",
          st.rank, ms(t1 - t0).count(), ms(std::chrono::steady_clock::now() - t1).count());
}

}  // namespace zc
