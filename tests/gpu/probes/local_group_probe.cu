// How close one process can bring an in-place all-gather to the copy engines' ceiling when it
// holds every rank (nccl-tests -g N: one thread, a group over every GPU's communicator), by how
// the GPUs hand each op over to each other.
//
//   nvcc -O2 -o local_group_probe tests/gpu/probes/local_group_probe.cu -lcuda &&
//   ./local_group_probe
//
// Per GPU a "user" stream and a "push" stream; each plan below pushes every GPU's chunk into
// every peer's buffer on the push stream, and differs in how the GPUs agree that the peers'
// buffers are free (start) and that every write into a buffer has landed (end):
//   bare          no agreement: the pushes back to back (the bench's ceiling)
//   events        every user stream records its start; every push stream waits for every
//                 start; every user stream waits for every push stream's end (the library's
//                 local group plan until it moved to flags: two hand-overs between GPUs on the
//                 way, one of them on the user's stream)
//   push-events   the hand-overs between GPUs move to the push streams: a push stream waits for
//                 its own user stream's start, records "ready", waits for its peers' ready;
//                 after its pushes records "copied", waits for its peers', records the end its
//                 own user stream waits for (the user's stream waits only on its own GPU)
//   host-flags    as push-events, the hand-overs between push streams through flags in pinned
//                 host memory (the route's plan, direct_plan.cc, in one process and across)
//   device-flags  the same with each flag in the memory of the GPU that waits on it, written
//                 by its peers over NVLink
// Prints per chunk size the median time per op of 7 runs of 50 ops (one event pair around the
// loop, as nccl-tests times it), and busbw.
// PROBE_ALLOC=cumem: the receive buffers are cuMem allocations mapped for every GPU
// (cuMemSetAccess, as ncclMemAlloc's) instead of cudaMalloc memory reached through peer access.
// PROBE_BATCH=1: a GPU's pushes go in one cuMemcpyBatchAsync with NCCL's attributes (stream
// order, prefer overlap with compute), as the library issues them, instead of one
// cudaMemcpyAsync each; =2 the same without "prefer overlap"; =3 with source access order
// "any"; =4 NCCL's attributes plus each copy's source and destination GPU as location hints;
// =5 one cudaMemcpyPeerAsync each; =6 each GPU pulls its peers' chunks into its own buffer
// instead, in one batch with NCCL's attributes; =7 the pulls one cudaMemcpyAsync each (the same
// bytes over the same links, the copies issued by the receiving GPU). What they showed (4 H200s, driver 580, host flags, 4 GPUs;
// docs/plots/memory-kinds-4xH200/): on cudaMalloc every mode took 163-167 / 549-555 /
// 2087-2091 us at 64 MiB / 256 MiB / 1 GiB; on cuMem the batch took 157-160 / 544-545 /
// 2083-2087 and one copy each 165 / 550-551 / 2087-2088. Pulls (4 H100s): on cudaMalloc twice
// the pushes' time (338-340 / 1102-1105 / 4153-4155 against 163-164 / 550-551 / 2077-2079), on
// cuMem 2-5 % longer (162-165 / 566-572 / 2176-2182 against 157-160 / 544 / 2075-2076).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kOps = 50;
constexpr int kRuns = 7;
constexpr int kMaxGpus = 8;

enum class Plan { kBare, kEvents, kPushEvents, kHostFlags, kDeviceFlags };
constexpr Plan kPlans[] = {Plan::kBare, Plan::kEvents, Plan::kPushEvents, Plan::kHostFlags,
                           Plan::kDeviceFlags};
const char* plan_name(Plan p) {
  switch (p) {
    case Plan::kBare:
      return "bare";
    case Plan::kEvents:
      return "events";
    case Plan::kPushEvents:
      return "push-events";
    case Plan::kHostFlags:
      return "host-flags";
    case Plan::kDeviceFlags:
      return "device-flags";
  }
  return "?";
}

// A flag word per (waiter, writer, kind): ready and done.
enum FlagKind { kReady = 0, kDone = 1, kFlagKinds = 2 };

