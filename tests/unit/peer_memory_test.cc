// describe_buffer / describe_inside over a stub driver whose "allocations" are 2 MiB cuMem
// mappings back to back, as PyTorch's expandable segments lay out a tensor: an in-place
// all-gather's send chunk is described from its receive buffer's extents with no driver query
// of its own, and gives what describing it afresh gives. And PeerImports over the same stub,
// importing this process's own exports through its fd service as a peer's would be: when a view
// is unmapped.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>

#include "fd_exchange.h"
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

// The importing side's mappings: reserved and mapped ranges, and unmaps.
std::atomic<int> g_unmaps{0};
std::atomic<uint64_t> g_next_va{0x7e0000000000ull};

CUresult stub_import(CUmemGenericAllocationHandle* h, void*, CUmemAllocationHandleType) {
  *h = 2;
  return CUDA_SUCCESS;
}

CUresult stub_reserve(CUdeviceptr* va, size_t bytes, size_t, CUdeviceptr, unsigned long long) {
  *va = g_next_va.fetch_add(bytes + kAlloc);
  return CUDA_SUCCESS;
}

CUresult stub_map(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) {
  return CUDA_SUCCESS;
}

CUresult stub_set_access(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) {
  return CUDA_SUCCESS;
}

CUresult stub_unmap(CUdeviceptr, size_t) {
  ++g_unmaps;
  return CUDA_SUCCESS;
}

CUresult stub_address_free(CUdeviceptr, size_t) { return CUDA_SUCCESS; }

CudaDriver stub_driver() {
  CudaDriver cu{};
  cu.cuPointerGetAttribute = stub_attribute;
  cu.cuMemRetainAllocationHandle = stub_retain;
  cu.cuMemExportToShareableHandle = stub_export;
  cu.cuMemRelease = stub_release;
  cu.cuMemImportFromShareableHandle = stub_import;
  cu.cuMemAddressReserve = stub_reserve;
  cu.cuMemMap = stub_map;
  cu.cuMemSetAccess = stub_set_access;
  cu.cuMemUnmap = stub_unmap;
  cu.cuMemAddressFree = stub_address_free;
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

// The done flag of the op that used a view, as op_exchange.h keeps it: host memory the push
// stream writes, which a failure's release_all sets far ahead.
struct ViewInUse {
  const CudaDriver cu = stub_driver();
  std::unique_ptr<OpBuffer> buf{new OpBuffer};
  uint32_t done_flag = 0;
  uint64_t seq = 7;
  std::unique_ptr<PeerImports> imports{new PeerImports(0)};

  // Maps this process's two allocations at kBase as a peer's buffer, for op `seq`.
  void map() {
    ASSERT_NE(fd_service(), nullptr);
    ASSERT_TRUE(describe_buffer(cu, kBase, 2 * kAlloc, across_processes(), buf.get()));
    Span span{};
    const char* why = "";
    ASSERT_TRUE(imports->resolve(cu, *buf, getpid(), fd_service()->address(), kBase, 2 * kAlloc,
                                 seq, DoneMark{&done_flag, static_cast<uint32_t>(seq)}, &span,
                                 &why))
        << why;
    ASSERT_NE(span.addr, 0u);
  }
  // What every path that may unmap does with it: the application's thread around an op, a
  // suspended communicator, the budget.
  void try_every_release() {
    imports->release_while_idle(cu, 0);
    imports->tidy(cu, false, 0);
    imports->release_idle(cu);
  }
};

TEST(PeerMemory, AViewWhoseOpsFinishedIsUnmapped) {
  ViewInUse v;
  v.map();
  const int before = g_unmaps.load();
  v.try_every_release();
  EXPECT_EQ(g_unmaps.load(), before) << "unmapped while its op's copies may run";
  v.done_flag = static_cast<uint32_t>(v.seq);  // the push stream says the copies finished
  v.try_every_release();
  EXPECT_EQ(g_unmaps.load(), before + 2) << "one unmap per allocation of the view";
}

// The push issuer resolves op 7's deferred push into a view after the application's thread
// resolved op 8's push into the same view: the view stays mapped until op 8's copies are done,
// whose flag comes last; op 7's finishing says nothing about them.
TEST(PeerMemory, AnOlderOpResolvedLateDoesNotTakeBackTheNewerOpsDoneMark) {
  ViewInUse v;
  v.map();  // op 7, as the fixture's seq
  const int before = g_unmaps.load();
  uint32_t newer_done = 0;
  Span span{};
  const char* why = "";
  ASSERT_TRUE(v.imports->resolve(v.cu, *v.buf, getpid(), fd_service()->address(), kBase,
                                 2 * kAlloc, 8, DoneMark{&newer_done, 8}, &span, &why))
      << why;
  // Op 7 again, late (the issuer's step for it).
  ASSERT_TRUE(v.imports->resolve(v.cu, *v.buf, getpid(), fd_service()->address(), kBase,
                                 2 * kAlloc, 7, DoneMark{&v.done_flag, 7}, &span, &why))
      << why;
  v.done_flag = 7;  // op 7's copies finished; op 8's may still run
  v.try_every_release();
  EXPECT_EQ(g_unmaps.load(), before) << "unmapped while the newer op's copies may run";
  newer_done = 8;
  v.try_every_release();
  EXPECT_EQ(g_unmaps.load(), before + 2);
}

// A failure releases every flag (route_setup.cc, release_flags): the done flag then passes
// whether or not the copies into the view ran — a copy queued behind a released wait, or one the
// push issuer resolved and issues next, still writes through it. No path may unmap it before the
// communicator's resources are freed (after its streams drained, parked_routes.h; the
// destructor unmaps through the process's driver, which this stub is not).
TEST(PeerMemory, AfterAFailureReleasedTheFlagsNoViewIsUnmappedUntilTheImportsAreFreed) {
  ViewInUse v;
  v.map();
  const int before = g_unmaps.load();
  v.imports->freeze();
  __atomic_store_n(&v.done_flag, static_cast<uint32_t>(v.seq) + (1u << 30), __ATOMIC_RELEASE);
  v.try_every_release();
  EXPECT_EQ(g_unmaps.load(), before);
}

}  // namespace
}  // namespace zc
