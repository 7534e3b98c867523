// Proves by its effect that the zero-CTA policy (NCCL_CTA_POLICY_ZERO) reached a
// communicator: NCCL 2.28 runs an all-gather on its copy engines, launching no kernel, only
// when the communicator's policy is ZERO and both buffers lie in NCCL_WIN_COLL_SYMMETRIC
// windows. So on 2 ranks, for communicators the application created without asking for the
// policy, the test registers windows, runs ncclAllGather on a non-default stream and counts
// the kernels the GPU ran with CUPTI: 0 means the copy-engine path (policy active), > 0 the
// kernel path.
//
//   ZCTEST_EXPECT_CE=1   every communicator must take the copy-engine path (run with the shim)
//   ZCTEST_EXPECT_CE=0   every communicator must launch kernels (run without the shim)
//   unset                only report: policy-check comm=<name> kernels=<n> ce=<yes|no> ...
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cupti_counter.h"
#include "gpu_gtest.h"
#include "gpu_kernels.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

constexpr int kMeasuredOps = 3;

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ",") + n;
  return s.empty() ? "-" : s;
}

// Runs the window-registered all-gather on `comm` and reports whether a kernel ran. Returns
// false when an expectation failed.
bool policy_check(ncclComm_t comm, const char* name, int rank, int nranks) {
  const size_t bytes = static_cast<size_t>(env_long("ZCTEST_POLICY_BYTES", 8 << 20));
  const size_t count = bytes / sizeof(float);
  const size_t cb = count * sizeof(float);
  const long expect = env_long("ZCTEST_EXPECT_CE", -1);

  cudaStream_t stream;
  ZG_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* send = nullptr;
  void* recv = nullptr;
  ZG_NCCL(ncclMemAlloc(&send, cb));
  ZG_NCCL(ncclMemAlloc(&recv, cb * static_cast<size_t>(nranks)));
  // NCCL 2.28 may leave the handle untouched when windows are unsupported.
  ncclWindow_t send_win = nullptr;
  ncclWindow_t recv_win = nullptr;
  ZG_NCCL(ncclCommWindowRegister(comm, send, cb, &send_win, NCCL_WIN_COLL_SYMMETRIC));
  ZG_NCCL(ncclCommWindowRegister(comm, recv, cb * nranks, &recv_win, NCCL_WIN_COLL_SYMMETRIC));
  const bool windows = send_win != nullptr && recv_win != nullptr;

  std::vector<std::vector<uint8_t>> inputs;
  for (int q = 0; q < nranks; ++q) {
    inputs.push_back(make_input(ncclFloat32, count, seed_of({0x90, static_cast<uint64_t>(q)})));
  }
  ZG_CUDA(cudaMemcpyAsync(send, inputs[rank].data(), cb, cudaMemcpyHostToDevice, stream));

  // The first all-gather may set things up (NCCL allocates its CE flag window, the shim may
  // prepare its pool); only the ones after it are measured.
  ZG_NCCL(ncclAllGather(send, recv, count, ncclFloat32, comm, stream));
  wait_stream(stream, std::string("warm-up all-gather on ") + name);
  heartbeat();

  ZG_CUDA(cudaMemsetAsync(recv, kPoison, cb * nranks, stream));
  cupti_begin_window();  // synchronises the device first: nothing earlier is counted
  for (int i = 0; i < kMeasuredOps; ++i) {
    ZG_NCCL(ncclAllGather(send, recv, count, ncclFloat32, comm, stream));
  }
  wait_stream(stream, std::string("measured all-gathers on ") + name);
  ActivityCounts measured = cupti_end_window();
  heartbeat();

  // Positive control: CUPTI must see a kernel we launch ourselves, or "0 kernels" above
  // would prove nothing.
  cupti_begin_window();
  launch_noop_kernel(stream);
  ZG_CUDA(cudaGetLastError());
  wait_stream(stream, "control kernel");
  ActivityCounts control = cupti_end_window();

  std::vector<uint8_t> got(cb * nranks);
  ZG_CUDA(cudaMemcpyAsync(got.data(), recv, got.size(), cudaMemcpyDeviceToHost, stream));
  wait_stream(stream, "copy back");
  bool ok = true;
  for (int q = 0; q < nranks; ++q) {
    const size_t diff = first_difference(got.data() + q * cb, inputs[q].data(), cb);
    if (diff != SIZE_MAX) {
      report(std::string("all-gather on ") + name + " gave wrong data from rank " +
             std::to_string(q) + " at byte " + std::to_string(diff));
      ok = false;
    }
  }

  const bool ce = measured.kernels == 0;
  printf(
      "policy-check comm=%s kernels=%d ce=%s rank=%d memcpys=%d windows=%s control-kernels=%d "
      "nccl=%d zerocta=%s kernel-names=%s\n",
      name, measured.kernels, ce ? "yes" : "no", rank, measured.memcpys,
      windows ? "registered" : "NULL", control.kernels, real_nccl_version(),
      shim_get_stats() ? "yes" : "no", join(measured.kernel_names).c_str());
  fflush(stdout);

  if (control.kernels < 1) {
    report("CUPTI did not record the control kernel: kernel counts cannot be trusted");
    ok = false;
  }
  if (expect >= 0) {
    if (!windows) {
      report(std::string("comm=") + name +
             ": ncclCommWindowRegister gave a NULL window, so NCCL cannot use its CE path");
      ok = false;
    }
    if ((expect != 0) != ce) {
      report(std::string("comm=") + name + ": expected " +
             (expect ? "the copy-engine path (0 kernels)" : "the kernel path (kernels > 0)") +
             ", observed " + std::to_string(measured.kernels) + " kernels (" +
             join(measured.kernel_names) + ")");
      ok = false;
    }
  }

  // Windows go before the memory and before the communicator.
  if (recv_win) ZG_NCCL(ncclCommWindowDeregister(comm, recv_win));
  if (send_win) ZG_NCCL(ncclCommWindowDeregister(comm, send_win));
  ZG_NCCL(ncclMemFree(recv));
  ZG_NCCL(ncclMemFree(send));
  ZG_CUDA(cudaStreamDestroy(stream));
  return ok;
}