struct Gpu {
  cudaStream_t user = nullptr, push = nullptr;
  cudaEvent_t start = nullptr, ready = nullptr, copied = nullptr, end = nullptr;
  char* buf = nullptr;                      // n chunks: the receive buffer, own chunk in place
  CUmemGenericAllocationHandle handle = 0;  // PROBE_ALLOC=cumem: buf's allocation
  uint32_t* dev_flags = nullptr;  // [writer][kind], in this GPU's memory: this GPU waits on them
};

struct Flags {
  uint32_t* host = nullptr;  // [waiter][writer][kind], pinned, mapped
  CUdeviceptr at(const std::vector<Gpu>& g, bool device, int waiter, int writer, int kind) const {
    const size_t n = g.size();
    if (device)
      return reinterpret_cast<CUdeviceptr>(g[waiter].dev_flags + writer * kFlagKinds + kind);
    return reinterpret_cast<CUdeviceptr>(host + (waiter * n + writer) * kFlagKinds + kind);
  }
};

CUstream cu(cudaStream_t s) { return reinterpret_cast<CUstream>(s); }

// One op of `plan`, every GPU's part; `seq` numbers the op (flags are counters).
void issue_op(std::vector<Gpu>& g, const Flags& f, size_t chunk, Plan plan, uint32_t seq) {
  const int n = static_cast<int>(g.size());
  static const int batch_mode = getenv("PROBE_BATCH") ? atoi(getenv("PROBE_BATCH")) : 0;
  const bool pulls = batch_mode == 6 || batch_mode == 7;
  const bool batched = (batch_mode >= 1 && batch_mode <= 4) || batch_mode == 6;
  auto push_all = [&](int r) {
    CUdeviceptr dsts[kMaxGpus], srcs[kMaxGpus];
    size_t sizes[kMaxGpus];
    for (int i = 1; i < n; ++i) {
      const int q = (r + n - i) % n;
      // A push writes my chunk into q's buffer; a pull copies q's chunk into mine.
      char* dst = pulls ? g[r].buf + q * chunk : g[q].buf + r * chunk;
      const char* src = pulls ? g[q].buf + q * chunk : g[r].buf + r * chunk;
      if (batched) {
        dsts[i - 1] = reinterpret_cast<CUdeviceptr>(dst);
        srcs[i - 1] = reinterpret_cast<CUdeviceptr>(src);
        sizes[i - 1] = chunk;
        continue;
      }
      if (batch_mode == 5) {
        CK(cudaMemcpyPeerAsync(g[q].buf + r * chunk, q, g[r].buf + r * chunk, r, chunk, g[r].push));
        continue;
      }
      CK(cudaMemcpyAsync(dst, src, chunk, cudaMemcpyDeviceToDevice, g[r].push));
    }
    if (!batched) return;
    CUmemcpyAttributes attrs[kMaxGpus]{};
    size_t attr_index[kMaxGpus];
    const size_t nattrs = batch_mode == 4 ? static_cast<size_t>(n - 1) : 1;
    for (size_t k = 0; k < nattrs; ++k) {
      CUmemcpyAttributes& a = attrs[k];
      a.srcAccessOrder =
          batch_mode == 3 ? CU_MEMCPY_SRC_ACCESS_ORDER_ANY : CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
      a.flags = batch_mode == 2 ? 0 : CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
      if (batch_mode == 4) {
        a.srcLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a.srcLocHint.id = r;
        a.dstLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE;
        a.dstLocHint.id = (r + n - 1 - static_cast<int>(k)) % n;
      }
      attr_index[k] = k;
    }
    CU(cuMemcpyBatchAsync(dsts, srcs, sizes, n - 1, attrs, attr_index, nattrs, cu(g[r].push)));
  };
  if (plan == Plan::kBare) {
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      push_all(r);
      CK(cudaEventRecord(g[r].end, g[r].push));
      CK(cudaStreamWaitEvent(g[r].user, g[r].end, 0));
    }
    return;
  }
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaEventRecord(g[r].start, g[r].user));
  }
  if (plan == Plan::kEvents) {
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      for (int q = 0; q < n; ++q) CK(cudaStreamWaitEvent(g[r].push, g[q].start, 0));
      push_all(r);
      CK(cudaEventRecord(g[r].end, g[r].push));
    }
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      for (int q = 0; q < n; ++q) CK(cudaStreamWaitEvent(g[r].user, g[q].end, 0));
    }
    return;
  }
  if (plan == Plan::kPushEvents) {
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaStreamWaitEvent(g[r].push, g[r].start, 0));
      CK(cudaEventRecord(g[r].ready, g[r].push));
    }
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      for (int q = 0; q < n; ++q)
        if (q != r) CK(cudaStreamWaitEvent(g[r].push, g[q].ready, 0));
      push_all(r);
      CK(cudaEventRecord(g[r].copied, g[r].push));
    }
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      for (int q = 0; q < n; ++q)
        if (q != r) CK(cudaStreamWaitEvent(g[r].push, g[q].copied, 0));
      CK(cudaEventRecord(g[r].end, g[r].push));
      CK(cudaStreamWaitEvent(g[r].user, g[r].end, 0));
    }
    return;
  }
  const bool device = plan == Plan::kDeviceFlags;
  std::vector<CUstreamBatchMemOpParams> ops;
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaStreamWaitEvent(g[r].push, g[r].start, 0));
    for (int q = 0; q < n; ++q)
      if (q != r) ops.push_back(write_op(f.at(g, device, q, r, kReady), seq));
    for (int q = 0; q < n; ++q)
      if (q != r) ops.push_back(wait_op(f.at(g, device, r, q, kReady), seq));
    batch(cu(g[r].push), ops);
    push_all(r);
    for (int q = 0; q < n; ++q)
      if (q != r) ops.push_back(write_op(f.at(g, device, q, r, kDone), seq));
    for (int q = 0; q < n; ++q)
      if (q != r) ops.push_back(wait_op(f.at(g, device, r, q, kDone), seq));
    batch(cu(g[r].push), ops);
    CK(cudaEventRecord(g[r].end, g[r].push));
    CK(cudaStreamWaitEvent(g[r].user, g[r].end, 0));
  }
}

