// The fake CUDA driver's capture model (fake_cuda_graph.cc), called directly: what the route's
// capture tests rely on. Buffers are plain host memory (a device pointer is a host pointer in
// the fake); outcomes that return CUDA_SUCCESS either way (a wait satisfied or skipped) are read
// off the fake's log.
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

extern "C" int fake_cuda_live(const char* kind);
// The 12.0 signature, which cuda.h of CUDA 13 declares only to the driver itself.
extern "C" CUresult cuStreamGetCaptureInfo_v2(CUstream, CUstreamCaptureStatus*, cuuint64_t*,
                                              CUgraph*, const CUgraphNode**, size_t*);

namespace {

CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

class FakeCudaCapture : public testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/fake_cuda_capture_test.XXXXXX";
    const int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    log_path_ = path;
    setenv("FAKE_NCCL_LOG", path, 1);
    CUcontext ctx = nullptr;
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreate(&s_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreate(&side_, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  }
  void TearDown() override {
    cuStreamDestroy(side_);
    cuStreamDestroy(s_);
    unsetenv("FAKE_NCCL_LOG");
    unlink(log_path_.c_str());
    EXPECT_EQ(fake_cuda_live("graph"), 0);
    EXPECT_EQ(fake_cuda_live("exec"), 0);
    EXPECT_EQ(fake_cuda_live("userobj"), 0);
  }

  // The last line of the log that starts with "cuda <fn> ".
  std::string last_line(const std::string& fn) const {
    std::ifstream in(log_path_);
    std::string line, last;
    while (std::getline(in, line))
      if (line.rfind("cuda " + fn + " ", 0) == 0) last = line;
    return last;
  }

  CUgraph end(CUstream s) {
    CUgraph g = nullptr;
    EXPECT_EQ(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    return g;
  }
  CUgraphExec instantiate(CUgraph g) {
    CUgraphExec e = nullptr;
    EXPECT_EQ(cuGraphInstantiate(&e, g, 0), CUDA_SUCCESS);
    return e;
  }
  CUstreamCaptureStatus status(CUstream s) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    EXPECT_EQ(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    return st;
  }
  uint64_t capture_id(CUstream s) {
    cuuint64_t id = 0;
    EXPECT_EQ(cuStreamGetCaptureInfo_v2(s, nullptr, &id, nullptr, nullptr, nullptr), CUDA_SUCCESS);
    return id;
  }

  std::string log_path_;
  CUstream s_ = nullptr, side_ = nullptr;
};

// A user object's destructor as the tests watch it: which thread ran it, and what a CUDA call
// from there answered.
struct Watched {
  int runs = 0;
  std::thread::id thread;
  CUresult call = CUDA_SUCCESS;
  CUstream stream = nullptr;
};
void watched_destroy(void* p) {
  auto* w = static_cast<Watched*>(p);
  ++w->runs;
  w->thread = std::this_thread::get_id();
  w->call = cuStreamQuery(w->stream);
}
CUuserObject make_object(Watched* w, unsigned refs) {
  CUuserObject o = nullptr;
  EXPECT_EQ(cuUserObjectCreate(&o, w, watched_destroy, refs, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
            CUDA_SUCCESS);
  return o;
}

TEST_F(FakeCudaCapture, OpsAreRecordedNotRunDuringCaptureAndRunAtEveryLaunch) {
  std::vector<uint32_t> src(64, 0x11111111), dst(64, 0), fill(16, 0);
  uint32_t flag = 0;
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(status(s_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_GE(capture_id(s_), 2u);
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph capturing = nullptr;
  const CUgraphNode* deps = reinterpret_cast<const CUgraphNode*>(&st);
  size_t ndeps = 7;
  ASSERT_EQ(cuStreamGetCaptureInfo_v2(s_, &st, nullptr, &capturing, &deps, &ndeps), CUDA_SUCCESS);
  EXPECT_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_NE(capturing, nullptr);
  EXPECT_EQ(deps, nullptr);
  EXPECT_EQ(ndeps, 0u);

  ASSERT_EQ(cuMemcpyAsync(dptr(dst.data()), dptr(src.data()), 256, s_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32Async(dptr(fill.data()), 0xabcd, fill.size(), s_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWriteValue32(s_, dptr(&flag), 7, 0), CUDA_SUCCESS);
  EXPECT_NE(last_line("cuStreamWriteValue32").find(" captured="), std::string::npos);
  EXPECT_EQ(cuStreamWriteValue32(s_, dptr(&flag) + 2, 7, 0), CUDA_ERROR_INVALID_VALUE)
      << "arguments are still checked when recorded";
  EXPECT_EQ(cuStreamSynchronize(s_), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(status(s_), CU_STREAM_CAPTURE_STATUS_INVALIDATED) << "a refused call spoils it";
  CUgraph bad = capturing;
  EXPECT_EQ(cuStreamEndCapture(s_, &bad), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(bad, nullptr);

  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyAsync(dptr(dst.data()), dptr(src.data()), 256, s_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD32Async(dptr(fill.data()), 0xabcd, fill.size(), s_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWriteValue32(s_, dptr(&flag), 7, 0), CUDA_SUCCESS);
  EXPECT_EQ(dst[0], 0u);
  EXPECT_EQ(fill[15], 0u);
  EXPECT_EQ(flag, 0u);
  CUgraph g = end(s_);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(status(s_), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(dst[0], 0u) << "ending a capture runs nothing";
  CUgraphExec e = instantiate(g);
  EXPECT_EQ(fake_cuda_live("graph"), 1);
  EXPECT_EQ(fake_cuda_live("exec"), 1);

  ASSERT_EQ(cuGraphLaunch(e, s_), CUDA_SUCCESS);
  EXPECT_EQ(dst[63], 0x11111111u);
  EXPECT_EQ(fill[15], 0xabcdu);
  EXPECT_EQ(flag, 7u);
  EXPECT_NE(last_line("cuGraphLaunch").find(" ops=3 "), std::string::npos);
  EXPECT_NE(last_line("cuMemcpyAsync").find(" replay=exec#"), std::string::npos);
  // A replay reads its sources when it runs, not when it was captured.
  src.assign(64, 0x22222222);
  flag = 0;
  ASSERT_EQ(cuGraphLaunch(e, s_), CUDA_SUCCESS);
  EXPECT_EQ(dst[0], 0x22222222u);
  EXPECT_EQ(flag, 7u);
  EXPECT_EQ(cuGraphExecDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(g), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(g), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(FakeCudaCapture, TheLegacyStreamCannotCaptureNorACapturingStreamAgain) {
  EXPECT_EQ(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_ERROR_ILLEGAL_STATE);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(side_, &g), CUDA_ERROR_ILLEGAL_STATE);
  g = end(s_);
  CUgraphExec e = instantiate(g);
  ASSERT_EQ(cuGraphLaunch(e, s_), CUDA_SUCCESS);  // an empty graph
  EXPECT_NE(last_line("cuGraphLaunch").find(" ops=0 "), std::string::npos);
  cuGraphExecDestroy(e);
  cuGraphDestroy(g);
}

TEST_F(FakeCudaCapture, ASideStreamJoinsThroughAnEventAndItsOpsKeepIssueOrder) {
  CUevent fork = nullptr, joined = nullptr;
  ASSERT_EQ(cuEventCreate(&fork, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&joined, 0), CUDA_SUCCESS);
  uint32_t flag = 0, side_flag = 0;
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWriteValue32(s_, dptr(&flag), 1, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(fork, s_), CUDA_SUCCESS);
  EXPECT_EQ(status(side_), CU_STREAM_CAPTURE_STATUS_NONE);
  ASSERT_EQ(cuStreamWaitEvent(side_, fork, 0), CUDA_SUCCESS);
  EXPECT_NE(last_line("cuStreamWaitEvent").find(" joined"), std::string::npos);
  EXPECT_EQ(status(side_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(capture_id(side_), capture_id(s_));
  ASSERT_EQ(cuStreamWriteValue32(side_, dptr(&flag), 2, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWriteValue32(side_, dptr(&side_flag), 5, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(joined, side_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(s_, joined, 0), CUDA_SUCCESS);
  EXPECT_EQ(side_flag, 0u);

  // A stream of another capture may not wait for this one's event.
  CUstream other = nullptr;
  ASSERT_EQ(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamBeginCapture(other, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamWaitEvent(other, fork, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  CUgraph spoiled = nullptr;
  EXPECT_EQ(cuStreamEndCapture(other, &spoiled), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  cuStreamDestroy(other);

  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(side_, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
      << "only the origin ends a capture";
  g = end(s_);
  EXPECT_EQ(status(side_), CU_STREAM_CAPTURE_STATUS_NONE) << "the capture ended for both";
  ASSERT_EQ(cuStreamWriteValue32(side_, dptr(&side_flag), 9, 0), CUDA_SUCCESS);
  EXPECT_EQ(side_flag, 9u) << "eager again";
  side_flag = 0;
  CUgraphExec e = instantiate(g);
  ASSERT_EQ(cuGraphLaunch(e, s_), CUDA_SUCCESS);
  EXPECT_EQ(flag, 2u) << "the side stream's write came after the origin's";
  EXPECT_EQ(side_flag, 5u);
  cuGraphExecDestroy(e);
  cuGraphDestroy(g);
  cuEventDestroy(fork);
  cuEventDestroy(joined);
}

TEST_F(FakeCudaCapture, AUserObjectDiesWithTheLastOfGraphAndExecOnAnotherThread) {
  Watched w;
  w.stream = s_;
  CUuserObject o = make_object(&w, 1);
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUgraph capturing = nullptr;
  ASSERT_EQ(cuStreamGetCaptureInfo_v2(s_, nullptr, nullptr, &capturing, nullptr, nullptr),
            CUDA_SUCCESS);
  ASSERT_EQ(cuGraphRetainUserObject(capturing, o, 1, CU_GRAPH_USER_OBJECT_MOVE), CUDA_SUCCESS);
  CUgraph g = end(s_);
  EXPECT_EQ(g, capturing);
  CUgraphExec e = instantiate(g);
  EXPECT_EQ(cuGraphDestroy(g), CUDA_SUCCESS);
  EXPECT_EQ(w.runs, 0) << "the exec holds references of its own";
  EXPECT_EQ(fake_cuda_live("userobj"), 1);
  EXPECT_EQ(cuGraphExecDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(w.runs, 1);
  EXPECT_NE(w.thread, std::this_thread::get_id());
  EXPECT_EQ(w.call, CUDA_ERROR_NOT_PERMITTED);
  EXPECT_NE(last_line("cuStreamQuery").find(" called from a user-object destructor"),
            std::string::npos);
  EXPECT_EQ(cuStreamQuery(s_), CUDA_SUCCESS) << "only the destructor's thread is refused";
}

TEST_F(FakeCudaCapture, MovingReferencesTakesTheCallersAndRetainingAddsTheGraphsOwn) {
  EXPECT_EQ(fake_cuda_live("userobj"), 0);
  CUuserObject refused = nullptr;
  Watched w;
  w.stream = s_;
  EXPECT_EQ(cuUserObjectCreate(&refused, &w, watched_destroy, 1, 0), CUDA_ERROR_INVALID_VALUE);

  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUgraph g = end(s_);
  CUuserObject moved = make_object(&w, 2);
  EXPECT_EQ(cuGraphRetainUserObject(g, moved, 3, CU_GRAPH_USER_OBJECT_MOVE),
            CUDA_ERROR_INVALID_VALUE)
      << "the caller holds only 2";
  ASSERT_EQ(cuGraphRetainUserObject(g, moved, 2, CU_GRAPH_USER_OBJECT_MOVE), CUDA_SUCCESS);
  EXPECT_EQ(cuUserObjectRelease(moved, 1), CUDA_ERROR_INVALID_VALUE) << "none left to the caller";
  EXPECT_EQ(cuGraphReleaseUserObject(g, moved, 1), CUDA_SUCCESS);
  EXPECT_EQ(w.runs, 0);

  Watched w2;
  w2.stream = s_;
  CUuserObject added = make_object(&w2, 1);
  ASSERT_EQ(cuGraphRetainUserObject(g, added, 2, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuUserObjectRetain(added, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuUserObjectRelease(added, 2), CUDA_SUCCESS) << "the caller's own 1 + 1";
  EXPECT_EQ(w2.runs, 0) << "the graph's 2 remain";
  EXPECT_EQ(cuGraphReleaseUserObject(g, added, 3), CUDA_ERROR_INVALID_VALUE);

  EXPECT_EQ(cuGraphDestroy(g), CUDA_SUCCESS);
  EXPECT_EQ(w.runs, 1);
  EXPECT_EQ(w2.runs, 1);
  EXPECT_EQ(w2.call, CUDA_ERROR_NOT_PERMITTED);
}

TEST_F(FakeCudaCapture, A64BitAndWaitSeesTheHighHalfThat32BitWritesToTheLowHalfKeep) {
  alignas(8) uint64_t word = 0;
  const CUdeviceptr at = dptr(&word);
  const uint64_t high = uint64_t{1} << 32;
  ASSERT_EQ(cuStreamWriteValue64(s_, at, high, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWriteValue32(s_, at, 5, 0), CUDA_SUCCESS);  // the low half (little endian)
  EXPECT_EQ(word, high | 5);
  ASSERT_EQ(cuStreamWaitValue64(s_, at, high, CU_STREAM_WAIT_VALUE_AND), CUDA_SUCCESS);
  EXPECT_NE(last_line("cuStreamWaitValue64").find(" satisfied"), std::string::npos);
  EXPECT_EQ(last_line("cuStreamWaitValue64").find("not_satisfied"), std::string::npos);
  ASSERT_EQ(cuStreamWaitValue64(s_, at, high << 1, CU_STREAM_WAIT_VALUE_AND), CUDA_SUCCESS);
  EXPECT_NE(last_line("cuStreamWaitValue64").find(" not_satisfied"), std::string::npos);
  // NOR: some bit clear in both the word and the value.
  ASSERT_EQ(cuStreamWaitValue64(s_, at, ~(high | 5) & ~uint64_t{8}, CU_STREAM_WAIT_VALUE_NOR),
            CUDA_SUCCESS);
  EXPECT_EQ(last_line("cuStreamWaitValue64").find("not_satisfied"), std::string::npos);
  ASSERT_EQ(cuStreamWaitValue64(s_, at, ~(high | 5), CU_STREAM_WAIT_VALUE_NOR), CUDA_SUCCESS);
  EXPECT_NE(last_line("cuStreamWaitValue64").find(" not_satisfied"), std::string::npos);
  // GEQ wraps: 1 is ahead of the largest value.
  word = 1;
  ASSERT_EQ(cuStreamWaitValue64(s_, at, ~uint64_t{0}, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
  EXPECT_EQ(last_line("cuStreamWaitValue64").find("not_satisfied"), std::string::npos);
  // The 32-bit wait has AND and NOR too.
  ASSERT_EQ(cuStreamWaitValue32(s_, at, 1, CU_STREAM_WAIT_VALUE_AND), CUDA_SUCCESS);
  EXPECT_EQ(last_line("cuStreamWaitValue32").find("not_satisfied"), std::string::npos);
  ASSERT_EQ(cuStreamWaitValue32(s_, at, ~uint32_t{1}, CU_STREAM_WAIT_VALUE_NOR), CUDA_SUCCESS);
  EXPECT_NE(last_line("cuStreamWaitValue32").find(" not_satisfied"), std::string::npos);
  EXPECT_EQ(cuStreamWaitValue64(s_, at + 4, 1, 0), CUDA_ERROR_INVALID_VALUE) << "misaligned";
  EXPECT_EQ(cuStreamWriteValue64(s_, at + 4, 1, 0), CUDA_ERROR_INVALID_VALUE) << "misaligned";

  // Recorded and replayed, the same wait meets the same executor.
  word = 0;
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWriteValue64(s_, at, high, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWriteValue32(s_, at, 5, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitValue64(s_, at, high, CU_STREAM_WAIT_VALUE_AND), CUDA_SUCCESS);
  CUgraph g = end(s_);
  EXPECT_EQ(word, 0u);
  CUgraphExec e = instantiate(g);
  ASSERT_EQ(cuGraphLaunch(e, s_), CUDA_SUCCESS);
  EXPECT_EQ(word, high | 5);
  const std::string replayed = last_line("cuStreamWaitValue64");
  EXPECT_NE(replayed.find(" replay=exec#"), std::string::npos) << replayed;
  EXPECT_EQ(replayed.find("not_satisfied"), std::string::npos) << replayed;
  cuGraphExecDestroy(e);
  cuGraphDestroy(g);
}

// cuStreamBatchMemOp: its operations run in order as the single calls they stand for, a batch
// with a bad element runs none of them, and a captured batch replays like the single calls.
TEST_F(FakeCudaCapture, ABatchOfFlagOperationsRunsInOrderAsTheSingleCallsWould) {
  alignas(8) uint32_t flags[4] = {};
  auto write32 = [&](int i, uint32_t v) {
    CUstreamBatchMemOpParams p{};
    p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    p.writeValue.address = dptr(&flags[i]);
    p.writeValue.value = v;
    return p;
  };
  auto wait_geq = [&](int i, uint32_t v) {
    CUstreamBatchMemOpParams p{};
    p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    p.waitValue.address = dptr(&flags[i]);
    p.waitValue.value = v;
    p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    return p;
  };
  // The wait after the write sees it: the operations run in array order.
  CUstreamBatchMemOpParams ok[] = {write32(0, 7), wait_geq(0, 7), write32(1, 9)};
  ASSERT_EQ(cuStreamBatchMemOp(s_, 3, ok, 0), CUDA_SUCCESS);
  EXPECT_EQ(flags[0], 7u);
  EXPECT_EQ(flags[1], 9u);
  const std::string waited = last_line("cuStreamWaitValue32");
  EXPECT_NE(waited.find(" batch=2/3"), std::string::npos) << waited;
  EXPECT_EQ(waited.find("not_satisfied"), std::string::npos) << waited;
  // A misaligned element, a bad count or flags: nothing of the batch runs.
  CUstreamBatchMemOpParams bad[] = {write32(2, 5), write32(0, 1)};
  bad[1].writeValue.address += 2;
  EXPECT_EQ(cuStreamBatchMemOp(s_, 2, bad, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(flags[2], 0u);
  EXPECT_EQ(cuStreamBatchMemOp(s_, 256, ok, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuStreamBatchMemOp(s_, 1, ok, 1), CUDA_ERROR_INVALID_VALUE);
  // Captured: recorded, not run; every launch runs it.
  CUstreamBatchMemOpParams later[] = {write32(3, 4), wait_geq(3, 4)};
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamBatchMemOp(s_, 2, later, 0), CUDA_SUCCESS);
  CUgraph g = end(s_);
  EXPECT_EQ(flags[3], 0u);
  CUgraphExec e = instantiate(g);
  ASSERT_EQ(cuGraphLaunch(e, s_), CUDA_SUCCESS);
  EXPECT_EQ(flags[3], 4u);
  const std::string replayed = last_line("cuStreamWaitValue32");
  EXPECT_NE(replayed.find(" replay=exec#"), std::string::npos) << replayed;
  EXPECT_EQ(replayed.find("not_satisfied"), std::string::npos) << replayed;
  cuGraphExecDestroy(e);
  cuGraphDestroy(g);
}

TEST_F(FakeCudaCapture, AnInvalidatedCaptureReleasesItsGraphsReferences) {
  ScopedEnv once("FAKE_CUDA_INVALIDATE_CAPTURE", "1");
  Watched w;
  w.stream = s_;
  CUuserObject o = make_object(&w, 1);
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUgraph capturing = nullptr;
  ASSERT_EQ(cuStreamGetCaptureInfo_v2(s_, nullptr, nullptr, &capturing, nullptr, nullptr),
            CUDA_SUCCESS);
  ASSERT_EQ(cuGraphRetainUserObject(capturing, o, 1, CU_GRAPH_USER_OBJECT_MOVE), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(capturing), CUDA_ERROR_ILLEGAL_STATE) << "still capturing";
  CUgraph g = capturing;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(w.runs, 1);
  EXPECT_EQ(w.call, CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(fake_cuda_live("graph"), 0);
  // Once per process.
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  g = end(s_);
  EXPECT_NE(g, nullptr);
  cuGraphDestroy(g);
}

TEST_F(FakeCudaCapture, TheBatchCopyIsRefusedInACaptureAndSpoilsIt) {
  std::vector<uint8_t> src(64, 1), dst(64, 0);
  CUdeviceptr d = dptr(dst.data()), s = dptr(src.data());
  size_t size = src.size(), idx = 0;
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyBatchAsync(&d, &s, &size, 1, &attr, &idx, 1, s_),
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(dst[0], 0);
  EXPECT_EQ(cuMemcpyAsync(d, s, size, s_), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cuMemcpyBatchAsync(&d, &s, &size, 1, &attr, &idx, 1, s_), CUDA_SUCCESS);
  EXPECT_EQ(dst[63], 1);
}

// FAKE_CUDA_CAPTURING=1: every stream but the legacy one is in one capture that never ends.
TEST_F(FakeCudaCapture, TheImplicitCaptureRecordsAndNeverRuns) {
  ScopedEnv capturing("FAKE_CUDA_CAPTURING", "1");
  uint32_t flag = 0;
  EXPECT_EQ(status(s_), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  EXPECT_EQ(status(CU_STREAM_LEGACY), CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(capture_id(s_), 1u);
  ASSERT_EQ(cuStreamWriteValue32(s_, dptr(&flag), 3, 0), CUDA_SUCCESS);
  EXPECT_EQ(flag, 0u);
  EXPECT_NE(last_line("cuStreamWriteValue32").find(" captured=1 "), std::string::npos);
  EXPECT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(s_, &g), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(cuStreamGetCaptureInfo_v2(s_, nullptr, nullptr, &g, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_NE(g, nullptr);
  Watched w;
  w.stream = s_;
  CUuserObject o = make_object(&w, 1);
  EXPECT_EQ(cuGraphRetainUserObject(g, o, 1, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuUserObjectRelease(o, 1), CUDA_SUCCESS);
  EXPECT_EQ(w.runs, 0) << "the implicit graph keeps its reference";
  EXPECT_EQ(fake_cuda_live("graph"), 0) << "the implicit graph is not the program's";
  ASSERT_EQ(cuStreamSynchronize(s_), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphReleaseUserObject(g, o, 1), CUDA_SUCCESS);  // for TearDown's count
  EXPECT_EQ(w.runs, 1);
}

TEST_F(FakeCudaCapture, CuGetProcAddressHandsOutThe120AbiByBaseName) {
  ScopedEnv ce("FAKE_CUDA_CE", "1");
  void* self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(self, nullptr);
  const std::pair<const char*, const char*> kNames[] = {
      {"cuStreamBeginCapture", "cuStreamBeginCapture_v2"},
      {"cuStreamEndCapture", "cuStreamEndCapture"},
      {"cuStreamIsCapturing", "cuStreamIsCapturing"},
      {"cuStreamGetCaptureInfo", "cuStreamGetCaptureInfo_v2"},
      {"cuGraphInstantiate", "cuGraphInstantiateWithFlags"},
      {"cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags"},
      {"cuGraphLaunch", "cuGraphLaunch"},
      {"cuGraphExecDestroy", "cuGraphExecDestroy"},
      {"cuGraphDestroy", "cuGraphDestroy"},
      {"cuUserObjectCreate", "cuUserObjectCreate"},
      {"cuUserObjectRetain", "cuUserObjectRetain"},
      {"cuUserObjectRelease", "cuUserObjectRelease"},
      {"cuGraphRetainUserObject", "cuGraphRetainUserObject"},
      {"cuGraphReleaseUserObject", "cuGraphReleaseUserObject"},
      {"cuStreamWaitValue64", "cuStreamWaitValue64_v2"},
      {"cuStreamWriteValue64", "cuStreamWriteValue64_v2"},
      {"cuStreamWaitValue32", "cuStreamWaitValue32_v2"},
  };
  for (const auto& [base, exported] : kNames) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found{};
    EXPECT_EQ(cuGetProcAddress(base, &fn, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found),
              CUDA_SUCCESS)
        << base;
    EXPECT_EQ(fn, dlsym(self, exported)) << base;
  }
  dlclose(self);
}

}  // namespace