int policy_rank(const RankContext& ctx) {
  bool ok = true;
  // The plain init an old application or nccl-tests uses: no config at all.
  ncclComm_t world = init_comm(ctx, InitKind::kInitRank, 0);
  ok &= policy_check(world, "world", ctx.rank, ctx.nranks);

  // A child of the world made with a NULL config (inherits the parent's).
  ncclComm_t child = nullptr;
  ZG_NCCL(ncclCommSplit(world, 0, ctx.rank, &child, nullptr));
  if (child == nullptr) fail("ncclCommSplit returned a NULL communicator");
  ok &= policy_check(child, "split", ctx.rank, ctx.nranks);
  ZG_NCCL(ncclCommDestroy(child));

  // What PyTorch does: a config with the CTA policy left unset.
  ncclComm_t configured = init_comm(ctx, InitKind::kInitRankConfig, 1);
  ok &= policy_check(configured, "config", ctx.rank, ctx.nranks);
  ZG_NCCL(ncclCommDestroy(configured));

  ZG_NCCL(ncclCommDestroy(world));
  const std::string stats = shim_allgather_stats_line();
  if (!stats.empty()) printf("[rank %d] zerocta stats: %s\n", ctx.rank, stats.c_str());
  return ok ? 0 : 1;
}

TEST(Policy, ZeroCtaReachesEveryCommunicator) {
  ZG_REQUIRE_GPUS(2);
  RunOptions options = default_run_options(300);
  options.num_ids = 2;
  options.before_cuda = [](int) { cupti_start(); };
  RunResult result = run_ranks(2, policy_rank, options);
  EXPECT_TRUE(result.ok()) << result.summary();
}

}  // namespace
}  // namespace zgpu
