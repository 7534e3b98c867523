// The fake CUDA driver's modules and kernel launches (fake_cuda_kernel.cc), called directly: the
// library's reduction kernels (src/route/chunk_sum.cu) computed on the host, against bit patterns
// worked out by hand, and their launches in stream order. Buffers are plain host memory (a device
// pointer is a host pointer in the fake).
#include <cuda.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "chunk_sum.h"
#include "fake_chunk_sum.h"

extern "C" int fake_cuda_live(const char* kind);

namespace {

// The fake reads the argument as chunk_sum.cu's Args; the library sends zc::ChunkSumArgs.
static_assert(sizeof(FakeChunkSumArgs) == sizeof(zc::ChunkSumArgs), "one layout");
static_assert(offsetof(FakeChunkSumArgs, dst) == offsetof(zc::ChunkSumArgs, dst), "one layout");
static_assert(offsetof(FakeChunkSumArgs, count) == offsetof(zc::ChunkSumArgs, count), "one layout");
static_assert(offsetof(FakeChunkSumArgs, nsrc) == offsetof(zc::ChunkSumArgs, nsrc), "one layout");
static_assert(offsetof(FakeChunkSumArgs, premul) == offsetof(zc::ChunkSumArgs, premul),
              "one layout");
static_assert(offsetof(FakeChunkSumArgs, scale_bits) == offsetof(zc::ChunkSumArgs, scale_bits),
              "one layout");
static_assert(kFakeChunkSumMaxSources == zc::kChunkSumMaxSources, "one layout");

using zc::ChunkType;

// The entry points, in ChunkType's order (as the library names them, chunk_sum.cc).
constexpr const char* kEntryPoints[] = {"zc_chunk_sum_f32", "zc_chunk_sum_f16",
                                        "zc_chunk_sum_bf16"};
constexpr char kImage[] = "any image: the fake reads none of it";

CUdeviceptr dptr(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }
std::string hex(const void* p) {  // as the fake's log writes a pointer
  char text[24];
  snprintf(text, sizeof text, "0x%llx",
           static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return text;
}

uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

size_t element_bytes(ChunkType t) { return t == ChunkType::kF32 ? 4 : 2; }

// Elements of type t from their bits (the low 16 for fp16/bf16; little-endian), and back.
std::vector<uint8_t> pack(ChunkType t, const std::vector<uint32_t>& bits) {
  const size_t n = element_bytes(t);
  std::vector<uint8_t> bytes(bits.size() * n);
  for (size_t i = 0; i < bits.size(); ++i) memcpy(bytes.data() + i * n, &bits[i], n);
  return bytes;
}
std::vector<uint32_t> unpack(ChunkType t, const std::vector<uint8_t>& bytes) {
  const size_t n = element_bytes(t);
  std::vector<uint32_t> bits(bytes.size() / n, 0);
  for (size_t i = 0; i < bits.size(); ++i) memcpy(&bits[i], bytes.data() + i * n, n);
  return bits;
}

class FakeCudaKernel : public testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/fake_cuda_kernel_test.XXXXXX";
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
    ASSERT_EQ(cuModuleLoadData(&module_, kImage), CUDA_SUCCESS);
    for (int t = 0; t < 3; ++t)
      ASSERT_EQ(cuModuleGetFunction(&fn_[t], module_, kEntryPoints[t]), CUDA_SUCCESS);
  }
  void TearDown() override {
    if (module_) {
      EXPECT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
    }
    cuStreamDestroy(side_);
    cuStreamDestroy(s_);
    unsetenv("FAKE_NCCL_LOG");
    unlink(log_path_.c_str());
    EXPECT_EQ(fake_cuda_live("module"), 0);
    EXPECT_EQ(fake_cuda_live("graph"), 0);
    EXPECT_EQ(fake_cuda_live("exec"), 0);
  }

