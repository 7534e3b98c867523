// Fake NCCL: the argument checks of the real NCCL 2.28, on request (FAKE_NCCL_CHECK_ARGS=1).
//
// Without the variable every collective succeeds whatever it is given, which the existing
// tests rely on (made-up communicators, any root). The bad-input tests turn the checks on so
// that the fake answers a bad call the way NCCL's CommCheck/ArgsCheck (enqueue.cc) and
// ncclCommInitAll's device-list check (init.cc) do; a shim in front must hand back exactly
// that answer. Buffers are not checked, as with NCCL's default NCCL_CHECK_POINTERS=0.
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "fake_nccl_internal.h"

namespace fake {

bool check_args_enabled() {
  const char* env = getenv("FAKE_NCCL_CHECK_ARGS");
  return env != nullptr && strcmp(env, "1") == 0;
}

ncclResult_t check_coll_args(const CollArgs& a) {
  if (!check_args_enabled()) return ncclSuccess;
  // CommCheck: a NULL handle, or one whose magic is wrong (NCCL reads it; here: not a live
  // fake communicator, which is also what a destroyed one is).
  const Comm* c = find_comm(a.comm);
  if (c == nullptr) return ncclInvalidArgument;
  // ArgsCheck: root (peer for send/recv), datatype, reduction operator.
  if (a.has_root && (a.root < 0 || a.root >= c->nranks)) return ncclInvalidArgument;
  if (a.datatype < 0 || a.datatype >= ncclNumTypes) return ncclInvalidArgument;
  // An operator outside the built-in ones must be one the application created (NCCL:
  // "Invalid user defined reduction operator").
  if (a.has_op && !redop_exists(a.op)) return ncclInvalidArgument;
  return ncclSuccess;
}

ncclResult_t check_device_list(int ndev, const int* devlist) {
  if (!check_args_enabled()) return ncclSuccess;
  if (ndev < 0) return ncclInvalidArgument;
  if (devlist == nullptr) return ncclSuccess;
  int total = 0;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&total) != CUDA_SUCCESS)
    return ncclUnhandledCudaError;
  std::vector<bool> seen(static_cast<size_t>(total), false);
  for (int i = 0; i < ndev; ++i) {
    const int d = devlist[i];
    if (d < 0 || d >= total) return ncclInvalidArgument;        // "Invalid device"
    if (seen[static_cast<size_t>(d)]) return ncclInvalidUsage;  // duplicate device
    seen[static_cast<size_t>(d)] = true;
  }
  return ncclSuccess;
}

}  // namespace fake
