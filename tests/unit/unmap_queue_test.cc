// UnmapQueue over a stub driver that records each cuMemUnmap and cuMemAddressFree: a view's
// allocations go a few per call, in order, and its range is freed (and reported) only after
// its last one.
#include "unmap_queue.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace zc {
namespace {

std::vector<std::pair<CUdeviceptr, size_t>> g_unmaps, g_frees;

CUresult stub_unmap(CUdeviceptr p, size_t bytes) {
  g_unmaps.emplace_back(p, bytes);
  return CUDA_SUCCESS;
}
CUresult stub_address_free(CUdeviceptr p, size_t bytes) {
  g_frees.emplace_back(p, bytes);
  return CUDA_SUCCESS;
}

CudaDriver stub_driver() {
  g_unmaps.clear();
  g_frees.clear();
  CudaDriver cu{};
  cu.cuMemUnmap = stub_unmap;
  cu.cuMemAddressFree = stub_address_free;
  return cu;
}

constexpr uint64_t kMiB = 1ull << 20;

struct Report {
  int pid;
  std::vector<uint64_t> blocks;
};

TEST(UnmapQueue, AViewGoesAFewAllocationsPerCallAndItsRangeOnlyAfterTheLast) {
  const CudaDriver cu = stub_driver();
  UnmapQueue q;
  // 10 allocations of 20 MiB and a last one of 2 MiB, back to back at 0x1000000000.
  std::vector<uint64_t> sizes(10, 20 * kMiB), blocks;
  sizes.push_back(2 * kMiB);
  for (size_t i = 0; i < sizes.size(); ++i) blocks.push_back(500 + i);
  q.add(0x1000000000ull, sizes, 7, blocks);
  std::vector<Report> done;
  auto finished = [&](int pid, const std::vector<uint64_t>& b) { done.push_back({pid, b}); };
  for (int call = 0; call < 2; ++call) {
    EXPECT_EQ(q.drain(cu, 4, finished), 4u);
    EXPECT_TRUE(done.empty());
    EXPECT_TRUE(g_frees.empty());
  }
  EXPECT_EQ(q.drain(cu, 4, finished), 3u);
  ASSERT_EQ(g_unmaps.size(), sizes.size());
  uint64_t at = 0x1000000000ull;
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(g_unmaps[i].first, at) << i;
    EXPECT_EQ(g_unmaps[i].second, sizes[i]) << i;
    at += sizes[i];
  }
  ASSERT_EQ(g_frees.size(), 1u);
  EXPECT_EQ(g_frees[0].first, 0x1000000000ull);
  EXPECT_EQ(g_frees[0].second, 202 * kMiB);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].pid, 7);
  EXPECT_EQ(done[0].blocks, blocks);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.drain(cu, 4, finished), 0u);
}

TEST(UnmapQueue, OneCallCanFinishOneViewAndStartTheNext) {
  const CudaDriver cu = stub_driver();
  UnmapQueue q;
  q.add(0x100000, {kMiB, kMiB}, 1, {1, 2});
  q.add(0x900000, {kMiB, kMiB, kMiB}, 2, {3, 4, 5});
  std::vector<int> finished_pids;
  auto finished = [&](int pid, const std::vector<uint64_t>&) { finished_pids.push_back(pid); };
  EXPECT_EQ(q.drain(cu, 3, finished), 3u);
  EXPECT_EQ(finished_pids, std::vector<int>{1});
  ASSERT_EQ(g_frees.size(), 1u);
  EXPECT_EQ(g_unmaps.back().first, 0x900000u);
  EXPECT_FALSE(q.empty());
  q.drain(cu, SIZE_MAX, finished);
  EXPECT_EQ(finished_pids, (std::vector<int>{1, 2}));
  EXPECT_EQ(g_unmaps.size(), 5u);
  ASSERT_EQ(g_frees.size(), 2u);
  EXPECT_EQ(g_frees[1], std::make_pair(CUdeviceptr{0x900000}, size_t{3 * kMiB}));
  EXPECT_TRUE(q.empty());
}

TEST(UnmapQueue, AViewTakenOutPartlyUnmappedIsFinishedWhereItLeftOff) {
  // The housekeeping thread takes the oldest view out (the application's thread may have
  // unmapped part of it already) and finishes it with no queue: the rest of its allocations,
  // then its range; the next view stays queued.
  const CudaDriver cu = stub_driver();
  UnmapQueue q;
  q.add(0x100000, {kMiB, kMiB, kMiB}, 1, {1, 2, 3});
  q.add(0x900000, {kMiB}, 2, {4});
  EXPECT_EQ(q.drain(cu, 1, nullptr), 1u);
  UnmapQueue::View v;
  ASSERT_TRUE(q.take_front(&v));
  EXPECT_EQ(v.unmapped, 1u);
  EXPECT_EQ(v.blocks, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(UnmapQueue::finish(cu, &v, 1), 1u);
  EXPECT_TRUE(g_frees.empty()) << "freed before its last allocation";
  EXPECT_EQ(UnmapQueue::finish(cu, &v), 1u);
  ASSERT_EQ(g_unmaps.size(), 3u);
  EXPECT_EQ(g_unmaps[2].first, CUdeviceptr{0x100000 + 2 * kMiB});
  ASSERT_EQ(g_frees.size(), 1u);
  EXPECT_EQ(g_frees[0], std::make_pair(CUdeviceptr{0x100000}, size_t{3 * kMiB}));
  ASSERT_TRUE(q.take_front(&v));
  EXPECT_EQ(v.pid, 2);
  EXPECT_FALSE(q.take_front(&v));
}

}  // namespace
}  // namespace zc
