// One thread driving every GPU's communicator in one group (nccl-tests -g N): with the shim and
// ZEROCTA_ALLGATHER=zerocta each round's all-gathers go as local group sets
// (src/collectives/allgather/local_group_allgather.h). Each round: fresh random inputs, odd sizes, every datatype, in
// place or out of place, a non-blocking stream or the legacy default one, buffers freed and
// allocated again now and then, outputs poisoned with guard bytes around them; checked bitwise
// against the inputs and against NCCL's own all-gather (pncclAllGather, which the shim does not
// see) on the same communicators. Some rounds hold two all-gathers per rank (two sets) or an
// all-reduce beside them (NCCL's).
//
// ZCTEST_LOCAL_GROUP_ROUNDS (default 200) rounds over min(8, visible) GPUs, every
// ZCTEST_LOCAL_GROUP_TWO_EVERY-th (default 7) with two all-gathers per rank. ZCTEST_EXPECT_CE=1
// also requires every all-gather to have taken the copy-engine route (the shim's counters) —
// or, for cudaMalloc buffers of processes with several GPUs each, to have gone to NCCL;
// ZCTEST_LOCAL_GROUP_VERBOSE=1 prints each round as it is issued and waited for;
// ZCTEST_LOCAL_GROUP_TIME_MIB=S then times in-place all-gathers of S MiB per rank against
// NCCL's kernel path and its copy-engine path on symmetric windows;
// ZCTEST_LOCAL_GROUP_ALLOC=cumem takes cuMem memory open to its own GPU only, cumem-shared
// open to every GPU of its process (both exportable, so that processes with several GPUs each
// reach the other processes' buffers by import).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cumem_buffer.h"
#include "gpu_gtest.h"
#include "mp_harness.h"
#include "rank_util.h"

