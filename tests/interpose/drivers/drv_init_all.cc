// Device switching around communicator creation.
//
//   drv_init_all initall   device 3 current, ncclCommInitAll(3, {2,0,1})
//   drv_init_all initrank  device 1 current, ncclGetUniqueId + ncclCommInitRank
//
// Prints result, the comms' devices and ranks as NCCL reports them, and dev_before/dev_after:
// the calling thread's current device (fake driver) around the call.
#include <cuda.h>
#include <nccl.h>

#include <string>

#include "driver_util.h"

namespace {

int current_device() {
  CUcontext ctx = nullptr;
  if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return -100;
  if (ctx == nullptr) return -1;
  CUdevice dev = -1;
  if (cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -101;
  return dev;
}

void make_current(int dev) {
  CUcontext ctx = nullptr;
  if (cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
    exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  std::string mode = argv[1];
  if (cuInit(0) != CUDA_SUCCESS) return 2;
  drv::log_marker("driver-setup-begin");
  make_current(mode == "initall" ? 3 : 1);
  drv::out("dev_before", current_device());
  drv::log_marker("driver-setup-end");

  ncclComm_t comms[3] = {};
  int n = 0;
  ncclResult_t r;
  if (mode == "initall") {
    static const int kDevlist[3] = {2, 0, 1};
    r = ncclCommInitAll(comms, 3, kDevlist);
    n = 3;
  } else {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return 4;
    r = ncclCommInitRank(&comms[0], 2, id, 1);
    n = 1;
  }
  drv::log_marker("driver-check-begin");
  drv::out("dev_after", current_device());
  drv::out("result", r);
  for (int i = 0; i < n && r == ncclSuccess; ++i) {
    int dev = -1, rank = -1, count = -1;
    ncclCommCuDevice(comms[i], &dev);
    ncclCommUserRank(comms[i], &rank);
    ncclCommCount(comms[i], &count);
    std::string k = "comm" + std::to_string(i);
    drv::out(k + ".device", dev);
    drv::out(k + ".rank", rank);
    drv::out(k + ".count", count);
  }
  for (int i = 0; i < n && r == ncclSuccess; ++i) ncclCommDestroy(comms[i]);
  return 0;
}