  // The log's lines in order that start with "cuda <fn> ".
  std::vector<std::string> lines(const std::string& fn) const {
    std::ifstream in(log_path_);
    std::vector<std::string> found;
    for (std::string line; std::getline(in, line);)
      if (line.rfind("cuda " + fn + " ", 0) == 0) found.push_back(line);
    return found;
  }
  // The position in the whole log of the first line that contains `text` (-1: none).
  long position(const std::string& text) const {
    std::ifstream in(log_path_);
    long at = 0;
    for (std::string line; std::getline(in, line); ++at)
      if (line.find(text) != std::string::npos) return at;
    return -1;
  }

  CUresult launch(ChunkType t, const zc::ChunkSumArgs& a, CUstream s) {
    zc::ChunkSumArgs copy = a;
    void* params[] = {&copy};
    return cuLaunchKernel(fn_[static_cast<int>(t)], 2, 1, 1, zc::kChunkSumThreads, 1, 1, 0, s,
                          params, nullptr);
  }

  // One launch over sources given as each source's element bits; the output's bits.
  std::vector<uint32_t> sum(ChunkType t, const std::vector<std::vector<uint32_t>>& sources,
                            bool premul = false, uint32_t scale_bits = 0) {
    std::vector<std::vector<uint8_t>> in;
    zc::ChunkSumArgs a;
    for (const auto& bits : sources) in.push_back(pack(t, bits));
    for (size_t k = 0; k < in.size(); ++k) a.src[k] = in[k].data();
    std::vector<uint8_t> out(in[0].size(), 0xA5);  // poisoned
    a.dst = out.data();
    a.count = sources[0].size();
    a.nsrc = static_cast<int>(sources.size());
    a.premul = premul;
    a.scale_bits = scale_bits;
    EXPECT_EQ(launch(t, a, s_), CUDA_SUCCESS);
    return unpack(t, out);
  }

  std::string log_path_;
  CUstream s_ = nullptr, side_ = nullptr;
  CUmodule module_ = nullptr;
  CUfunction fn_[3] = {};
};