namespace zgpu {
namespace {

constexpr size_t kGuard = 256;
constexpr unsigned char kPoison = 0xAB;
const size_t kSizes[] = {
    1, 3, 4100, 65543, (size_t{1} << 20) + 13, (size_t{8} << 20) + 6, size_t{64} << 20};
const ncclDataType_t kTypes[] = {ncclInt8,    ncclInt32,   ncclFloat16, ncclBfloat16,
                                 ncclFloat32, ncclFloat64, ncclUint64};

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

// ZCTEST_LOCAL_GROUP_ALLOC=cumem: buffers in 20 MiB cuMem allocations open to their own GPU
// only (the route maps them a second time for the others); cumem-shared: open to every GPU of
// this process too (as PyTorch's expandable segments once peer access is enabled); default
// cudaMalloc.
std::string alloc_kind() {
  const char* v = getenv("ZCTEST_LOCAL_GROUP_ALLOC");
  return v ? v : "";
}
bool cumem_buffers() { return alloc_kind() == "cumem" || alloc_kind() == "cumem-shared"; }
// This process's GPUs (set once the layout is known): whom cumem-shared buffers are open to.
std::vector<int> g_process_devices;

// A device allocation with poisoned guards on both sides of its usable bytes.
struct Guarded {
  char* base = nullptr;
  size_t bytes = 0;  // usable
  char* data() const { return base + kGuard; }
  void make(size_t b) {
    drop();
    bytes = b;
    if (cumem_buffers())
      base = static_cast<char*>(
          cumem_alloc(bytes + 2 * kGuard, size_t{20} << 20, false,
                      alloc_kind() == "cumem-shared" ? g_process_devices : std::vector<int>{}));
    else
      ZG_CUDA(cudaMalloc(&base, bytes + 2 * kGuard));
  }
  void drop() {
    if (!base) return;
    if (cumem_buffers())
      cumem_free(base);
    else
      ZG_CUDA(cudaFree(base));
    base = nullptr;
  }
  void poison() const { ZG_CUDA(cudaMemset(base, kPoison, bytes + 2 * kGuard)); }
  // The usable bytes, and whether both guards are intact.
  bool read(std::vector<unsigned char>* out) const {
    std::vector<unsigned char> all(bytes + 2 * kGuard);
    ZG_CUDA(cudaMemcpy(all.data(), base, all.size(), cudaMemcpyDeviceToHost));
    out->assign(all.begin() + kGuard, all.begin() + kGuard + bytes);
    for (size_t i = 0; i < kGuard; ++i)
      if (all[i] != kPoison || all[kGuard + bytes + i] != kPoison) return false;
    return true;
  }
};

struct Device {
  cudaStream_t stream = nullptr;
  Guarded recv, send, ref, second, reduce;
};

// This process's all-gathers that took `route` so far (the shim's counters).
uint64_t allgather_calls(zerocta_route_t route) {
  GetStatsFn get = shim_get_stats();
  zerocta_stats_t s{};
  if (get == nullptr || get(&s) != 0) return 0;
  return s.counters[zerocta_op_allgather][route].calls;
}

// The ranks of one communicator that this process drives from its one thread: global rank
// first + i on device devices[i]; nranks in all.
struct Layout {
  int nranks = 0, first = 0;
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  int local() const { return static_cast<int>(devices.size()); }
};

// The random rounds over `l` (every process of a communicator draws the same rounds and every
// rank's inputs, so each knows the whole expected output). Returns the all-gathers issued.
long run_rounds(Layout& l, const char* who) {
  const int n = l.nranks, m = l.local();
  g_process_devices = l.devices;
  std::vector<Device> dev(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) {
    ZG_CUDA(cudaSetDevice(l.devices[static_cast<size_t>(i)]));
    ZG_CUDA(cudaStreamCreateWithFlags(&dev[static_cast<size_t>(i)].stream, cudaStreamNonBlocking));
    dev[static_cast<size_t>(i)].reduce.make(4096);
  }
  const long rounds = env_long("ZCTEST_LOCAL_GROUP_ROUNDS", 200);
  const bool expect_ce = env_long("ZCTEST_EXPECT_CE", 0) == 1;
  // cudaMalloc buffers that another process would have to reach go to NCCL on every rank by
  // design (legacy IPC has no release protocol): there ZCTEST_EXPECT_CE=1 asks that every
  // all-gather went to NCCL instead.
  const bool to_nccl = n > m && !cumem_buffers();
  const zerocta_route_t expected_route = to_nccl ? zerocta_route_passthrough : zerocta_route_ce;
  const long two_every = std::max(1L, env_long("ZCTEST_LOCAL_GROUP_TWO_EVERY", 7));
  const bool verbose = env_long("ZCTEST_LOCAL_GROUP_VERBOSE", 0) == 1;
  // Two per rank: each rank's both in turn (default), or (=1) every rank's first, then every
  // rank's second.
  const bool two_by_op = env_long("ZCTEST_LOCAL_GROUP_TWO_BY_OP", 0) == 1;
  std::mt19937_64 rng(20261126);
  int rounds_in_place = 0, rounds_legacy = 0, rounds_two = 0;
  long issued = 0;
  auto on = [&](int i) {
    ZG_CUDA(cudaSetDevice(l.devices[static_cast<size_t>(i)]));
    return &dev[static_cast<size_t>(i)];
  };
  auto comm = [&](int i) { return l.comms[static_cast<size_t>(i)]; };
  for (long round = 0; round < rounds; ++round) {
    heartbeat();
    const ncclDataType_t type = kTypes[rng() % (sizeof(kTypes) / sizeof(kTypes[0]))];
    const size_t ts = type_size(type);
    const size_t want = kSizes[rng() % (sizeof(kSizes) / sizeof(kSizes[0]))];
    const size_t count = want / ts ? want / ts : 1;
    const size_t chunk = count * ts, total = chunk * static_cast<size_t>(n);
    const bool in_place = rng() % 2 == 0, legacy = rng() % 4 == 0;
    const bool two = round % two_every == (two_every - 1) / 2, reduce = round % 5 == 1;
    rounds_in_place += in_place;
    rounds_legacy += legacy;
    rounds_two += two;
    const std::string what = std::string(who) + " round " + std::to_string(round) + ": " +
                             std::to_string(chunk) + " B per rank, type " + std::to_string(type) +
                             (in_place ? ", in place" : "") + (legacy ? ", legacy stream" : "") +
                             (two ? ", two per rank" : "") + (reduce ? ", with an all-reduce" : "");
    std::vector<std::vector<unsigned char>> inputs(static_cast<size_t>(n),
                                                   std::vector<unsigned char>(chunk));
    for (auto& in : inputs)
      for (auto& byte : in) byte = static_cast<unsigned char>(rng());
    std::vector<char*> send(static_cast<size_t>(m));
    for (int i = 0; i < m; ++i) {
      Device& g = *on(i);
      const size_t r = static_cast<size_t>(l.first + i);
      // Freed and allocated again now and then: the allocator hands out reused addresses.
      const bool renew = round % 11 == 0;
      for (Guarded* b : {&g.recv, &g.ref, &g.second})
        if (renew || b->bytes < total) b->make(total);
      if (renew || g.send.bytes < chunk) g.send.make(chunk);
      for (Guarded* b : {&g.recv, &g.ref, &g.second, &g.send}) b->poison();
      send[static_cast<size_t>(i)] = in_place ? g.recv.data() + chunk * r : g.send.data();
      ZG_CUDA(cudaMemcpy(send[static_cast<size_t>(i)], inputs[r].data(), chunk,
                         cudaMemcpyHostToDevice));
      // The poison and the input went on the legacy stream, which a non-blocking stream does not
      // wait for (and a copy from pageable memory may return before it lands).
      ZG_CUDA(cudaDeviceSynchronize());
    }
    if (verbose) printf("%s: issuing\n", what.c_str()), fflush(stdout);
    const uint64_t routed_before = allgather_calls(expected_route);
    ZG_NCCL(ncclGroupStart());
    for (int i = 0; i < m; ++i) {
      Device& g = *on(i);
      const cudaStream_t s = legacy ? nullptr : g.stream;
      ZG_NCCL(ncclAllGather(send[static_cast<size_t>(i)], g.recv.data(), count, type, comm(i), s));
      if (two && !two_by_op)
        ZG_NCCL(
            ncclAllGather(send[static_cast<size_t>(i)], g.second.data(), count, type, comm(i), s));
      if (reduce)
        ZG_NCCL(ncclAllReduce(g.reduce.data(), g.reduce.data(), 1024, ncclFloat32, ncclSum, comm(i),
                              s));
    }
    for (int i = 0; two && two_by_op && i < m; ++i) {
      Device& g = *on(i);
      ZG_NCCL(ncclAllGather(send[static_cast<size_t>(i)], g.second.data(), count, type, comm(i),
                            legacy ? nullptr : g.stream));
    }
    ZG_NCCL(ncclGroupEnd());
    // NCCL's own result from the same inputs (in place, the own chunk is still the input).
    ZG_NCCL(pncclGroupStart());
    for (int i = 0; i < m; ++i) {
      Device& g = *on(i);
      ZG_NCCL(pncclAllGather(send[static_cast<size_t>(i)], g.ref.data(), count, type, comm(i),
                             legacy ? nullptr : g.stream));
    }
    ZG_NCCL(pncclGroupEnd());
    if (verbose) printf("%s: issued, waiting\n", what.c_str()), fflush(stdout);
    std::vector<unsigned char> expected;
    for (const auto& in : inputs) expected.insert(expected.end(), in.begin(), in.end());
    for (int i = 0; i < m; ++i) {
      Device& g = *on(i);
      wait_stream(legacy ? nullptr : g.stream, what);
      std::vector<unsigned char> got, ref, second;
      const std::string at = what + ", rank " + std::to_string(l.first + i);
      if (!g.recv.read(&got)) fail(at + ": a guard around the output was overwritten");
      if (!g.ref.read(&ref)) fail(at + ": a guard around NCCL's output was overwritten");
      got.resize(total);
      ref.resize(total);
      if (got != ref) fail(at + ": differs from NCCL's all-gather");
      if (got != expected) fail(at + ": differs from the inputs side by side");
      if (two) {
        if (!g.second.read(&second))
          fail(at + ": a guard around the second output was overwritten");
        second.resize(total);
        if (second != expected) fail(at + ": the second all-gather differs from the inputs");
      }
    }
    const long ops = m * (two ? 2 : 1);
    issued += ops;
    if (expect_ce && allgather_calls(expected_route) - routed_before != static_cast<uint64_t>(ops))
      fail(what +
           (to_nccl ? ": not every all-gather of cudaMalloc buffers across processes went to NCCL ("
                    : ": not every all-gather took the copy-engine route (") +
           shim_allgather_stats_line() + ")");
  }
  if (const long mib = env_long("ZCTEST_LOCAL_GROUP_TIME_MIB", 0); mib > 0) {
    // Back-to-back in-place all-gathers of `mib` MiB per rank on the same communicators: the
    // route (ncclAllGather), NCCL's kernel path (pncclAllGather on the same buffers) and NCCL's
    // copy-engine path (pncclAllGather on ncclMemAlloc buffers registered as symmetric windows;
    // the shim gave the communicators the zero-CTA policy). Busbw per path, median of 5 runs of
    // 20 (a comparison, not a check).
    const size_t chunk = static_cast<size_t>(mib) << 20, total = chunk * static_cast<size_t>(n);
    std::vector<char*> plain(static_cast<size_t>(m)), windowed(static_cast<size_t>(m));
    std::vector<ncclWindow_t> wins(static_cast<size_t>(m), nullptr);
    for (int i = 0; i < m; ++i) {
      on(i)->recv.make(total);
      plain[static_cast<size_t>(i)] = on(i)->recv.data();
      void* w = nullptr;
      ZG_NCCL(ncclMemAlloc(&w, total));
      windowed[static_cast<size_t>(i)] = static_cast<char*>(w);
    }
    ZG_NCCL(ncclGroupStart());
    for (int i = 0; i < m; ++i) {
      on(i);
      ZG_NCCL(ncclCommWindowRegister(comm(i), windowed[static_cast<size_t>(i)], total,
                                     &wins[static_cast<size_t>(i)], NCCL_WIN_COLL_SYMMETRIC));
    }
    ZG_NCCL(ncclGroupEnd());
    std::vector<cudaEvent_t> t0(static_cast<size_t>(m)), t1(static_cast<size_t>(m));
    for (int i = 0; i < m; ++i) {
      on(i);
      ZG_CUDA(cudaEventCreate(&t0[static_cast<size_t>(i)]));
      ZG_CUDA(cudaEventCreate(&t1[static_cast<size_t>(i)]));
    }
    struct Path {
      const char* name;
      bool route;
      std::vector<char*>* buffers;
    };
    const Path paths[] = {{"ncclAllGather (zerocta's route)", true, &plain},
                          {"pncclAllGather (NCCL kernel path)", false, &plain},
                          {"pncclAllGather on symmetric windows (NCCL CE path)", false, &windowed}};
    for (const Path& path : paths) {
      auto group = [&](int ops) {
        for (int k = 0; k < ops; ++k) {
          ZG_NCCL(ncclGroupStart());
          for (int i = 0; i < m; ++i) {
            Device& g = *on(i);
            char* out = (*path.buffers)[static_cast<size_t>(i)];
            char* mine = out + chunk * static_cast<size_t>(l.first + i);
            ZG_NCCL(path.route ? ncclAllGather(mine, out, chunk, ncclInt8, comm(i), g.stream)
                               : pncclAllGather(mine, out, chunk, ncclInt8, comm(i), g.stream));
          }
          ZG_NCCL(ncclGroupEnd());
        }
      };
      // The route's own doings over the timed runs (pairs, host time per op), from the shim.
      using ResetFn = void (*)();
      using WriteFn = int (*)(const char*);
      auto reset = reinterpret_cast<ResetFn>(dlsym(RTLD_DEFAULT, "zerocta_reset_stats"));
      auto write = reinterpret_cast<WriteFn>(dlsym(RTLD_DEFAULT, "zerocta_write_stats_json"));
      std::vector<double> busbw;
      for (int run = 0; run < 6; ++run) {
        barrier();  // every process starts the run together (a no-op in one process)
        if (run == 1 && path.route && reset) reset();
        for (int i = 0; i < m; ++i)
          ZG_CUDA(cudaEventRecord(t0[static_cast<size_t>(i)], on(i)->stream));
        group(run == 0 ? 3 : 20);  // the first run warms up
        double slowest = 0;
        for (int i = 0; i < m; ++i) {
          ZG_CUDA(cudaEventRecord(t1[static_cast<size_t>(i)], on(i)->stream));
          wait_stream(on(i)->stream, "timing");
          float ms = 0;
          ZG_CUDA(
              cudaEventElapsedTime(&ms, t0[static_cast<size_t>(i)], t1[static_cast<size_t>(i)]));
          slowest = std::max(slowest, static_cast<double>(ms));
        }
        if (run > 0)
          busbw.push_back(static_cast<double>(total) * (n - 1) / n / (slowest / 20 * 1e-3) / 1e9);
      }
      if (path.route && write) {
        const std::string file = "/tmp/zerocta-local-group-time-" + std::to_string(getpid());
        std::string json;
        if (write(file.c_str()) == 0) {
          std::ifstream in(file);
          json.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
          unlink(file.c_str());
        }
        const size_t at = json.find("\"route\":{"), end = json.find('}', at);
        if (at != std::string::npos && end != std::string::npos)
          printf("%s: the route over the timed runs: %s\n", who,
                 json.substr(at, end - at + 1).c_str());
      }
      std::sort(busbw.begin(), busbw.end());
      printf(
          "%s: %ld MiB per rank in place, %s: busbw %.1f GB/s (median of 5 runs of 20; "
          "%.1f..%.1f)\n",
          who, mib, path.name, busbw[2], busbw.front(), busbw.back());
      fflush(stdout);
    }
    ZG_NCCL(ncclGroupStart());
    for (int i = 0; i < m; ++i) {
      on(i);
      ZG_NCCL(ncclCommWindowDeregister(comm(i), wins[static_cast<size_t>(i)]));
    }
    ZG_NCCL(ncclGroupEnd());
    for (int i = 0; i < m; ++i) {
      on(i);
      ZG_NCCL(ncclMemFree(windowed[static_cast<size_t>(i)]));
      ZG_CUDA(cudaEventDestroy(t0[static_cast<size_t>(i)]));
      ZG_CUDA(cudaEventDestroy(t1[static_cast<size_t>(i)]));
    }
  }
  printf(
      "%s: %ld rounds over %d of %d ranks (%d in place, %d on the legacy stream, %d with two "
      "all-gathers per rank); %s\n",
      who, rounds, m, n, rounds_in_place, rounds_legacy, rounds_two,
      shim_allgather_stats_line().c_str());
  fflush(stdout);
  for (int i = 0; i < m; ++i) {
    Device& g = *on(i);
    for (Guarded* b : {&g.recv, &g.ref, &g.second, &g.send, &g.reduce}) b->drop();
    ZG_CUDA(cudaStreamDestroy(g.stream));
  }
  return issued;
}

// One process whose one thread drives every GPU, run as the harness's one rank: the gtest
// process itself never touches CUDA, or the next test's forked ranks could not (a CUDA context
// does not survive fork(): "initialization error" in every child).
TEST(LocalGroup, RandomRoundsMatchNccl) {
  ZG_REQUIRE_GPUS(2);
  const int gpus = visible_gpu_count() > 8 ? 8 : visible_gpu_count();
  RunResult result = run_ranks(
      1,
      [gpus](const RankContext&) {
        Layout l;
        l.nranks = gpus;
        l.comms.resize(static_cast<size_t>(l.nranks));
        for (int d = 0; d < l.nranks; ++d) l.devices.push_back(d);
        ZG_NCCL(ncclCommInitAll(l.comms.data(), l.nranks, l.devices.data()));
        run_rounds(l, "local group");
        for (ncclComm_t c : l.comms) ZG_NCCL(ncclCommDestroy(c));
        return 0;
      },
      default_run_options(1800));
  EXPECT_TRUE(result.ok()) << result.summary();
}

// Processes that drive several GPUs each (ZCTEST_LOCAL_GROUP_PROCESSES, default 2, over
// min(8, visible) GPUs split evenly; an MPI job of nccl-tests -g 2 per process): each process's
// ranks issue their all-gathers in one group of its thread, and the route pairs them with the
// other process's through the op exchange — pairs in one process and pairs across processes in
// the same op.
TEST(LocalGroup, ProcessesWithSeveralGpusEachMatchNccl) {
  const int procs = static_cast<int>(env_long("ZCTEST_LOCAL_GROUP_PROCESSES", 2));
  const int gpus = visible_gpu_count() > 8 ? 8 : visible_gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no GPU";
  if (procs < 2 || gpus < 2 * procs || gpus % procs != 0)
    GTEST_SKIP() << "needs 2 GPUs per process for " << procs << " processes, " << gpus
                 << " visible";
  const int per = gpus / procs;
  RunResult result = run_ranks(
      procs,
      [gpus, per](const RankContext& ctx) {
        Layout l;
        l.nranks = gpus;
        l.first = ctx.rank * per;
        l.comms.resize(static_cast<size_t>(per));
        ZG_NCCL(ncclGroupStart());
        for (int i = 0; i < per; ++i) {
          l.devices.push_back(l.first + i);
          ZG_CUDA(cudaSetDevice(l.first + i));
          ZG_NCCL(
              ncclCommInitRank(&l.comms[static_cast<size_t>(i)], gpus, ctx.ids[0], l.first + i));
        }
        ZG_NCCL(ncclGroupEnd());
        const std::string who = "process " + std::to_string(ctx.rank);
        run_rounds(l, who.c_str());
        for (ncclComm_t c : l.comms) ZG_NCCL(ncclCommDestroy(c));
        return 0;
      },
      default_run_options(600));
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace zgpu
