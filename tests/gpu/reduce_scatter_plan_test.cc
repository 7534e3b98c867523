// The reduce-scatter's plans (src/route/reduce_scatter_plan.h) issued by its executor
// (src/route/rs_exec.h) on real streams, with the library's embedded reduction kernel: 2-4
// "ranks" in one process, each with its own streams, events, input, scratch and output, on GPU
// r % (visible GPUs) — on one GPU every rank shares it; on several the pushes cross NVLink
// through peer access. Flags in mapped host memory, as the op exchange's. Two ops back to back
// over the same buffers (the second with fresh inputs), fp32/bf16, sum and an average's
// pre-multiplied sum, an odd count (chunks off 16-byte boundaries, a short last slice), a slice's
// pushes in one batch call and one call each: each
// rank's output bitwise against the exact host reference in the plan's order. Skips without a
// GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "chunk_sum.h"
#include "chunk_sum_reference.h"
#include "cuda_driver.h"
#include "reduce_scatter_plan.h"
#include "rs_exec.h"

namespace zc {
namespace {

using namespace chunk_sum_reference;

struct Rank {
  int device = 0;
  uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  uint8_t* scratch = nullptr;
  CUstream streams[kRsStreams] = {};
  CUevent events[kRsEvents] = {};
  cudaStream_t user = nullptr;
  ChunkSumKernels kernels;
};

class ReduceScatterPlanGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    cu_ = cuda_driver();
    if (!cu_ || !cu_->kernel_ok || cudaGetDeviceCount(&ngpus_) != cudaSuccess || ngpus_ == 0)
      GTEST_SKIP() << "no GPU";
  }

