// issue_plan (ce_exec.h): a plan's operations become driver calls in plan order, a stream's
// consecutive flag waits and writes in one cuStreamBatchMemOp.
#include "ce_exec.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "capture_blocks.h"

namespace zc {
namespace {

// What the stub driver saw, one string per call (a batch: one per operation, after its header).
std::vector<std::string> g_calls;
CUresult g_batch_result = CUDA_SUCCESS;

CUstream stream_id(int k) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(0x100 + k)); }
std::string name(CUstream s) {
  return "s" + std::to_string(reinterpret_cast<uintptr_t>(s) - 0x100);
}

CUresult stub_batch(CUstream s, unsigned n, CUstreamBatchMemOpParams* p, unsigned flags) {
  g_calls.push_back("batch " + name(s) + " n=" + std::to_string(n) +
                    " flags=" + std::to_string(flags));
  for (unsigned k = 0; k < n; ++k) {
    const auto& w = p[k].waitValue;
    switch (p[k].operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32:
        g_calls.push_back(" wait32 @" + std::to_string(w.address) +
                          " >=" + std::to_string(w.value) +
                          (w.flags == CU_STREAM_WAIT_VALUE_GEQ ? "" : "?"));
        break;
      case CU_STREAM_MEM_OP_WAIT_VALUE_64:
        g_calls.push_back(" wait64 @" + std::to_string(w.address) +
                          (w.value64 == kCaptureWaitMask && w.flags == CU_STREAM_WAIT_VALUE_AND
                               ? " signal"
                               : " ?"));
        break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32:
        g_calls.push_back(" write32 @" + std::to_string(p[k].writeValue.address) + " =" +
                          std::to_string(p[k].writeValue.value));
        break;
      default:
        g_calls.push_back(" ?");
    }
  }
  return g_batch_result;
}
CUresult stub_copy(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  g_calls.push_back("copy " + name(s) + " " + std::to_string(src) + "->" + std::to_string(dst) +
                    " " + std::to_string(bytes));
  return CUDA_SUCCESS;
}
CUresult stub_copy_batch(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t n,
                         CUmemcpyAttributes* attrs, size_t* attr_idx, size_t nattrs, CUstream s) {
  const bool ncclish = nattrs == 1 && attr_idx[0] == 0 &&
                       attrs[0].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_STREAM &&
                       attrs[0].flags == CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
  g_calls.push_back("copybatch " + name(s) + " n=" + std::to_string(n) + (ncclish ? "" : " ?"));
  for (size_t k = 0; k < n; ++k)
    g_calls.push_back(" " + std::to_string(srcs[k]) + "->" + std::to_string(dsts[k]) + " " +
                      std::to_string(sizes[k]));
  return CUDA_SUCCESS;
}
CUresult stub_record(CUevent e, CUstream s) {
  g_calls.push_back("record e" + std::to_string(reinterpret_cast<uintptr_t>(e)) + " " + name(s));
  return CUDA_SUCCESS;
}
CUresult stub_wait_event(CUstream s, CUevent e, unsigned) {
  g_calls.push_back("waitevent " + name(s) + " e" + std::to_string(reinterpret_cast<uintptr_t>(e)));
  return CUDA_SUCCESS;
}

class IssuePlan : public ::testing::Test {
 protected:
  void SetUp() override {
    g_calls.clear();
    g_batch_result = CUDA_SUCCESS;
    cu_.cuStreamBatchMemOp = stub_batch;
    cu_.cuMemcpyAsync = stub_copy;
    cu_.cuEventRecord = stub_record;
    cu_.cuStreamWaitEvent = stub_wait_event;
    for (int k = 0; k < kDirectStreams; ++k) streams_[k] = stream_id(k);
    for (int e = 0; e < kDirectEvents; ++e)
      events_[e] = reinterpret_cast<CUevent>(static_cast<uintptr_t>(e));
  }
  static DirectOp op(DirectStream s, DirectOpKind k, uint64_t dst, uint32_t value = 0,
                     uint64_t src = 0, uint64_t bytes = 0, uint8_t event = 0) {
    return DirectOp{s, k, event, 0, value, dst, src, bytes};
  }
  CUresult issue(const std::vector<DirectOp>& plan, bool batch_pushes = false) {
    return issue_plan(cu_, streams_, events_, stream_id(9), plan, batch_pushes);
  }
  CudaDriver cu_{};
  CUstream streams_[kDirectStreams];
  CUevent events_[kDirectEvents];
};

constexpr DirectStream kPush = DirectStream::kPush, kPull = DirectStream::kPull;

TEST_F(IssuePlan, ConsecutiveFlagOpsOfAStreamGoInOneBatchInPlanOrder) {
  const std::vector<DirectOp> plan = {
      op(DirectStream::kUser, DirectOpKind::kRecord, 0, 0, 0, 0, kEvStart),
      op(kPush, DirectOpKind::kWaitEvent, 0, 0, 0, 0, kEvStart),
      op(kPush, DirectOpKind::kWrite, 10, 7),
      op(kPush, DirectOpKind::kWaitGeq, 20, 7),
      op(kPush, DirectOpKind::kWaitGeq, 30, 7),
      op(kPush, DirectOpKind::kCopy, 1000, 0, 2000, 64),
      op(kPush, DirectOpKind::kWrite, 40, 7),
      op(kPush, DirectOpKind::kWaitSignal, 48),
  };
  ASSERT_EQ(issue(plan), CUDA_SUCCESS);
  const std::vector<std::string> want = {
      "record e0 s9",    "waitevent s1 e0",   "batch s1 n=3 flags=0",  " write32 @10 =7",
      " wait32 @20 >=7", " wait32 @30 >=7",   "copy s1 2000->1000 64", "batch s1 n=2 flags=0",
      " write32 @40 =7", " wait64 @48 signal"};
  EXPECT_EQ(g_calls, want);
}

