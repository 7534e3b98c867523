// Communicators made the ways single-process programs make them, and all-gathers on them
// checked bitwise (an all-gather's result is the ranks' inputs side by side, exactly):
//   GroupedInitOneThread  one thread creates a communicator per GPU inside ncclGroupStart/End
//                         (nccl-tests, MPI launches): NCCL fills rank, size and device in only
//                         at the group's end;
//   InitAllAndSplits      ncclCommInitAll, then NULL-config splits of every communicator.
// With the shim and ZEROCTA_ALLGATHER=auto|zerocta, ZCTEST_EXPECT_CE=1 also requires every
// all-gather at or above ZEROCTA_MIN_BYTES to have taken the copy-engine route. Run under
// NCCL_DEBUG_SUBSYS=COLL with and without the shim, the COLL lines of both runs must be the
// same (tests/gpu/coll_sequence.py compares them).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_gtest.h"
#include "rank_util.h"

namespace zgpu {
namespace {

int gpus_for_test() {
  const int n = visible_gpu_count();
  return n > 8 ? 8 : n;
}

// One thread drives every communicator: each round is one group (NCCL's rule for a thread
// that drives several communicators).
void allgather_round(const std::vector<ncclComm_t>& comms, size_t per_rank, bool in_place,
                     uint32_t seed, const char* what) {
  const int n = static_cast<int>(comms.size());
  std::vector<std::vector<unsigned char>> inputs(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  for (auto& in : inputs) {
    in.resize(per_rank);
    for (auto& b : in) b = static_cast<unsigned char>(rng());
  }
  std::vector<void*> recv(static_cast<size_t>(n)), send(static_cast<size_t>(n));
  std::vector<cudaStream_t> streams(static_cast<size_t>(n));
  std::vector<int> rank(static_cast<size_t>(n));  // of the communicator on device d
  for (int d = 0; d < n; ++d) {
    const size_t i = static_cast<size_t>(d);
    ZG_NCCL(ncclCommUserRank(comms[i], &rank[i]));
    ZG_CUDA(cudaSetDevice(d));
    ZG_CUDA(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    ZG_CUDA(cudaMalloc(&recv[i], per_rank * n));
    ZG_CUDA(cudaMemset(recv[i], 0xEE, per_rank * n));  // poisoned output
    if (in_place) {
      send[i] = static_cast<char*>(recv[i]) + per_rank * static_cast<size_t>(rank[i]);
    } else {
      ZG_CUDA(cudaMalloc(&send[i], per_rank));
    }
    ZG_CUDA(cudaMemcpy(send[i], inputs[i].data(), per_rank, cudaMemcpyHostToDevice));
  }
  ZG_NCCL(ncclGroupStart());
  for (int d = 0; d < n; ++d) {
    const size_t i = static_cast<size_t>(d);
    ZG_CUDA(cudaSetDevice(d));
    ZG_NCCL(ncclAllGather(send[i], recv[i], per_rank, ncclUint8, comms[i], streams[i]));
  }
  ZG_NCCL(ncclGroupEnd());
  std::vector<unsigned char> got(per_rank * n);
  for (int d = 0; d < n; ++d) {
    const size_t i = static_cast<size_t>(d);
    ZG_CUDA(cudaSetDevice(d));
    wait_stream(streams[i], what);
    ZG_CUDA(cudaMemcpy(got.data(), recv[i], got.size(), cudaMemcpyDeviceToHost));
    for (int src = 0; src < n; ++src) {
      const size_t at = per_rank * static_cast<size_t>(rank[static_cast<size_t>(src)]);
      if (memcmp(got.data() + at, inputs[static_cast<size_t>(src)].data(), per_rank) != 0)
        fail(std::string(what) + ": device " + std::to_string(d) + " has wrong bytes from device " +
             std::to_string(src) + " (" + std::to_string(per_rank) + " B per rank" +
             (in_place ? ", in place)" : ")"));
    }
    ZG_CUDA(cudaFree(recv[i]));
    if (!in_place) ZG_CUDA(cudaFree(send[i]));
    ZG_CUDA(cudaStreamDestroy(streams[i]));
  }
}

uint64_t ce_calls() {
  GetStatsFn get = shim_get_stats();
  zerocta_stats_t s{};
  if (get == nullptr || get(&s) != 0) return 0;
  return s.counters[zerocta_op_allgather][zerocta_route_ce].calls;
}

// Sizes from a few bytes to 64 MiB per rank, odd ones included; in and out of place.
void check_allgathers(const std::vector<ncclComm_t>& comms, const char* what) {
  const uint64_t before = ce_calls();
  const size_t sizes[] = {1, 4097, 1 << 20, (32u << 20) + 12, 64u << 20};
  uint32_t seed = 1;
  int big = 0;
  for (size_t per_rank : sizes)
    for (bool in_place : {false, true}) {
      allgather_round(comms, per_rank, in_place, seed++, what);
      if (per_rank * comms.size() >= (64u << 20)) ++big;
    }
  const uint64_t routed = (ce_calls() - before) / comms.size();
  printf("%s: %zu communicators, %llu all-gathers per communicator on the copy-engine route\n",
         what, comms.size(), static_cast<unsigned long long>(routed));
  if (env_long("ZCTEST_EXPECT_CE", 0) != 0 && routed < static_cast<uint64_t>(big))
    fail(std::string(what) +
         ": expected the copy-engine route for every all-gather of 64 MiB "
         "or more, got " +
         std::to_string(routed) + " of " + std::to_string(big));
}

void destroy_all(std::vector<ncclComm_t>* comms) {
  for (ncclComm_t c : *comms) ZG_NCCL(ncclCommDestroy(c));
  comms->clear();
}

TEST(CreationPaths, GroupedInitOneThread) {
  ZG_REQUIRE_GPUS(2);
  const int n = gpus_for_test();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int d = 0; d < n; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    ASSERT_EQ(ncclCommInitRank(&comms[static_cast<size_t>(d)], n, id, d), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  try {
    check_allgathers(comms, "grouped init");
  } catch (const std::exception& e) {
    FAIL() << e.what();
  }
  destroy_all(&comms);
}

TEST(CreationPaths, InitAllAndSplits) {
  ZG_REQUIRE_GPUS(2);
  const int n = gpus_for_test();
  std::vector<ncclComm_t> comms(static_cast<size_t>(n)), children(static_cast<size_t>(n));
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int d = 0; d < n; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    // Keys in reverse: the child's ranks run the other way round.
    ASSERT_EQ(ncclCommSplit(comms[static_cast<size_t>(d)], 0, n - d,
                            &children[static_cast<size_t>(d)], nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int d = 0; d < n; ++d) {
    int r = -1;
    ASSERT_EQ(ncclCommUserRank(children[static_cast<size_t>(d)], &r), ncclSuccess);
    ASSERT_EQ(r, n - 1 - d);
  }
  try {
    check_allgathers(comms, "InitAll");
    check_allgathers(children, "split of InitAll");
  } catch (const std::exception& e) {
    FAIL() << e.what();
  }
  destroy_all(&children);
  destroy_all(&comms);
}

}  // namespace
}  // namespace zgpu