TEST_F(FakeCudaKernel, AModuleHasExactlyTheThreeEntryPointsAndTakesThemAlongWhenUnloaded) {
  EXPECT_EQ(fake_cuda_live("module"), 1);
  EXPECT_NE(fn_[0], fn_[1]);
  EXPECT_NE(fn_[1], fn_[2]);
  CUfunction f = nullptr;
  EXPECT_EQ(cuModuleGetFunction(&f, module_, "zc_chunk_sum_f64"), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(cuModuleGetFunction(&f, module_, "zc_chunk_sum"), CUDA_ERROR_NOT_FOUND);
  EXPECT_NE(lines("cuModuleGetFunction").back().find(" no_such_function"), std::string::npos);
  EXPECT_EQ(cuModuleLoadData(nullptr, kImage), CUDA_ERROR_INVALID_VALUE);

  CUmodule second = nullptr;
  ASSERT_EQ(cuModuleLoadData(&second, kImage), CUDA_SUCCESS);
  EXPECT_EQ(fake_cuda_live("module"), 2);
  ASSERT_EQ(cuModuleGetFunction(&f, second, "zc_chunk_sum_bf16"), CUDA_SUCCESS);
  EXPECT_NE(f, fn_[2]) << "each module its own functions";
  EXPECT_EQ(cuModuleUnload(second), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleUnload(second), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuModuleGetFunction(&f, second, "zc_chunk_sum_bf16"), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(fake_cuda_live("module"), 1);

  ASSERT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
  module_ = nullptr;
  EXPECT_EQ(launch(ChunkType::kF32, zc::ChunkSumArgs{}, s_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_NE(lines("cuLaunchKernel").back().find(" unknown_function"), std::string::npos);
}

TEST_F(FakeCudaKernel, AnFp32SumAddsTheSourcesInOrderRoundingEveryAdd) {
  const uint32_t big = f32_bits(1e8f), one = f32_bits(1.f), minus_big = f32_bits(-1e8f);
  // 1e8 + 1 rounds back to 1e8 (its ulp is 8): the 1 is lost unless the big ones cancel first.
  EXPECT_EQ(sum(ChunkType::kF32, {{big, big}, {one, minus_big}, {minus_big, one}}),
            (std::vector<uint32_t>{f32_bits(0.f), f32_bits(1.f)}));
  // One source: its bits, copied.
  EXPECT_EQ(sum(ChunkType::kF32, {{0x7fc01234u, one}}), (std::vector<uint32_t>{0x7fc01234u, one}));
  // Eight sources, the most the kernel takes: 1 + 2^-24 seven times is 1 (each add a tie to
  // even), where adding the small ones first would have carried.
  const uint32_t tiny = f32_bits(0x1p-24f);
  std::vector<std::vector<uint32_t>> eight(8, {tiny});
  eight[0] = {one};
  EXPECT_EQ(sum(ChunkType::kF32, eight), std::vector<uint32_t>{one});
  eight[0] = {tiny};
  eight[7] = {one};
  EXPECT_EQ(sum(ChunkType::kF32, eight), std::vector<uint32_t>{f32_bits(1.f + 0x1p-21f)})
      << "7 * 2^-24 first (exact), then 1 + 3.5 * 2^-23: a tie, to the even 1 + 4 * 2^-23";
}

// Bits worked out by hand. fp16: 1.0 = 0x3c00, its ulp 2^-10, half of it 2^-11 = 0x1000; the
// largest 65504 = 0x7bff, 16 = 0x4c00, 8 = 0x4800; the smallest subnormal 2^-24 = 0x0001.
// bf16: 1.0 = 0x3f80, its ulp 2^-7, half of it 2^-8 = 0x3b80; the largest 0x7f7f
// ((2 - 2^-7) * 2^127), half its ulp 2^119 = 0x7b00; the smallest subnormal 2^-133 = 0x0001.
TEST_F(FakeCudaKernel, Fp16AndBf16SumsRoundTiesToEven) {
  EXPECT_EQ(sum(ChunkType::kF16, {{0x3c00, 0x3c01, 0x0001, 0x7bff, 0x7bff, 0x8001},
                                  {0x1000, 0x1000, 0x0001, 0x4c00, 0x4800, 0x0001}}),
            (std::vector<uint32_t>{
                0x3c00,  // 1 + 2^-11: a tie, to the even 1.0
                0x3c02,  // (1 + 2^-10) + 2^-11: a tie, up to the even 1 + 2^-9
                0x0002,  // subnormals add exactly
                0x7c00,  // 65504 + 16: a tie between 65504 and 65536 (beyond the range): inf
                0x7bff,  // 65504 + 8: below the tie
                0x0000,  // -2^-24 + 2^-24: +0
            }));
  EXPECT_EQ(sum(ChunkType::kBF16, {{0x3f80, 0x3f81, 0x0001, 0x7f7f, 0xbf80},
                                   {0x3b80, 0x3b80, 0x0001, 0x7b00, 0x3b80}}),
            (std::vector<uint32_t>{
                0x3f80,  // 1 + 2^-8: a tie, to the even 1.0
                0x3f82,  // (1 + 2^-7) + 2^-8: a tie, up to the even 1 + 2^-6
                0x0002,  // subnormals add exactly
                0x7f80,  // the largest + half its ulp: a tie, to the even 2^128: inf
                0xbf7f,  // -1 + 2^-8: -(1 - 2^-8), exact below 1 (the ulp there is 2^-8)
            }));
  // Three sources, each add rounded: (1 + 2^-11) + 2^-11 is 1 (the first add a tie to even),
  // not 1 + 2^-10.
  EXPECT_EQ(sum(ChunkType::kF16, {{0x3c00}, {0x1000}, {0x1000}}), std::vector<uint32_t>{0x3c00});
}

// NCCL's fused form (chunk_sum.cu): out = fma(src0, s, acc), acc the rounded products of src1,
// src2, ... added in order. The cases have an inexact product x * s that a fused multiply-add
// keeps and a rounded product loses, so each shows which source goes in fused:
//   fp32  s = 1 + 2^-12 (0x3f800800): (1 + 2^-12) * s = 1 + 2^-11 + 2^-24 rounds (a tie) to
//         1 + 2^-11; so fma(1 + 2^-12, s, -s) = 2^-12 + 2^-24 (0x39800800) where the rounded
//         product gives 2^-12 (0x39800000)
//   fp16  s = 1 + 2^-6 (0x3c10): s * s = 1 + 2^-5 + 2^-12 rounds to 1 + 2^-5; fused 2^-6 + 2^-12
//         (0x2410), rounded 2^-6 (0x2400)
//   bf16  s = 1 + 2^-4 (0x3f88): s * s = 1 + 2^-3 + 2^-8 rounds (a tie) to 1 + 2^-3; fused
//         2^-4 + 2^-8 (0x3d88), rounded 2^-4 (0x3d80)
TEST_F(FakeCudaKernel, APremulSumAddsRoundedProductsAndFusesItsOwnChunkLast) {
  struct Case {
    ChunkType type;
    uint32_t s, minus_one, zero, fused, rounded;
  };
  const Case kCases[] = {
      {ChunkType::kF32, 0x3f800800, f32_bits(-1.f), 0, 0x39800800, 0x39800000},
      {ChunkType::kF16, 0x3c10, 0xbc00, 0, 0x2410, 0x2400},
      {ChunkType::kBF16, 0x3f88, 0xbf80, 0, 0x3d88, 0x3d80},
  };
  for (const Case& c : kCases) {
    SCOPED_TRACE(kEntryPoints[static_cast<int>(c.type)]);
    const uint32_t s = c.s, m = c.minus_one, z = c.zero;
    // Two sources: fma(src0, s, round(src1 * s)); element 1 swaps the roles.
    EXPECT_EQ(sum(c.type, {{s, m}, {m, s}}, true, s), (std::vector<uint32_t>{c.fused, c.rounded}));
    // Three: fma(src0, s, round(round(src1 * s) + round(src2 * s))).
    EXPECT_EQ(sum(c.type, {{s, m, z}, {m, s, s}, {z, z, m}}, true, s),
              (std::vector<uint32_t>{c.fused, c.rounded, c.rounded}));
  }
  // An average of two in fp16 (s = 0.5, 0x3800): (1 + 2^-10) / 2 is exact; 2^-24 / 2, halfway
  // between 0 and the smallest subnormal, goes to the even 0.
  EXPECT_EQ(sum(ChunkType::kF16, {{0x3c01, 0x0001}, {0x0000, 0x0000}}, true, 0x3800),
            (std::vector<uint32_t>{0x3801, 0x0000}));
}

TEST_F(FakeCudaKernel, ALaunchRunsAfterACopyBeforeItAndBeforeAnEventAnotherStreamWaitsFor) {
  const std::vector<uint32_t> x = {f32_bits(1.5f), f32_bits(-2.f), f32_bits(3.25f)};
  const std::vector<uint32_t> y = {f32_bits(0.5f), f32_bits(2.f), f32_bits(-0.25f)};
  std::vector<uint8_t> host_x = pack(ChunkType::kF32, x), staged(host_x.size(), 0);
  std::vector<uint8_t> host_y = pack(ChunkType::kF32, y), out(host_x.size(), 0),
                       seen(host_x.size(), 0);
  CUevent summed = nullptr;
  ASSERT_EQ(cuEventCreate(&summed, 0), CUDA_SUCCESS);
  zc::ChunkSumArgs a;
  a.src[0] = staged.data();
  a.src[1] = host_y.data();
  a.dst = out.data();
  a.count = x.size();
  a.nsrc = 2;
  ASSERT_EQ(cuMemcpyAsync(dptr(staged.data()), dptr(host_x.data()), staged.size(), s_),
            CUDA_SUCCESS);
  ASSERT_EQ(launch(ChunkType::kF32, a, s_), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(summed, s_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(side_, summed, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyAsync(dptr(seen.data()), dptr(out.data()), out.size(), side_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(side_), CUDA_SUCCESS);
  const std::vector<uint32_t> want = {f32_bits(2.f), f32_bits(0.f), f32_bits(3.f)};
  EXPECT_EQ(unpack(ChunkType::kF32, seen), want) << "the launch saw the copied bytes";
  // In the log, in issue order: the copy, the launch (with its argument), the event.
  const long copy = position("cuda cuMemcpyAsync dst=" + hex(staged.data()));
  const long launched =
      position("cuda cuLaunchKernel fn=zc_chunk_sum_f32 grid=2x1x1 block=512x1x1");
  const long recorded = position("cuda cuEventRecord");
  EXPECT_LT(copy, launched);
  EXPECT_LT(launched, recorded);
  EXPECT_NE(lines("cuLaunchKernel").back().find(" count=3 nsrc=2 premul=0"), std::string::npos);
  cuEventDestroy(summed);
}

TEST_F(FakeCudaKernel, ACapturedLaunchRunsAtEveryGraphLaunchWithTheArgumentOfItsCall) {
  std::vector<uint8_t> x = pack(ChunkType::kBF16, {0x3f80, 0x4000});  // 1, 2
  std::vector<uint8_t> y = pack(ChunkType::kBF16, {0x3f80, 0x3f80}), out(4, 0);
  zc::ChunkSumArgs a;
  a.src[0] = x.data();
  a.src[1] = y.data();
  a.dst = out.data();
  a.count = 2;
  a.nsrc = 2;
  void* params[] = {&a};
  ASSERT_EQ(cuStreamBeginCapture(s_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(fn_[static_cast<int>(ChunkType::kBF16)], 1, 1, 1, 512, 1, 1, 0, s_,
                           params, nullptr),
            CUDA_SUCCESS);
  EXPECT_NE(lines("cuLaunchKernel").back().find(" captured="), std::string::npos);
  a.count = 1;  // after the call: CUDA has copied the argument
  EXPECT_EQ(unpack(ChunkType::kBF16, out), (std::vector<uint32_t>{0, 0})) << "recorded, not run";
  CUgraph g = nullptr;
  ASSERT_EQ(cuStreamEndCapture(s_, &g), CUDA_SUCCESS);
  CUgraphExec e = nullptr;
  ASSERT_EQ(cuGraphInstantiate(&e, g, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(e, s_), CUDA_SUCCESS);
  EXPECT_EQ(unpack(ChunkType::kBF16, out), (std::vector<uint32_t>{0x4000, 0x4040}))  // 2, 3
      << "both elements: the count of the call";
  EXPECT_NE(lines("cuLaunchKernel").back().find(" replay=exec#"), std::string::npos);
  // The sources are read at every replay.
  const std::vector<uint8_t> threes = pack(ChunkType::kBF16, {0x4040, 0x4040});
  memcpy(x.data(), threes.data(), x.size());
  ASSERT_EQ(cuGraphLaunch(e, s_), CUDA_SUCCESS);
  EXPECT_EQ(unpack(ChunkType::kBF16, out), (std::vector<uint32_t>{0x4080, 0x4080}));  // 4, 4
  // A replay after its module is gone is refused (the library must keep it while graphs live).
  ASSERT_EQ(cuModuleUnload(module_), CUDA_SUCCESS);
  module_ = nullptr;
  EXPECT_EQ(cuGraphLaunch(e, s_), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_NE(lines("cuLaunchKernel").back().find(" unloaded_module"), std::string::npos);
  EXPECT_EQ(cuGraphExecDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(g), CUDA_SUCCESS);
}

TEST_F(FakeCudaKernel, LaunchesAGpuWouldFailOrComputeGarbageForAreRefused) {
  std::vector<uint32_t> x(4, 0), y(4, 0), out(4, 0);
  zc::ChunkSumArgs a;
  a.src[0] = x.data();
  a.src[1] = y.data();
  a.dst = out.data();
  a.count = 4;
  a.nsrc = 2;
  void* params[] = {&a};
  const CUfunction f32 = fn_[0];
  EXPECT_EQ(cuLaunchKernel(f32, 0, 1, 1, 512, 1, 1, 0, s_, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(f32, 1, 1, 1, 1025, 1, 1, 0, s_, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuLaunchKernel(f32, 1, 1, 1, 512, 1, 1, 0, s_, nullptr, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  void* extra[] = {CU_LAUNCH_PARAM_END};
  EXPECT_EQ(cuLaunchKernel(f32, 1, 1, 1, 512, 1, 1, 0, s_, nullptr, extra),
            CUDA_ERROR_NOT_SUPPORTED);
  for (const auto& [nsrc, premul] : {std::pair{0, 0}, {9, 0}, {1, 1}}) {
    zc::ChunkSumArgs bad = a;
    bad.nsrc = nsrc;
    bad.premul = premul;
    EXPECT_EQ(launch(ChunkType::kF32, bad, s_), CUDA_ERROR_INVALID_VALUE) << nsrc << premul;
    EXPECT_NE(lines("cuLaunchKernel").back().find(" bad_args=nsrc"), std::string::npos);
  }
  zc::ChunkSumArgs misaligned = a;
  misaligned.src[1] = reinterpret_cast<const char*>(y.data()) + 2;
  misaligned.count = 1;
  EXPECT_EQ(launch(ChunkType::kF32, misaligned, s_), CUDA_ERROR_MISALIGNED_ADDRESS);
  EXPECT_EQ(launch(ChunkType::kF16, misaligned, s_), CUDA_SUCCESS) << "2-byte elements";
  // Memory of the fake's that is reserved but not mapped: an illegal address, not a crash.
  CUdeviceptr reserved = 0;
  ASSERT_EQ(cuMemAddressReserve(&reserved, 2 << 20, 0, 0, 0), CUDA_SUCCESS);
  zc::ChunkSumArgs unmapped = a;
  unmapped.dst = reinterpret_cast<void*>(reserved);
  EXPECT_EQ(launch(ChunkType::kF32, unmapped, s_), CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(cuMemAddressFree(reserved, 2 << 20), CUDA_SUCCESS);
  // A stream of another device than the module's.
  CUcontext other = nullptr, mine = nullptr;
  CUstream elsewhere = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&mine), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&other, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(other), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreate(&elsewhere, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(mine), CUDA_SUCCESS);
  EXPECT_EQ(launch(ChunkType::kF32, a, elsewhere), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_NE(lines("cuLaunchKernel").back().find(" function_dev=0 stream_dev=1"), std::string::npos);
  cuStreamDestroy(elsewhere);
  cuDevicePrimaryCtxRelease(1);
}

// FAKE_CUDA_CE=1 hands out the library's kernel group (CudaDriver::kernel_ok) by base name.
TEST_F(FakeCudaKernel, CuGetProcAddressHandsOutTheKernelEntryPoints) {
  setenv("FAKE_CUDA_CE", "1", 1);
  void* self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(self, nullptr);
  for (const char* name :
       {"cuModuleLoadData", "cuModuleUnload", "cuModuleGetFunction", "cuLaunchKernel"}) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found{};
    EXPECT_EQ(cuGetProcAddress(name, &fn, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found),
              CUDA_SUCCESS)
        << name;
    EXPECT_EQ(fn, dlsym(self, name)) << name;
  }
  dlclose(self);
  unsetenv("FAKE_CUDA_CE");
}

}  // namespace