// Median microseconds per op of `plan`.
double run(std::vector<Gpu>& g, const Flags& f, size_t chunk, Plan plan, uint32_t* seq) {
  const int n = static_cast<int>(g.size());
  cudaEvent_t t0, t1;
  CK(cudaSetDevice(0));
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  std::vector<double> us;
  for (int run = -1; run < kRuns; ++run) {  // run -1: warm-up
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaStreamSynchronize(g[r].user));
      CK(cudaStreamSynchronize(g[r].push));
    }
    CK(cudaSetDevice(0));
    CK(cudaEventRecord(t0, g[0].user));
    for (int r = 0; r < n; ++r) {  // every stream starts after t0
      CK(cudaSetDevice(r));
      CK(cudaStreamWaitEvent(g[r].user, t0, 0));
      CK(cudaStreamWaitEvent(g[r].push, t0, 0));
    }
    for (int op = 0; op < kOps; ++op) issue_op(g, f, chunk, plan, ++*seq);
    for (int r = 1; r < n; ++r) {  // t1 after every stream's last op
      CK(cudaSetDevice(r));
      CK(cudaEventRecord(g[r].end, g[r].user));
      CK(cudaSetDevice(0));
      CK(cudaStreamWaitEvent(g[0].user, g[r].end, 0));
    }
    CK(cudaSetDevice(0));
    CK(cudaEventRecord(t1, g[0].user));
    if (run >= 0)
      us.push_back(us_per_op(reinterpret_cast<CUevent>(t0), reinterpret_cast<CUevent>(t1), kOps));
    else
      CK(cudaEventSynchronize(t1));
  }
  CK(cudaEventDestroy(t0));
  CK(cudaEventDestroy(t1));
  return median_of(us);
}

