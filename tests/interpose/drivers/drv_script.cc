// Runs a sequence of NCCL calls named on the command line, printing "<step>=<result>" for
// each step in order (step names get a ".N" suffix when repeated).
//
//   pid version uniqueid init asyncerror allgather allreduce bcast shrink destroy
//   window (the all-gather's buffers registered as a symmetric window) groupwindow (the same
//   inside ncclGroupStart/End: NCCL hands the window out only at the group's end)
//   ready (ncclCommGetAsyncError until not in progress, at most 100 polls: "ready" is the
//   final state, "ready_polls" how many answered in progress, "window_now" whether the last
//   window's handle is written by then; a non-blocking comm's window is written that late)
//   stats:<tag>  marker:<text>  setdev:<n> (fake driver)  getdev
//
// "init" is ncclGetUniqueId + ncclCommInitRank(nranks 2, rank 0) on the current device.
#include <cuda.h>
#include <nccl.h>

#include <map>
#include <string>

#include "driver_util.h"

namespace {

ncclComm_t g_comm = nullptr;
ncclWindow_t g_win = nullptr;  // the last window step's handle, as NCCL writes it
std::map<std::string, int> g_seen;
cudaStream_t stream() { return static_cast<cudaStream_t>(drv::fake_stream(1)); }

void result(const std::string& step, long long value) {
  int n = g_seen[step]++;
  drv::out(n == 0 ? step : step + "." + std::to_string(n), value);
}

int current_device() {
  CUcontext ctx = nullptr;
  if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return -100;
  return ctx == nullptr ? -1 : static_cast<int>(reinterpret_cast<uintptr_t>(ctx) - 0x1000);
}

bool run_step(const std::string& step) {
  if (step == "pid") {
    result("pid", getpid());
  } else if (step == "version") {
    int v = 0;
    result("version", ncclGetVersion(&v));
    result("version_code", v);
  } else if (step == "uniqueid") {
    ncclUniqueId id;
    result("uniqueid", ncclGetUniqueId(&id));
  } else if (step == "init") {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r == ncclSuccess) r = ncclCommInitRank(&g_comm, 2, id, 0);
    result("init", r);
  } else if (step == "asyncerror") {
    ncclResult_t e = ncclInProgress;
    result("asyncerror", ncclCommGetAsyncError(g_comm, &e));
  } else if (step == "window" || step == "groupwindow") {
    // fake_buffer(1) and (2), the all-gather's send and receive buffers, lie 1 MiB apart.
    ncclWindow_t& win = g_win;
    const bool grouped = step == "groupwindow";
    if (grouped) ncclGroupStart();
    ncclResult_t r =
        ncclCommWindowRegister(g_comm, drv::fake_buffer(1), 2 << 20, &win, NCCL_WIN_COLL_SYMMETRIC);
    if (grouped) {
      result("window_before_end", win != nullptr);
      const ncclResult_t end = ncclGroupEnd();
      if (r == ncclSuccess) r = end;
    }
    result(step, r);
    result("window_handed_out", win != nullptr);
  } else if (step == "ready") {
    ncclResult_t state = ncclInProgress;
    int polls = 0;
    for (; polls < 100; ++polls) {
      state = ncclInProgress;
      if (ncclCommGetAsyncError(g_comm, &state) != ncclSuccess || state != ncclInProgress) break;
    }
    result("ready", state);
    result("ready_polls", polls);
    result("window_now", __atomic_load_n(&g_win, __ATOMIC_ACQUIRE) != nullptr);
  } else if (step == "allgather") {
    result("allgather", ncclAllGather(drv::fake_buffer(1), drv::fake_buffer(2), 1024, ncclFloat32,
                                      g_comm, stream()));
  } else if (step == "allreduce") {
    result("allreduce", ncclAllReduce(drv::fake_buffer(3), drv::fake_buffer(3), 2048, ncclFloat32,
                                      ncclSum, g_comm, stream()));
  } else if (step == "bcast") {
    result("bcast", ncclBcast(drv::fake_buffer(4), 512, ncclInt8, 0, g_comm, stream()));
  } else if (step == "shrink") {
    int excluded[1] = {1};
    ncclComm_t out = nullptr;
    ncclResult_t r = ncclCommShrink(g_comm, excluded, 1, &out, nullptr, NCCL_SHRINK_DEFAULT);
    result("shrink", r);
    if (r == ncclSuccess && out != nullptr) ncclCommDestroy(out);
  } else if (step == "destroy") {
    result("destroy", ncclCommDestroy(g_comm));
    g_comm = nullptr;
  } else if (step.rfind("stats:", 0) == 0) {
    drv::print_stats(step.c_str() + 6);
  } else if (step.rfind("marker:", 0) == 0) {
    drv::log_marker(step.c_str() + 7);
  } else if (step.rfind("setdev:", 0) == 0) {
    CUcontext ctx = nullptr;
    int dev = atoi(step.c_str() + 7);
    bool ok = cuInit(0) == CUDA_SUCCESS && cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS &&
              cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
    result("setdev", ok ? 0 : 1);
  } else if (step == "getdev") {
    result("getdev", current_device());
  } else {
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!run_step(argv[i])) {
      fprintf(stderr, "driver: unknown step %s\n", argv[i]);
      return 64;
    }
  }
  return 0;
}
