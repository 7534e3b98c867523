// The all-gather handshake of handshake_probe.cu with one process per GPU, as the route runs:
// each process owns its GPU's buffer (one exportable cuMem allocation), imports every peer's
// from POSIX fds, and pushes its chunk into them; the flags are pinned host memory shared by
// every process, or each waiter's GPU memory imported by its peers. One process per GPU is what
// the route and NCCL's copy-engine path both run on, so a difference from the one-process probe
// is the processes', and a difference between copy calls here is the call's.
//
//   nvcc -O2 -o handshake_procs_probe tests/gpu/probes/handshake_procs_probe.cu -lcuda
//   ./handshake_procs_probe [gpus]        (default: every visible GPU, at most 8)
//
// Per op, process r: the user stream writes ready; the push stream (or the user stream, "1str")
// waits for every rank's ready, pushes its chunk into every peer (r-1, r-2, ...), writes done to
// every peer, waits for every peer's done; the user stream waits for its end event. Copies by
//   memcpy     one cuMemcpyAsync per peer (the route)
//   batch1     one cuMemcpyBatchAsync of one copy per peer (stream order, prefer overlap with
//              compute: NCCL's attributes)
//   batchall   one cuMemcpyBatchAsync of every peer's copy (NCCL's copy-engine all-gather)
//   lanes      each peer's copy on a stream of its own ("lane"), which waits for its own and
//              that peer's ready, copies, writes that peer's done and records an event the push
//              stream waits for: a batch runs its copies one after the other, lanes at once
// Prints, per layout, the slowest process's time per op: median of 5 runs of 200 ops.
// Closer to the route, by environment: PROBE_SLOTS=16 puts each op's host flags in one of 16
// slots (the route's ring of posts); PROBE_QUERY_SPIN_US=N has the host ask cuStreamQuery of the
// user stream for N us after issuing each op (the route's earlier rank while it waits for a
// claim); PROBE_OP_EVENTS=1 records an event on the user stream before each op (what
// zerocta-bench does to time each op; =notiming, one without timing); PROBE_ONE_DONE_BATCH=1 puts
// the done writes and waits in one batch (as the route's plan does); PROBE_ONLY_BATCHALL=1 runs the
// two-stream batched cases only; PROBE_ROUTE_FLAGS=1 lays the host flags out as the route's op
// exchange does; PROBE_HOST_LOCKSTEP=1 has the hosts meet before each op, as the route's do;
// PROBE_STREAMS=1 or 2 runs the one- or two-stream cases only (with PROBE_ONLY_BATCHALL too);
// PROBE_FLAGS_SHM=1 puts the host flags in a /dev/shm file registered portable, as the route's
// channel segment; PROBE_NCCL=1 has every rank set up an NCCL communicator first, as every rank
// process of the route has one (libnccl.so.2, opened at run time).
// Where the host flags' pages lie: PROBE_FLAGS_NODE=N binds them all
// to NUMA node N; PROBE_FLAGS_NODE=waiter binds each rank's done flags to its GPU's node and its
// ready flag (which its own user stream writes) there too; unset, the kernel's first touch decides.
// Sizes 0, 64 and 256 MiB, and 1 GiB with PROBE_MAX_MIB=1024 (PROBE_MIN_MIB drops the smaller);
// PROBE_ROUNDS=N repeats every case in N rounds; PROBE_ONLY_FLAGS=NAME runs one flag layout
// (host, device, done-dev, done-cpy, done-dev-cpy); the lanes only with PROBE_LANES=1.
// PROBE_USER_WARMUP=copy|wait|both has the user stream issue copies and/or one flag wait before
// any case (which copies: PROBE_WARMUP_PATH, _BYTES, _CALL, at warm_user_stream); per op:
// PROBE_PER_OP_DIRTY, PROBE_PER_OP_PRIME, PROBE_READY_BY_EVENT (at their flags). What they
// showed (docs/PERFORMANCE.md, "How the bench times an op"): a user stream whose last work was a
// copy touching a peer GPU's memory, even 4 bytes read, runs the handshake 5-10 us faster; any
// later work on it (a memset, a copy within the GPU or from the host) undoes that; the ready
// said from the push stream after an event is faster still, unless a timed event comes between
// every two ops. Mind the order of a full run: its one-stream cases copy on the user stream,
// so every two-stream case after them runs on a user stream that has copied, the ones before on
// one that has not.
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.h"
#include "probe_fds.h"