// `bytes` of GPU `owner`'s memory in one cuMem allocation, mapped and open to GPUs 0..gpus-1.
void* map_for_all(int owner, int gpus, size_t bytes, CUmemGenericAllocationHandle* handle) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = owner;
  CU(cuMemCreate(handle, bytes, &prop, 0));
  CUdeviceptr va = 0;
  CU(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  CU(cuMemMap(va, bytes, 0, *handle, 0));
  std::vector<CUmemAccessDesc> access(static_cast<size_t>(gpus));
  for (int d = 0; d < gpus; ++d) {
    access[static_cast<size_t>(d)].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[static_cast<size_t>(d)].location.id = d;
    access[static_cast<size_t>(d)].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CU(cuMemSetAccess(va, bytes, access.data(), access.size()));
  return reinterpret_cast<void*>(va);
}

}  // namespace

int main() {
  int n = gpus_for_probe("local_group_probe");
  if (n == 0) return 0;
  n = std::min(n, kMaxGpus);
  const size_t max_total = size_t{1} << 30;  // each GPU's receive buffer
  const bool cumem = getenv("PROBE_ALLOC") && strcmp(getenv("PROBE_ALLOC"), "cumem") == 0;
  printf("receive buffers: %s; PROBE_BATCH=%s\n",
         cumem ? "cuMem, mapped for every GPU" : "cudaMalloc",
         getenv("PROBE_BATCH") ? getenv("PROBE_BATCH") : "0 (cudaMemcpyAsync each)");
  Flags f;
  const size_t host_words = size_t{kMaxGpus} * kMaxGpus * kFlagKinds;
  CK(cudaHostAlloc(&f.host, host_words * sizeof(uint32_t),
                   cudaHostAllocPortable | cudaHostAllocMapped));
  memset(f.host, 0, host_words * sizeof(uint32_t));
  uint32_t seq = 0;
  for (int gpus = 2; gpus <= n; gpus *= 2) {
    std::vector<Gpu> g(static_cast<size_t>(gpus));
    for (int r = 0; r < gpus; ++r) {
      CK(cudaSetDevice(r));
      for (int q = 0; q < gpus; ++q)
        if (q != r) {
          cudaError_t e = cudaDeviceEnablePeerAccess(q, 0);
          if (e != cudaErrorPeerAccessAlreadyEnabled) CK(e);
          cudaGetLastError();
        }
      CK(cudaStreamCreateWithFlags(&g[r].user, cudaStreamNonBlocking));
      CK(cudaStreamCreateWithFlags(&g[r].push, cudaStreamNonBlocking));
      for (cudaEvent_t* e : {&g[r].start, &g[r].ready, &g[r].copied, &g[r].end})
        CK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
      if (cumem) {
        g[r].buf = reinterpret_cast<char*>(map_for_all(r, gpus, max_total, &g[r].handle));
      } else {
        CK(cudaMalloc(&g[r].buf, max_total));
      }
      CK(cudaMalloc(&g[r].dev_flags, kMaxGpus * kFlagKinds * sizeof(uint32_t)));
      CK(cudaMemset(g[r].dev_flags, 0, kMaxGpus * kFlagKinds * sizeof(uint32_t)));
      CK(cudaDeviceSynchronize());
    }
    printf("%d GPUs, in place, one process (median us per op of %d runs of %d ops; busbw GB/s)\n",
           gpus, kRuns, kOps);
    printf("%12s", "size (B)");
    for (Plan p : kPlans) printf(" %13s %6s", plan_name(p), "busbw");
    printf("\n");
    for (size_t total = size_t{64} << 20; total <= max_total; total *= 4) {
      const size_t chunk = total / gpus;
      const double moved = static_cast<double>(chunk) * (gpus - 1);
      printf("%12zu", total);
      for (Plan p : kPlans) {
        const double us = run(g, f, chunk, p, &seq);
        printf(" %13.1f %6.1f", us, moved / us / 1e3);
      }
      printf("\n");
    }
    for (int r = 0; r < gpus; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaDeviceSynchronize());
      if (cumem) {
        CU(cuMemUnmap(reinterpret_cast<CUdeviceptr>(g[r].buf), max_total));
        CU(cuMemAddressFree(reinterpret_cast<CUdeviceptr>(g[r].buf), max_total));
        CU(cuMemRelease(g[r].handle));
      } else {
        CK(cudaFree(g[r].buf));
      }
      CK(cudaFree(g[r].dev_flags));
    }
  }
  CK(cudaFreeHost(f.host));
  return 0;
}
