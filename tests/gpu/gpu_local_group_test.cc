// One thread driving every GPU's communicator in one group (nccl-tests -g N): with the shim and
// ZEROCTA_ALLGATHER=zerocta each round's all-gathers go as one local group plan
// (src/local_group_allgather.h). Each round: fresh random inputs, odd sizes, every datatype, in
// place or out of place, a non-blocking stream or the legacy default one, buffers freed and
// allocated again now and then, outputs poisoned with guard bytes around them; checked bitwise
// against the inputs and against NCCL's own all-gather (pncclAllGather, which the shim does not
// see) on the same communicators. Some rounds hold two all-gathers per rank (those go through
// the op exchange one by one) or an all-reduce beside them (NCCL's).
//
// ZEROCTA_LOCAL_GROUP_ROUNDS (default 200) rounds over min(8, visible) GPUs, every
// ZEROCTA_LOCAL_GROUP_TWO_EVERY-th (default 7) with two all-gathers per rank. ZEROCTA_EXPECT_CE=1
// also requires every all-gather to have taken the copy-engine route (the shim's counters);
// ZEROCTA_LOCAL_GROUP_VERBOSE=1 prints each round as it is issued and waited for;
// ZEROCTA_LOCAL_GROUP_ALLOC=cumem takes cuMem memory open to its own GPU only.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cumem_buffer.h"
#include "gpu_gtest.h"
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

// ZEROCTA_LOCAL_GROUP_ALLOC=cumem: buffers in 20 MiB cuMem allocations open to their own GPU
// only (the route maps them a second time for the others); default cudaMalloc.
bool cumem_buffers() {
  const char* v = getenv("ZEROCTA_LOCAL_GROUP_ALLOC");
  return v && std::string(v) == "cumem";
}