namespace {

constexpr int kOps = 200;
constexpr int kRuns = 5;
constexpr int kMaxGpus = 8;
constexpr size_t kBufBytes = 1024ull << 20;
constexpr size_t kFlagBytes = 2ull << 20;

const unsigned g_slots =
    getenv("PROBE_SLOTS") ? std::max(1, std::min(16, atoi(getenv("PROBE_SLOTS")))) : 1;
const int g_spin_us = getenv("PROBE_QUERY_SPIN_US") ? atoi(getenv("PROBE_QUERY_SPIN_US")) : 0;
const bool g_only_batchall = getenv("PROBE_ONLY_BATCHALL") != nullptr;
const bool g_op_events = getenv("PROBE_OP_EVENTS") != nullptr;
const bool g_one_done_batch = getenv("PROBE_ONE_DONE_BATCH") != nullptr;
const bool g_lanes = getenv("PROBE_LANES") != nullptr;
// PROBE_ROUTE_FLAGS=1: host flags laid out as the route's op exchange lays them (op_exchange.cc):
// ready[rank][16 slots] and done[waiter][writer][16 slots], each a run of 16 words, so one
// 64-byte line holds a flag's 16 slots, instead of a line per flag and slot.
const bool g_route_flags = getenv("PROBE_ROUTE_FLAGS") != nullptr;
// PROBE_HOST_LOCKSTEP=1: every rank's host meets the others (a spin barrier) before it issues
// each op, as the route's hosts meet in its op exchange (arrive, claim).
const bool g_host_lockstep = getenv("PROBE_HOST_LOCKSTEP") != nullptr;
// Per op, two-stream cases: PROBE_PER_OP_DIRTY=1 puts a 4-byte memset on the user stream before
// each op (other work between ops, as a framework's stream has); PROBE_PER_OP_PRIME=1 a 4-byte
// read of the next rank's buffer into pinned host memory right before the ready write;
// PROBE_READY_BY_EVENT=1 has the user stream record an event instead of writing ready, and the
// push stream wait for it and write ready itself.
const bool g_per_op_dirty = getenv("PROBE_PER_OP_DIRTY") != nullptr;
const bool g_per_op_prime = getenv("PROBE_PER_OP_PRIME") != nullptr;
const bool g_ready_by_event = getenv("PROBE_READY_BY_EVENT") != nullptr;
const size_t g_max_bytes =
    (getenv("PROBE_MAX_MIB") ? std::max(0, atoi(getenv("PROBE_MAX_MIB"))) : 256) * size_t{1 << 20};
const size_t g_min_bytes =
    (getenv("PROBE_MIN_MIB") ? std::max(0, atoi(getenv("PROBE_MIN_MIB"))) : 0) * size_t{1 << 20};
// PROBE_ROUNDS=N runs the whole set of cases N times, one round after the other, so that cases
// compared with each other alternate in time (a host's drift shows as a round's difference).
const int g_rounds =
    getenv("PROBE_ROUNDS") ? std::max(1, std::min(8, atoi(getenv("PROBE_ROUNDS")))) : 1;

// The route's earlier rank asks whether the op's stream drained while it waits for a claim.
void query_spin(CUstream s) {
  if (g_spin_us <= 0) return;
  timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {
    (void)cuStreamQuery(s);
    clock_gettime(CLOCK_MONOTONIC, &t);
  } while ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 < g_spin_us);
}