// An eager op's pushes to its peers go in one cuMemcpyBatchAsync with NCCL's attributes (stream
// order, prefer overlap with compute); a lone push, pulls, and every copy of a captured op (the
// batch API cannot be captured) or of a driver without the call go one by one.
TEST_F(IssuePlan, APushStreamsConsecutiveCopiesGoInOneCopyBatch) {
  cu_.cuMemcpyBatchAsync = stub_copy_batch;
  const std::vector<DirectOp> plan = {
      op(kPush, DirectOpKind::kWaitGeq, 20, 7),     op(kPush, DirectOpKind::kCopy, 100, 0, 1, 8),
      op(kPush, DirectOpKind::kCopy, 200, 0, 1, 8), op(kPush, DirectOpKind::kCopy, 300, 0, 1, 8),
      op(kPull, DirectOpKind::kCopy, 400, 0, 2, 8), op(kPull, DirectOpKind::kCopy, 500, 0, 3, 8),
      op(kPush, DirectOpKind::kWrite, 40, 7),       op(kPush, DirectOpKind::kCopy, 600, 0, 4, 8)};
  ASSERT_EQ(issue(plan, true), CUDA_SUCCESS);
  const std::vector<std::string> batched = {"batch s1 n=1 flags=0",
                                            " wait32 @20 >=7",
                                            "copybatch s1 n=3",
                                            " 1->100 8",
                                            " 1->200 8",
                                            " 1->300 8",
                                            "copy s2 2->400 8",
                                            "copy s2 3->500 8",
                                            "batch s1 n=1 flags=0",
                                            " write32 @40 =7",
                                            "copy s1 4->600 8"};
  EXPECT_EQ(g_calls, batched);

  g_calls.clear();
  ASSERT_EQ(issue(plan, false), CUDA_SUCCESS);  // a captured op
  const std::vector<std::string> one_by_one = {
      "batch s1 n=1 flags=0", " wait32 @20 >=7",  "copy s1 1->100 8", "copy s1 1->200 8",
      "copy s1 1->300 8",     "copy s2 2->400 8", "copy s2 3->500 8", "batch s1 n=1 flags=0",
      " write32 @40 =7",      "copy s1 4->600 8"};
  EXPECT_EQ(g_calls, one_by_one);

  g_calls.clear();
  cu_.cuMemcpyBatchAsync = nullptr;  // a driver before 13.0
  ASSERT_EQ(issue(plan, true), CUDA_SUCCESS);
  EXPECT_EQ(g_calls, one_by_one);
}

TEST_F(IssuePlan, AFlagOpOfAnotherStreamStartsANewBatch) {
  ASSERT_EQ(
      issue({op(kPush, DirectOpKind::kWaitGeq, 20, 3), op(kPull, DirectOpKind::kWaitGeq, 24, 3),
             op(kPush, DirectOpKind::kWrite, 28, 3)}),
      CUDA_SUCCESS);
  const std::vector<std::string> want = {"batch s1 n=1 flags=0", " wait32 @20 >=3",
                                         "batch s2 n=1 flags=0", " wait32 @24 >=3",
                                         "batch s1 n=1 flags=0", " write32 @28 =3"};
  EXPECT_EQ(g_calls, want);
}

// An eager op's ready write sits on the application's stream (direct_plan.h): it goes to the
// stream the caller passed, in a batch of its own, before the start event.
TEST_F(IssuePlan, AFlagWriteOfTheUsersStreamGoesToTheCallersStream) {
  ASSERT_EQ(issue({op(DirectStream::kUser, DirectOpKind::kWrite, 12, 5),
                   op(DirectStream::kUser, DirectOpKind::kRecord, 0, 0, 0, 0, kEvStart),
                   op(kPush, DirectOpKind::kWaitEvent, 0, 0, 0, 0, kEvStart),
                   op(kPush, DirectOpKind::kWaitGeq, 16, 5)}),
            CUDA_SUCCESS);
  const std::vector<std::string> want = {"batch s9 n=1 flags=0", " write32 @12 =5",
                                         "record e0 s9",         "waitevent s1 e0",
                                         "batch s1 n=1 flags=0", " wait32 @16 >=5"};
  EXPECT_EQ(g_calls, want);
}

TEST_F(IssuePlan, MoreThan255FlagOpsAreSplitIntoBatchesTheDriverTakes) {
  std::vector<DirectOp> plan;
  for (int k = 0; k < 300; ++k) plan.push_back(op(kPush, DirectOpKind::kWaitGeq, 8 * k, 1));
  ASSERT_EQ(issue(plan), CUDA_SUCCESS);
  ASSERT_EQ(g_calls.size(), 302u);
  EXPECT_EQ(g_calls[0], "batch s1 n=255 flags=0");
  EXPECT_EQ(g_calls[256], "batch s1 n=45 flags=0");
  EXPECT_EQ(g_calls[301], " wait32 @" + std::to_string(8 * 299) + " >=1");
}

TEST_F(IssuePlan, AFailedBatchStopsThePlan) {
  g_batch_result = CUDA_ERROR_INVALID_VALUE;
  EXPECT_EQ(issue({op(kPush, DirectOpKind::kWrite, 8, 1),
                   op(kPush, DirectOpKind::kCopy, 100, 0, 200, 4)}),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(g_calls.size(), 2u) << "nothing after the failed batch";
}

}  // namespace
}  // namespace zc