  // One case: `nranks` ranks, `ops` ops; false on a CUDA failure (asserted by the caller).
  // Slices of `slice` bytes (whole elements, 256-byte aligned, as rs_slice_bytes makes them):
  // small ones give many slices on little data, whose host reference is slow.
  void run(int nranks, const TypeCase& t, bool premul, uint64_t count, uint64_t slice,
           bool batch_copies = true) {
    const std::string label = std::to_string(nranks) + " ranks " + t.name +
                              (premul ? " average" : " sum") + " count " + std::to_string(count);
    const uint64_t chunk = count * t.bytes;
    std::vector<Rank> ranks(static_cast<size_t>(nranks));
    uint32_t* flags = nullptr;  // landed[nranks * nranks], freed[nranks]
    ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&flags),
                            sizeof(uint32_t) * (nranks + nranks * nranks), cudaHostAllocMapped |
                                                                             cudaHostAllocPortable),
              cudaSuccess);
    memset(flags, 0, sizeof(uint32_t) * (nranks + nranks * nranks));
    uint64_t first_slice = 0;
    for (int r = 0; r < nranks; ++r) {
      Rank& k = ranks[r];
      k.device = r % ngpus_;
      ASSERT_EQ(cudaSetDevice(k.device), cudaSuccess);
      for (int p = 0; p < nranks; ++p)
        if (p % ngpus_ != k.device) cudaDeviceEnablePeerAccess(p % ngpus_, 0);
      cudaGetLastError();  // "already enabled"
      ASSERT_EQ(cudaMalloc(&k.send, chunk * nranks), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&k.recv, chunk), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&k.scratch, rs_scratch_bytes(nranks, slice)), cudaSuccess);
      for (CUstream& s : k.streams)
        ASSERT_EQ(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(&s),
                                            cudaStreamNonBlocking),
                  cudaSuccess);
      for (CUevent& e : k.events)
        ASSERT_EQ(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(&e),
                                           cudaEventDisableTiming),
                  cudaSuccess);
      ASSERT_EQ(cudaStreamCreateWithFlags(&k.user, cudaStreamNonBlocking), cudaSuccess);
      const char* why = "";
      ASSERT_TRUE(k.kernels.load(*cu_, &why)) << why;
    }
    // An average's scale: 1/n in the element type, as NCCL makes it (chunk_sum.cu).
    uint32_t scale_bits = 0;
    if (t.type == ChunkType::kF32) {
      const float f = 1.0f / static_cast<float>(nranks);
      memcpy(&scale_bits, &f, 4);
    } else {
      scale_bits = round_to_16(1.0 / nranks, t.mant, t.bias);
    }
    std::mt19937 rng(static_cast<uint32_t>(nranks * 1000 + count));
    for (int op = 1; op <= 2; ++op) {
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < nranks; ++r) {
        // Fresh inputs, written on the rank's own stream as an application's producer would.
        std::vector<uint8_t> in;
        for (int c = 0; c < nranks; ++c) {
          const std::vector<uint8_t> part = random_chunk(t, count, &rng);
          in.insert(in.end(), part.begin(), part.end());
        }
        inputs.push_back(in);
        Rank& k = ranks[r];
        ASSERT_EQ(cudaSetDevice(k.device), cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(k.send, inputs.back().data(), chunk * nranks,
                                  cudaMemcpyHostToDevice, k.user),
                  cudaSuccess);
        ASSERT_EQ(cudaMemsetAsync(k.recv, 0xA5, chunk, k.user), cudaSuccess);  // poisoned
        RsOpView v;
        v.rank = r;
        v.nranks = nranks;
        v.first_slice = first_slice;
        v.chunk = chunk;
        v.slice = slice;
        v.send = reinterpret_cast<uint64_t>(k.send);
        v.recv = reinterpret_cast<uint64_t>(k.recv);
        v.scratch = reinterpret_cast<uint64_t>(k.scratch);
        for (int p = 0; p < nranks; ++p) {
          v.peer_scratch[p] = reinterpret_cast<uint64_t>(ranks[p].scratch);
          v.landed_in[p] = reinterpret_cast<uint64_t>(&flags[r * nranks + p]);
          v.landed_out[p] = reinterpret_cast<uint64_t>(&flags[p * nranks + r]);
          v.freed[p] = reinterpret_cast<uint64_t>(&flags[nranks * nranks + p]);
        }
        std::vector<RsOp> plan;
        build_reduce_scatter_plan(v, &plan);
        RsSum sum;
        sum.kernels = &k.kernels;
        sum.type = t.type;
        sum.elem = t.bytes;
        sum.premul = premul;
        sum.scale_bits = scale_bits;
        sum.ctas = 8;
        ASSERT_EQ(issue_rs_plan(*cu_, k.streams, k.events, reinterpret_cast<CUstream>(k.user),
                                plan, sum, batch_copies),
                  CUDA_SUCCESS)
            << label;
      }
      first_slice += rs_slices(chunk, slice);
      for (int r = 0; r < nranks; ++r) {
        Rank& k = ranks[r];
        ASSERT_EQ(cudaSetDevice(k.device), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(k.user), cudaSuccess) << label;
        std::vector<uint8_t> got(chunk), want;
        ASSERT_EQ(cudaMemcpy(got.data(), k.recv, chunk, cudaMemcpyDeviceToHost), cudaSuccess);
        // The plan's order: my chunk first, then ranks r+1, r+2, ...
        std::vector<std::vector<uint8_t>> src;
        for (int j = 0; j < nranks; ++j) {
          const std::vector<uint8_t>& in = inputs[(r + j) % nranks];
          src.emplace_back(in.begin() + static_cast<long>(r * chunk),
                           in.begin() + static_cast<long>((r + 1) * chunk));
        }
        reference(t, src, count, premul, scale_bits, &want);
        size_t wrong = 0;
        for (size_t i = 0; i < chunk; ++i) wrong += got[i] != want[i];
        EXPECT_EQ(wrong, 0u) << label << " op " << op << " rank " << r;
      }
    }
    for (Rank& k : ranks) {
      cudaSetDevice(k.device);
      k.kernels.unload(*cu_);
      for (CUstream s : k.streams) cudaStreamDestroy(reinterpret_cast<cudaStream_t>(s));
      for (CUevent e : k.events) cudaEventDestroy(reinterpret_cast<cudaEvent_t>(e));
      cudaStreamDestroy(k.user);
      cudaFree(k.send);
      cudaFree(k.recv);
      cudaFree(k.scratch);
    }
    cudaFreeHost(flags);
  }

  const CudaDriver* cu_ = nullptr;
  int ngpus_ = 0;
};

TEST_F(ReduceScatterPlanGpu, RanksSumTheirChunksBitwiseInThePlansOrder) {
  const uint64_t odd = (uint64_t{1} << 20) + 3;  // a short last slice, chunks off 16 bytes
  for (int nranks : {2, 3, 4})
    for (const TypeCase& t : {kTypes[0], kTypes[2]})
      for (bool premul : {false, true}) run(nranks, t, premul, odd, uint64_t{256} << 10);
  // The library's own slicing: one slice of the whole chunk.
  run(2, kTypes[0], true, odd, rs_slice_bytes(odd * 4, 4, 2, uint64_t{64} << 20));
  // One copy a call, as in a capture.
  run(3, kTypes[2], true, odd, uint64_t{256} << 10, false);
}

}  // namespace
}  // namespace zc