// kHost, kDevice: both handshakes' flags there. kDoneDevice: ready in host memory, done in the
// waiter's GPU memory. kDoneCopied: host flags, done written by a 4-byte copy from a GPU word
// after the pushes on the same stream (NCCL's way of writing its flags) instead of a write.
// kDoneDeviceCopied: done in the waiter's GPU memory, written by such a copy: since CUDA 13.1 a
// stream write to another GPU's memory is unsupported, so this is how a driver after 13.0 gets
// kDoneDevice.
enum class Flags { kHost, kDevice, kDoneDevice, kDoneCopied, kDoneDeviceCopied };
enum class Copy { kMemcpy, kBatch1, kBatchAll, kLanes };

// One waiter's host flags, on pages of their own (PROBE_FLAGS_NODE binds them to a node).
struct alignas(4096) WaiterFlags {
  uint32_t ready[16][16];            // per slot: the waiter's own ready, a 64-byte line
  uint32_t done[16][kMaxGpus * 16];  // per slot: done from each writer, a 64-byte line each
};

// Shared by every process (an anonymous shared mapping made before fork).
struct Shared {
  WaiterFlags flags[kMaxGpus];           // first: the pages no one touches before binding
  alignas(64) uint32_t route_flags[kMaxGpus * 16 * (1 + kMaxGpus)];  // PROBE_ROUTE_FLAGS
  std::atomic<int> arrived, generation;  // a sense-reversing barrier
  double us[256][kMaxGpus];              // per case and round, per rank
  int node[kMaxGpus];                    // each rank's GPU's NUMA node
  char nccl_id[128];                     // PROBE_NCCL: rank 0's ncclUniqueId
};

struct Rank {
  int r = 0, n = 0;
  Shared* sh = nullptr;
  CUdeviceptr buf[kMaxGpus] = {};  // every rank's buffer as this process addresses it
  CUdeviceptr flags[kMaxGpus] =
      {};  // every rank's device flags: ready_in at [p], done_in at [64+p]
  CUstream user, push;
  CUstream lanes[kMaxGpus];    // Copy::kLanes: one per peer
  CUevent lane_end[kMaxGpus];  // ... each lane's end, which the push stream waits for
  CUevent end, t0, t1, start;
  CUdeviceptr pinned = 0;   // 64 bytes of pinned host memory (PROBE_PER_OP_PRIME's target)
  CUevent op_events[kOps];  // PROBE_OP_EVENTS
  uint32_t seq = 0;
  CUdeviceptr shared_dev = 0;  // `sh` as the GPU addresses it
};

void barrier(Rank& k) {
  const int g = k.sh->generation.load();
  if (k.sh->arrived.fetch_add(1) + 1 == k.n) {
    k.sh->arrived.store(0);
    k.sh->generation.fetch_add(1);
  } else {
    while (k.sh->generation.load() == g) {
    }
  }
}

// PROBE_NCCL=1: an NCCL communicator over the ranks, set up and kept for the process's life, so
// that what NCCL leaves running in a process (its threads, streams, memory) is there as in the
// route's rank processes. The ABI as nccl.h declares it: the id is 128 bytes passed by value.
struct NcclId {
  char internal[128];
};
void join_nccl(Rank& k) {
  const int r = k.r;
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "PROBE_NCCL: %s\n", dlerror());
    exit(1);
  }
  auto get_id = reinterpret_cast<int (*)(NcclId*)>(dlsym(lib, "ncclGetUniqueId"));
  auto init = reinterpret_cast<int (*)(void**, int, NcclId, int)>(dlsym(lib, "ncclCommInitRank"));
  if (!get_id || !init) exit(1);
  NcclId id;
  if (r == 0) {
    if (get_id(&id) != 0) exit(1);
    memcpy(k.sh->nccl_id, id.internal, sizeof id.internal);
  }
  barrier(k);
  memcpy(id.internal, k.sh->nccl_id, sizeof id.internal);
  void* comm = nullptr;
  if (init(&comm, k.n, id, r) != 0) {
    fprintf(stderr, "PROBE_NCCL: ncclCommInitRank failed on rank %d\n", r);
    exit(1);
  }
}

