// describe_buffer / describe_inside over a stub driver whose "allocations" are 2 MiB cuMem
// mappings back to back, as PyTorch's expandable segments lay out a tensor: an in-place
// all-gather's send chunk is described from its receive buffer's extents with no driver query
// of its own, and gives what describing it afresh gives.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>

#include "peer_memory.h"

namespace zc {
namespace {

constexpr uint64_t kBase = 0x7f0000000000ull;
constexpr uint64_t kAlloc = 2ull << 20;
constexpr int kAllocs = 8;

int g_queries = 0;       // cuPointerGetAttribute calls
int g_allocs = kAllocs;  // allocations the stub driver has

CUresult stub_attribute(void* data, CUpointer_attribute a, CUdeviceptr p) {
  ++g_queries;
  if (p < kBase || p >= kBase + kAlloc * static_cast<uint64_t>(g_allocs))
    return CUDA_ERROR_INVALID_VALUE;
  const uint64_t i = (p - kBase) / kAlloc;
  switch (a) {
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      *static_cast<CUdeviceptr*>(data) = kBase + i * kAlloc;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      *static_cast<size_t*>(data) = kAlloc;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      *static_cast<unsigned long long*>(data) = 1000 + i;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      *static_cast<uint64_t*>(data) = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

CUresult stub_retain(CUmemGenericAllocationHandle* h, void*) {
  *h = 1;
  return CUDA_SUCCESS;
}

CUresult stub_export(void* out, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                     unsigned long long) {
  const int fd = memfd_create("zerocta-peer-memory-test", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(out) = fd;
  return CUDA_SUCCESS;
}

CUresult stub_release(CUmemGenericAllocationHandle) { return CUDA_SUCCESS; }

CudaDriver stub_driver() {
  CudaDriver cu{};
  cu.cuPointerGetAttribute = stub_attribute;
  cu.cuMemRetainAllocationHandle = stub_retain;
  cu.cuMemExportToShareableHandle = stub_export;
  cu.cuMemRelease = stub_release;
  return cu;
}

ReachNeeds across_processes() {
  ReachNeeds n;
  n.by_extents = true;
  return n;
}

void expect_same(const OpBuffer& a, const OpBuffer& b) {
  EXPECT_EQ(a.addr, b.addr);
  EXPECT_EQ(a.bytes, b.bytes);
  ASSERT_EQ(a.nextents, b.nextents);
  for (uint32_t i = 0; i < a.nextents; ++i) {
    EXPECT_EQ(a.extents[i].base, b.extents[i].base) << i;
    EXPECT_EQ(a.extents[i].bytes, b.extents[i].bytes) << i;
    EXPECT_EQ(a.extents[i].block_id, b.extents[i].block_id) << i;
    EXPECT_EQ(a.extents[i].token, b.extents[i].token) << i;
  }
}

TEST(PeerMemory, AnInPlaceSendChunkIsDescribedFromItsReceiveBufferWithNoQuery) {
  const CudaDriver cu = stub_driver();
  const ReachNeeds needs = across_processes();
  // A receive buffer from 4 KiB into the first allocation to 4 KiB before the end of the last;
  // rank 1's chunk of 2 starts where allocation 4 does.
  const uint64_t recv = kBase + 4096;
  const uint64_t total = kAlloc * kAllocs - 8192;
  const uint64_t chunk = total / 2;
  OpBuffer outer, inner, fresh;
  ASSERT_TRUE(describe_buffer(cu, recv, total, needs, &outer));
  EXPECT_EQ(outer.nextents, static_cast<uint32_t>(kAllocs));
  g_queries = 0;
  ASSERT_TRUE(describe_inside(cu, recv + chunk, chunk, needs, outer, &inner));
  EXPECT_EQ(g_queries, 0);
  ASSERT_TRUE(describe_buffer(cu, recv + chunk, chunk, needs, &fresh));
  EXPECT_GT(g_queries, 0);
  expect_same(inner, fresh);
  EXPECT_EQ(inner.nextents, 4u);  // allocations 4..7
}

TEST(PeerMemory, ABufferNotInsideIsDescribedAfresh) {
  const CudaDriver cu = stub_driver();
  const ReachNeeds needs = across_processes();
  OpBuffer outer, inner, fresh;
  ASSERT_TRUE(describe_buffer(cu, kBase, 3 * kAlloc, needs, &outer));
  for (const auto& [addr, bytes] : {std::pair<uint64_t, uint64_t>{kBase + 4 * kAlloc, kAlloc},
                                    {kBase + 2 * kAlloc, 2 * kAlloc}}) {  // outside; overlapping
    g_queries = 0;
    ASSERT_TRUE(describe_inside(cu, addr, bytes, needs, outer, &inner));
    EXPECT_GT(g_queries, 0);
    ASSERT_TRUE(describe_buffer(cu, addr, bytes, needs, &fresh));
    expect_same(inner, fresh);
  }
}

TEST(PeerMemory, InsideAnUndescribableBufferStaysUndescribable) {
  const CudaDriver cu = stub_driver();
  const ReachNeeds needs = across_processes();
  OpBuffer outer, inner;
  // The receive buffer runs past the last allocation: no description, and the op's send chunk
  // at its end is then no better.
  EXPECT_FALSE(describe_buffer(cu, kBase + (kAllocs - 1) * kAlloc, 2 * kAlloc, needs, &outer));
  EXPECT_FALSE(describe_inside(cu, kBase + kAllocs * kAlloc, kAlloc, needs, outer, &inner));
}

// A post describes up to kMaxExtents allocations a buffer (a 10 GiB buffer of PyTorch's 20 MiB
// ones); a buffer across one more is not described (its op goes to NCCL on every rank, or is
// staged by this rank), rather than described in part.
TEST(PeerMemory, ABufferAcrossAsManyAllocationsAsAPostHoldsIsDescribedAndOneMoreIsNot) {
  const CudaDriver cu = stub_driver();
  const ReachNeeds needs = across_processes();
  g_allocs = static_cast<int>(kMaxExtents) + 1;
  std::unique_ptr<OpBuffer> full(new OpBuffer), over(new OpBuffer);
  ASSERT_TRUE(describe_buffer(cu, kBase, kMaxExtents * kAlloc, needs, full.get()));
  EXPECT_EQ(full->nextents, kMaxExtents);
  EXPECT_EQ(full->extents[kMaxExtents - 1].base, kBase + (kMaxExtents - 1) * kAlloc);
  EXPECT_EQ(full->extents[kMaxExtents - 1].block_id, 1000u + kMaxExtents - 1);
  EXPECT_FALSE(describe_buffer(cu, kBase, (kMaxExtents + 1) * kAlloc, needs, over.get()));
  g_allocs = kAllocs;
}

}  // namespace
}  // namespace zc