// A device allocation with poisoned guards on both sides of its usable bytes.
struct Guarded {
  char* base = nullptr;
  size_t bytes = 0;  // usable
  char* data() const { return base + kGuard; }
  void make(size_t b) {
    drop();
    bytes = b;
    if (cumem_buffers())
      base = static_cast<char*>(cumem_alloc(bytes + 2 * kGuard, size_t{20} << 20));
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

uint64_t ce_calls() {
  GetStatsFn get = shim_get_stats();
  zerocta_stats_t s{};
  if (get == nullptr || get(&s) != 0) return 0;
  return s.counters[zerocta_op_allgather][zerocta_route_ce].calls;
}

TEST(LocalGroup, RandomRoundsMatchNccl) {
  ZG_REQUIRE_GPUS(2);
  const int n = visible_gpu_count() > 8 ? 8 : visible_gpu_count();
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  std::vector<int> devs(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) devs[static_cast<size_t>(d)] = d;
  ZG_NCCL(ncclCommInitAll(comms.data(), n, devs.data()));
  std::vector<Device> dev(static_cast<size_t>(n));
  for (int d = 0; d < n; ++d) {
    ZG_CUDA(cudaSetDevice(d));
    ZG_CUDA(cudaStreamCreateWithFlags(&dev[static_cast<size_t>(d)].stream, cudaStreamNonBlocking));
    dev[static_cast<size_t>(d)].reduce.make(4096);
  }
  const long rounds = env_long("ZEROCTA_LOCAL_GROUP_ROUNDS", 200);
  const bool expect_ce = env_long("ZEROCTA_EXPECT_CE", 0) == 1;
  const long two_every = std::max(1L, env_long("ZEROCTA_LOCAL_GROUP_TWO_EVERY", 7));
  const bool verbose = env_long("ZEROCTA_LOCAL_GROUP_VERBOSE", 0) == 1;
  // Two per rank: each rank's both in turn (default), or (=1) every rank's first, then every
  // rank's second.
  const bool two_by_op = env_long("ZEROCTA_LOCAL_GROUP_TWO_BY_OP", 0) == 1;
  std::mt19937_64 rng(20261126);
  int rounds_in_place = 0, rounds_legacy = 0, rounds_two = 0;
  for (long round = 0; round < rounds; ++round) {
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
    const std::string what = "round " + std::to_string(round) + ": " + std::to_string(chunk) +
                             " B per rank, type " + std::to_string(type) +
                             (in_place ? ", in place" : "") + (legacy ? ", legacy stream" : "") +
                             (two ? ", two per rank" : "") + (reduce ? ", with an all-reduce" : "");
    std::vector<std::vector<unsigned char>> inputs(static_cast<size_t>(n),
                                                   std::vector<unsigned char>(chunk));
    std::vector<char*> send(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d) {
      Device& g = dev[static_cast<size_t>(d)];
      ZG_CUDA(cudaSetDevice(d));
      // Freed and allocated again now and then: the allocator hands out reused addresses.
      const bool renew = round % 11 == 0;
      for (Guarded* b : {&g.recv, &g.ref, &g.second})
        if (renew || b->bytes < total) b->make(total);
      if (renew || g.send.bytes < chunk) g.send.make(chunk);
      for (Guarded* b : {&g.recv, &g.ref, &g.second, &g.send}) b->poison();
      for (auto& byte : inputs[static_cast<size_t>(d)]) byte = static_cast<unsigned char>(rng());
      send[static_cast<size_t>(d)] =
          in_place ? g.recv.data() + chunk * static_cast<size_t>(d) : g.send.data();
      ZG_CUDA(cudaMemcpy(send[static_cast<size_t>(d)], inputs[static_cast<size_t>(d)].data(), chunk,
                         cudaMemcpyHostToDevice));
      // The poison and the input went on the legacy stream, which a non-blocking stream does not
      // wait for (and a copy from pageable memory may return before it lands).
      ZG_CUDA(cudaDeviceSynchronize());
    }
    if (verbose) printf("%s: issuing\n", what.c_str()), fflush(stdout);
    const uint64_t ce_before = ce_calls();
    ZG_NCCL(ncclGroupStart());
    for (int d = 0; d < n; ++d) {
      Device& g = dev[static_cast<size_t>(d)];
      const cudaStream_t s = legacy ? nullptr : g.stream;
      ZG_CUDA(cudaSetDevice(d));
      ZG_NCCL(ncclAllGather(send[static_cast<size_t>(d)], g.recv.data(), count, type,
                            comms[static_cast<size_t>(d)], s));
      if (two && !two_by_op)
        ZG_NCCL(ncclAllGather(send[static_cast<size_t>(d)], g.second.data(), count, type,
                              comms[static_cast<size_t>(d)], s));
      if (reduce)
        ZG_NCCL(ncclAllReduce(g.reduce.data(), g.reduce.data(), 1024, ncclFloat32, ncclSum,
                              comms[static_cast<size_t>(d)], s));
    }
    for (int d = 0; two && two_by_op && d < n; ++d) {
      Device& g = dev[static_cast<size_t>(d)];
      ZG_CUDA(cudaSetDevice(d));
      ZG_NCCL(ncclAllGather(send[static_cast<size_t>(d)], g.second.data(), count, type,
                            comms[static_cast<size_t>(d)], legacy ? nullptr : g.stream));
    }
    ZG_NCCL(ncclGroupEnd());
    // NCCL's own result from the same inputs (in place, the own chunk is still the input).
    ZG_NCCL(pncclGroupStart());
    for (int d = 0; d < n; ++d) {
      Device& g = dev[static_cast<size_t>(d)];
      ZG_CUDA(cudaSetDevice(d));
      ZG_NCCL(pncclAllGather(send[static_cast<size_t>(d)], g.ref.data(), count, type,
                             comms[static_cast<size_t>(d)], legacy ? nullptr : g.stream));
    }
    ZG_NCCL(pncclGroupEnd());
    if (verbose) printf("%s: issued, waiting\n", what.c_str()), fflush(stdout);
    std::vector<unsigned char> expected;
    for (const auto& in : inputs) expected.insert(expected.end(), in.begin(), in.end());
    for (int d = 0; d < n; ++d) {
      Device& g = dev[static_cast<size_t>(d)];
      ZG_CUDA(cudaSetDevice(d));
      wait_stream(legacy ? nullptr : g.stream, what);
      std::vector<unsigned char> got, ref, second;
      const std::string on = what + ", device " + std::to_string(d);
      if (!g.recv.read(&got)) fail(on + ": a guard around the output was overwritten");
      if (!g.ref.read(&ref)) fail(on + ": a guard around NCCL's output was overwritten");
      got.resize(total);
      ref.resize(total);
      if (got != ref) fail(on + ": differs from NCCL's all-gather");
      if (got != expected) fail(on + ": differs from the inputs side by side");
      if (two) {
        if (!g.second.read(&second))
          fail(on + ": a guard around the second output was overwritten");
        second.resize(total);
        if (second != expected) fail(on + ": the second all-gather differs from the inputs");
      }
    }
    if (expect_ce && ce_calls() - ce_before != static_cast<uint64_t>(n * (two ? 2 : 1)))
      fail(what + ": not every all-gather took the copy-engine route (" +
           shim_allgather_stats_line() + ")");
  }
  printf(
      "local group: %ld rounds over %d GPUs (%d in place, %d on the legacy stream, %d with two "
      "all-gathers per rank); %s\n",
      rounds, n, rounds_in_place, rounds_legacy, rounds_two, shim_allgather_stats_line().c_str());
  for (int d = 0; d < n; ++d) {
    Device& g = dev[static_cast<size_t>(d)];
    ZG_CUDA(cudaSetDevice(d));
    for (Guarded* b : {&g.recv, &g.ref, &g.second, &g.send, &g.reduce}) b->drop();
    ZG_CUDA(cudaStreamDestroy(g.stream));
    ZG_NCCL(ncclCommDestroy(comms[static_cast<size_t>(d)]));
  }
}

}  // namespace
}  // namespace zgpu