// A host flag as the GPU addresses it.
CUdeviceptr host_flag(Rank& k, const uint32_t* flag) {
  return k.shared_dev + (reinterpret_cast<const char*>(flag) - reinterpret_cast<const char*>(k.sh));
}
CUdeviceptr ready_flag(Rank& k, Flags f, int waiter, int writer) {
  if (f == Flags::kHost && g_route_flags)
    return host_flag(k, &k.sh->route_flags[writer * 16 + k.seq % 16]);
  if (f != Flags::kDevice) return host_flag(k, &k.sh->flags[writer].ready[k.seq % g_slots][0]);
  return k.flags[waiter] + writer * 4;
}
CUdeviceptr done_flag(Rank& k, Flags f, int waiter, int writer) {
  if (f == Flags::kHost && g_route_flags)
    return host_flag(k, &k.sh->route_flags[k.n * 16 + (waiter * k.n + writer) * 16 + k.seq % 16]);
  if (f == Flags::kHost || f == Flags::kDoneCopied)
    return host_flag(k, &k.sh->flags[waiter].done[k.seq % g_slots][writer * 16]);
  return k.flags[waiter] + (64 + writer) * 4;
}

void issue_op(Rank& k, Flags f, Copy c, bool one_stream, size_t chunk) {
  const uint32_t s = ++k.seq;
  const int r = k.r, n = k.n;
  CUstream push = one_stream ? k.user : k.push;
  std::vector<CUstreamBatchMemOpParams> ops;
  const bool two = !one_stream && c != Copy::kLanes;
  if (two && g_per_op_dirty) CU(cuMemsetD32Async(k.buf[r] + kBufBytes - 4096, s, 1, k.user));
  if (two && g_per_op_prime)
    CU(cuMemcpyAsync(k.pinned, k.buf[(r + 1) % n] + kBufBytes - 4096, 4, k.user));
  if (f != Flags::kDevice) {
    ops.push_back(write_op(ready_flag(k, f, r, r), s));
  } else {
    for (int p = 0; p < n; ++p) ops.push_back(write_op(ready_flag(k, f, p, r), s));
  }
  if (two && g_ready_by_event) {
    CU(cuEventRecord(k.start, k.user));
    CU(cuStreamWaitEvent(push, k.start, 0));  // the writes go in the push stream's first batch
  } else {
    batch(k.user, ops);
  }
  if (c == Copy::kLanes) {
    for (int i = 1; i < n; ++i) {
      const int p = (r - i + n) % n;
      CUstream lane = k.lanes[i];
      ops.push_back(wait_op(ready_flag(k, f, r, r), s));
      ops.push_back(wait_op(ready_flag(k, f, r, p), s));
      batch(lane, ops);
      if (chunk) CU(cuMemcpyAsync(k.buf[p] + r * chunk, k.buf[r] + r * chunk, chunk, lane));
      ops.push_back(write_op(done_flag(k, f, p, r), s));
      batch(lane, ops);
      CU(cuEventRecord(k.lane_end[i], lane));
      CU(cuStreamWaitEvent(push, k.lane_end[i], 0));
    }
    for (int p = 0; p < n; ++p)
      if (p != r) ops.push_back(wait_op(done_flag(k, f, r, p), s));
    batch(push, ops);
    CU(cuEventRecord(k.end, push));
    CU(cuStreamWaitEvent(k.user, k.end, 0));
    return;
  }
  for (int p = 0; p < n; ++p) ops.push_back(wait_op(ready_flag(k, f, r, p), s));
  batch(push, ops);
  std::vector<CUdeviceptr> dsts, srcs;
  std::vector<size_t> sizes;
  for (int i = 1; i < n && chunk; ++i) {
    const int p = (r - i + n) % n;
    dsts.push_back(k.buf[p] + r * chunk);
    srcs.push_back(k.buf[r] + r * chunk);
    sizes.push_back(chunk);
  }
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
  size_t attr_idx = 0;
  if (c == Copy::kBatchAll && !dsts.empty()) {
    CU(cuMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &attr_idx, 1,
                          push));
  } else {
    for (size_t i = 0; i < dsts.size(); ++i) {
      if (c == Copy::kMemcpy)
        CU(cuMemcpyAsync(dsts[i], srcs[i], sizes[i], push));
      else
        CU(cuMemcpyBatchAsync(&dsts[i], &srcs[i], &sizes[i], 1, &attr, &attr_idx, 1, push));
    }
  }
  if (f == Flags::kDoneCopied || f == Flags::kDoneDeviceCopied) {
    const CUdeviceptr word = k.flags[r] + 1024 * 4;  // this op's number, in my GPU's memory
    ops.push_back(write_op(word, s));
    batch(push, ops);
    for (int p = 0; p < n; ++p)
      if (p != r) CU(cuMemcpyAsync(done_flag(k, f, p, r), word, 4, push));
  } else {
    for (int p = 0; p < n; ++p)
      if (p != r) ops.push_back(write_op(done_flag(k, f, p, r), s));
    if (!g_one_done_batch) batch(push, ops);
  }
  for (int p = 0; p < n; ++p)
    if (p != r) ops.push_back(wait_op(done_flag(k, f, r, p), s));
  batch(push, ops);
  if (!one_stream) {
    CU(cuEventRecord(k.end, push));
    CU(cuStreamWaitEvent(k.user, k.end, 0));
  }
}

