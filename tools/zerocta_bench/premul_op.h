// A reduce-scatter's ncclRedOp_t for one call on one communicator (--redop): ncclSum and ncclAvg
// are NCCL's constants; premul and premul-dev are pre-multiplied sums made the way PyTorch makes
// them (ProcessGroupNCCL's ncclRedOpRAII): ncclRedOpCreatePreMulSum right before the call, with
// this rank's scalar, and ncclRedOpDestroy as soon as the call has returned (in a group: before
// the group ends). Rank r of n multiplies its input by (r + 1) / (n + 1) rounded to the type
// (premul_scalar_bits, rs_kernels.h): every rank's scalar differs, and they are rounded unless
// n + 1 is a power of two (2 ranks: 1/3 and 2/3). premul passes it from the host
// (ncclScalarHostImmediate: NCCL copies it at creation), premul-dev as a device pointer
// (ncclScalarDevice: read when the op runs, so the memory outlives every op and graph that uses
// it: DeviceScalars).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <vector>

#include "options.h"

namespace zcb {

// The two calls, from the public symbols (the shim's under LD_PRELOAD) or from the loaded
// libnccl's own (the reference communicators, nccl_reference.h).
struct PreMulCalls {
  ncclResult_t (*create)(ncclRedOp_t*, void*, ncclDataType_t, ncclScalarResidence_t, ncclComm_t);
  ncclResult_t (*destroy)(ncclRedOp_t, ncclComm_t);
};
extern const PreMulCalls kPublicPreMulCalls;

// premul-dev: one element of `type` per rank of `ranks` (device = rank), on its GPU, holding
// that rank's scalar; nothing for the other reductions. The destructor waits for those devices
// to be idle before it frees them.
class DeviceScalars {
 public:
  DeviceScalars(RedOp red, ncclDataType_t type, const std::vector<int>& ranks, int nranks);
  ~DeviceScalars();
  DeviceScalars(const DeviceScalars&) = delete;
  DeviceScalars& operator=(const DeviceScalars&) = delete;
  void* get(size_t i) const { return i < ptrs_.size() ? ptrs_[i] : nullptr; }  // local rank i

 private:
  std::vector<int> ranks_;
  std::vector<void*> ptrs_;
};

// The reduction of one call by rank `rank` of `nranks` on `comm`; a pre-multiplied sum is made
// here and destroyed by the destructor, so the caller scopes it to the call. fatal() when NCCL
// refuses either.
class CallRedOp {
 public:
  CallRedOp(const PreMulCalls& calls, RedOp red, ncclDataType_t type, int rank, int nranks,
            ncclComm_t comm, void* device_scalar);
  ~CallRedOp();
  CallRedOp(const CallRedOp&) = delete;
  CallRedOp& operator=(const CallRedOp&) = delete;
  ncclRedOp_t get() const { return op_; }

 private:
  const PreMulCalls& calls_;
  ncclComm_t comm_;
  ncclRedOp_t op_ = ncclSum;
  bool made_ = false;
};

}  // namespace zcb