// This rank's median microseconds per op over kRuns, every rank starting each run together.
double time_ops(Rank& k, Flags f, Copy c, bool one_stream, size_t chunk) {
  for (int i = 0; i < 20; ++i) issue_op(k, f, c, one_stream, chunk);
  CU(cuCtxSynchronize());
  std::vector<double> us;
  for (int run = 0; run < kRuns; ++run) {
    barrier(k);
    CU(cuEventRecord(k.t0, k.user));
    for (int i = 0; i < kOps; ++i) {
      if (g_host_lockstep) barrier(k);
      if (g_op_events) CU(cuEventRecord(k.op_events[i], k.user));
      issue_op(k, f, c, one_stream, chunk);
      query_spin(k.user);
    }
    CU(cuEventRecord(k.t1, k.user));
    us.push_back(us_per_op(k.t0, k.t1, kOps));
  }
  return median_of(us);
}

// One exportable allocation of `bytes` on this rank's GPU, mapped with access for it; its fd.
CUdeviceptr own_allocation(int dev, size_t bytes, int* fd) {
  CUmemAllocationProp p = prop(dev);
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, bytes, &p, 0));
  CUdeviceptr va;
  CU(map_for_device(h, bytes, dev, &va));
  CU(cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  return va;
}

CUdeviceptr import_allocation(int dev, int fd, size_t bytes) {
  CUmemGenericAllocationHandle h;
  CU(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CUdeviceptr va;
  CU(map_for_device(h, bytes, dev, &va));
  return va;
}

const char* flag_names[] = {"host", "device", "done-dev", "done-cpy", "done-dev-cpy"};

// The cases run: every layout at 0 bytes with one copy per call only; the mixed flags on two
// streams only.
bool skipped(size_t total, Flags f, bool one_stream, Copy c) {
  if (total > g_max_bytes || total < g_min_bytes) return true;
  if (c == Copy::kLanes)
    return !g_lanes || one_stream || (f != Flags::kHost && f != Flags::kDoneDevice);
  const char* only = getenv("PROBE_ONLY_FLAGS");
  if (only && strcmp(only, flag_names[static_cast<int>(f)])) return true;
  if (const char* streams = getenv("PROBE_STREAMS");
      streams && atoi(streams) != (one_stream ? 1 : 2))
    return true;
  if (g_only_batchall)
    return (one_stream && !getenv("PROBE_STREAMS")) || (total != 0 && c != Copy::kBatchAll);
  if (total == 0 && c != Copy::kMemcpy) return true;
  return (f == Flags::kDoneDevice || f == Flags::kDoneCopied || f == Flags::kDoneDeviceCopied) &&
         (one_stream || c == Copy::kBatch1);
}

// Calls fn(index, round, total, flags, one_stream, copy) for every case run, in the order the
// ranks run them and the parent prints them (at most the 256 Shared::us holds).
template <class Fn>
void for_each_case(Fn fn) {
  int c = 0;
  for (int round = 0; round < g_rounds; ++round)
    for (size_t total : {size_t(0), size_t(64) << 20, size_t(256) << 20, size_t(1024) << 20})
      for (Flags f : {Flags::kHost, Flags::kDevice, Flags::kDoneDevice, Flags::kDoneCopied,
                      Flags::kDoneDeviceCopied})
        for (bool one : {false, true})
          for (Copy cp : {Copy::kMemcpy, Copy::kBatch1, Copy::kBatchAll, Copy::kLanes})
            if (!skipped(total, f, one, cp) && c < 256) fn(c++, round, total, f, one, cp);
}

// The NUMA node of device `dev`'s PCI function (-1 where unknown).
int gpu_node(CUdevice dev) {
  char bus[32] = {}, path[96];
  if (cuDeviceGetPCIBusId(bus, sizeof bus, dev) != CUDA_SUCCESS) return -1;
  for (char* c = bus; *c; ++c) *c = static_cast<char>(tolower(*c));
  snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus);
  FILE* f = fopen(path, "r");
  int node = -1;
  if (f && fscanf(f, "%d", &node) != 1) node = -1;
  if (f) fclose(f);
  return node;
}

// Binds [p, p + bytes) to NUMA node `node` before anything touches it (MPOL_BIND).
void bind_to_node(void* p, size_t bytes, int node) {
  if (node < 0) return;
  unsigned long mask[4] = {};
  mask[node / 64] |= 1ul << (node % 64);
  if (syscall(SYS_mbind, p, bytes, 2 /* MPOL_BIND */, mask, 256ul, 0u) != 0)
    fprintf(stderr, "mbind to node %d: %s\n", node, strerror(errno));
}

// PROBE_USER_WARMUP=copy|wait|both: the user stream issues copies and/or one flag wait before
// any case, as the one-stream cases have it do. The copies: PROBE_WARMUP_PATH, a comma-separated
// sequence issued in order of peer (this rank's buffer into the next rank's, the default),
// peerread (the next rank's into this one's), peer2host (the next rank's into pinned host
// memory), own (within this GPU's buffer), h2d (from pinned host memory) or memset
// (cuMemsetD32Async within this GPU's buffer); PROBE_WARMUP_BYTES each (1 MiB at most, the
// default); PROBE_WARMUP_CALL=batch (one cuMemcpyBatchAsync with NCCL's attributes, the default)
// or memcpy (cuMemcpyAsync).
void warm_user_stream(Rank& k, const char* w) {
  const int r = k.r, n = k.n;
  if (strcmp(w, "wait") != 0) {
    const char* paths = getenv("PROBE_WARMUP_PATH") ? getenv("PROBE_WARMUP_PATH") : "peer";
    const char* call = getenv("PROBE_WARMUP_CALL") ? getenv("PROBE_WARMUP_CALL") : "batch";
    size_t bytes = getenv("PROBE_WARMUP_BYTES") ? strtoull(getenv("PROBE_WARMUP_BYTES"), 0, 0)
                                                : size_t{1} << 20;
    bytes = std::min(bytes, size_t{1} << 20);
    void* host = nullptr;
    CU(cuMemHostAlloc(&host, 1 << 20, 0));
    const CUdeviceptr own = k.buf[r] + kBufBytes - (2 << 20),
                      peer = k.buf[(r + 1) % n] + kBufBytes - (2 << 20),
                      pinned = reinterpret_cast<CUdeviceptr>(host);
    for (const char* path = paths; *path;) {
      const size_t len = strcspn(path, ",");
      auto is = [&](const char* name) { return len == strlen(name) && !strncmp(path, name, len); };
      CUdeviceptr dst = peer, src = k.buf[r];
      if (is("peerread")) dst = own, src = peer;
      if (is("peer2host")) dst = pinned, src = peer;
      if (is("own")) dst = own;
      if (is("h2d")) dst = own, src = pinned;
      if (is("memset")) {
        CU(cuMemsetD32Async(own, 0, std::max<size_t>(bytes / 4, 1), k.user));
      } else if (!strcmp(call, "memcpy")) {
        CU(cuMemcpyAsync(dst, src, bytes, k.user));
      } else {
        size_t attr_idx = 0;
        CUmemcpyAttributes attr{};
        attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
        CU(cuMemcpyBatchAsync(&dst, &src, &bytes, 1, &attr, &attr_idx, 1, k.user));
      }
      path += len + (path[len] ? 1 : 0);
    }
    if (r == 0) printf("# user stream warmed by %zu-byte copies: %s (%s)\n", bytes, paths, call);
  }
  if (strcmp(w, "copy") != 0) {
    std::vector<CUstreamBatchMemOpParams> ops{wait_op(k.flags[r] + 2048 * 4, 0)};
    batch(k.user, ops);
  }
}

void rank_main(int r, int n, int sock, Shared* sh) {
  Rank k;
  k.r = r;
  k.n = n;
  k.sh = sh;
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, r));
  sh->node[r] = gpu_node(dev);
  if (const char* where = getenv("PROBE_FLAGS_NODE"); where && !strcmp(where, "waiter"))
    bind_to_node(&sh->flags[r], sizeof(WaiterFlags), sh->node[r]);
  else if (where && r == 0)
    bind_to_node(sh->flags, sizeof sh->flags, atoi(where));
  barrier(k);  // every binding before the registration below touches the pages
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  int fds[2];
  k.buf[r] = own_allocation(r, kBufBytes, &fds[0]);
  k.flags[r] = own_allocation(r, kFlagBytes, &fds[1]);
  CU(cuMemsetD8(k.buf[r], 1, kBufBytes));
  CU(cuMemsetD8(k.flags[r], 0, kFlagBytes));
  send_fds(sock, {fds[0], fds[1]});
  close(fds[0]);
  close(fds[1]);
  std::vector<int> all = recv_fds(sock, 2 * n);  // the parent's relay: every rank's pair
  for (int p = 0; p < n; ++p) {
    if (p == r) {
      close(all[2 * p]);
      close(all[2 * p + 1]);
      continue;
    }
    k.buf[p] = import_allocation(r, all[2 * p], kBufBytes);
    k.flags[p] = import_allocation(r, all[2 * p + 1], kFlagBytes);
  }
  if (getenv("PROBE_NCCL")) join_nccl(k);
  CU(cuMemHostRegister(sh, sizeof(Shared),
                       CU_MEMHOSTREGISTER_DEVICEMAP |
                           (getenv("PROBE_FLAGS_SHM") ? CU_MEMHOSTREGISTER_PORTABLE : 0)));
  CU(cuMemHostGetDevicePointer(&k.shared_dev, sh, 0));
  CU(cuStreamCreate(&k.user, CU_STREAM_NON_BLOCKING));
  CU(cuStreamCreate(&k.push, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < n; ++i) {
    CU(cuStreamCreate(&k.lanes[i], CU_STREAM_NON_BLOCKING));
    CU(cuEventCreate(&k.lane_end[i], CU_EVENT_DISABLE_TIMING));
  }
  CU(cuEventCreate(&k.end, CU_EVENT_DISABLE_TIMING));
  CU(cuEventCreate(&k.start, CU_EVENT_DISABLE_TIMING));
  {
    void* h = nullptr;
    CU(cuMemHostAlloc(&h, 64, CU_MEMHOSTALLOC_DEVICEMAP));
    CU(cuMemHostGetDevicePointer(&k.pinned, h, 0));
  }
  CU(cuEventCreate(&k.t0, 0));
  CU(cuEventCreate(&k.t1, 0));
  // PROBE_OP_EVENTS=notiming: events without timing, as PyTorch's per-collective ones by default.
  const char* oe = getenv("PROBE_OP_EVENTS");
  const unsigned op_event_flags = oe && !strcmp(oe, "notiming") ? CU_EVENT_DISABLE_TIMING : 0;
  for (CUevent& e : k.op_events) CU(cuEventCreate(&e, op_event_flags));
  if (const char* w = getenv("PROBE_USER_WARMUP")) warm_user_stream(k, w);
  CU(cuCtxSynchronize());
  barrier(k);

  for_each_case([&](int c, int, size_t total, Flags f, bool one, Copy cp) {
    sh->us[c][r] = time_ops(k, f, cp, one, total / n / 4096 * 4096);
  });
  barrier(k);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  int n = argc > 1 ? atoi(argv[1]) : 0;
  if (n == 0) n = count_gpus_in_child();  // the parent never touches CUDA
  if (n < 2) {
    printf("handshake_procs_probe: needs 2 GPUs, found %d: skipped\n", n);
    return 0;
  }
  if (n > kMaxGpus) n = kMaxGpus;
  void* map = MAP_FAILED;
  if (getenv("PROBE_FLAGS_SHM")) {  // a tmpfs file, as the route's channel segment is
    char path[64];
    snprintf(path, sizeof path, "/dev/shm/handshake-procs-%d", static_cast<int>(getpid()));
    const int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0 && posix_fallocate(fd, 0, sizeof(Shared)) == 0)
      map = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    unlink(path);
  } else {
    map = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  }
  if (map == MAP_FAILED) {
    printf("handshake_procs_probe: no shared memory for the flags\n");
    return 1;
  }
  auto* sh = static_cast<Shared*>(map);
  std::vector<int> socks(n);
  std::vector<pid_t> pids(n);
  for (int r = 0; r < n; ++r) {
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    pids[r] = fork();
    if (pids[r] == 0) {
      close(sv[0]);
      rank_main(r, n, sv[1], sh);
      exit(0);  // not _exit: an injected tracer (copy_trace_inject.cc) writes at exit
    }
    close(sv[1]);
    socks[r] = sv[0];
  }
  std::vector<int> all;
  for (int r = 0; r < n; ++r)
    for (int fd : recv_fds(socks[r], 2)) all.push_back(fd);
  for (int r = 0; r < n; ++r) send_fds(socks[r], all);
  int failed = 0;
  for (int r = 0; r < n; ++r) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    failed |= !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  if (failed) {
    printf("handshake_procs_probe: a rank failed\n");
    return 1;
  }
  printf("%d processes, one GPU each; us per op, slowest rank (median of %d runs of %d ops)\n", n,
         kRuns, kOps);
  printf("GPU NUMA nodes:");
  for (int r = 0; r < n; ++r) printf(" %d", sh->node[r]);
  printf("; host flags: %s\n",
         getenv("PROBE_FLAGS_NODE") ? getenv("PROBE_FLAGS_NODE") : "first touch");
  printf("%5s %8s %-12s %-5s %-9s %8s\n", "round", "total", "flags", "strs", "copy", "us/op");
  const char* copies[] = {"memcpy", "batch1", "batchall", "lanes"};
  for_each_case([&](int c, int round, size_t total, Flags fl, bool one, Copy cpy) {
    double worst = 0;
    for (int r = 0; r < n; ++r) worst = std::max(worst, sh->us[c][r]);
    printf("%5d %7zuM %-12s %-5s %-9s %8.1f\n", round, total >> 20,
           flag_names[static_cast<int>(fl)], one ? "1" : "2", copies[static_cast<int>(cpy)], worst);
  });
  return 0;
}
