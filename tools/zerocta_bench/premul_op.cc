#include "premul_op.h"

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_check.h"
#include "rs_kernels.h"

namespace zcb {

const PreMulCalls kPublicPreMulCalls = {ncclRedOpCreatePreMulSum, ncclRedOpDestroy};

namespace {

// The bytes NCCL reads for a scalar of `type`: 4 for float, 2 for half and bfloat16.
size_t scalar_bytes(ncclDataType_t type) { return type == ncclFloat32 ? 4 : 2; }

// A scalar's bits laid out as `type` stores them, to point NCCL (or cudaMemcpy) at.
struct ScalarValue {
  uint32_t bits32;
  uint16_t bits16;
  ScalarValue(ncclDataType_t type, int rank, int nranks)
      : bits32(premul_scalar_bits(type, rank, nranks)), bits16(static_cast<uint16_t>(bits32)) {}
  void* bytes(ncclDataType_t type) {
    return scalar_bytes(type) == 4 ? static_cast<void*>(&bits32) : &bits16;
  }
};

}  // namespace

DeviceScalars::DeviceScalars(RedOp red, ncclDataType_t type, const std::vector<int>& ranks,
                             int nranks)
    : ranks_(ranks) {
  if (red != RedOp::kPreMulDev) return;
  for (int r : ranks) {
    ZCB_CUDA(cudaSetDevice(r));
    void* p = nullptr;
    ZCB_CUDA(cudaMalloc(&p, sizeof(uint32_t)));
    ptrs_.push_back(p);
    ScalarValue v(type, r, nranks);
    ZCB_CUDA(cudaMemcpy(p, v.bytes(type), scalar_bytes(type), cudaMemcpyHostToDevice));
  }
}

DeviceScalars::~DeviceScalars() {
  for (size_t i = 0; i < ptrs_.size(); ++i) {
    cudaSetDevice(ranks_[i]);
    cudaDeviceSynchronize();
    cudaFree(ptrs_[i]);
  }
}

CallRedOp::CallRedOp(const PreMulCalls& calls, RedOp red, ncclDataType_t type, int rank, int nranks,
                     ncclComm_t comm, void* device_scalar)
    : calls_(calls), comm_(comm) {
  if (!redop_is_premul(red)) {
    op_ = red == RedOp::kAvg ? ncclAvg : ncclSum;
    return;
  }
  const bool on_device = red == RedOp::kPreMulDev;
  if (on_device && device_scalar == nullptr)
    fatal("premul-dev: no device scalar for rank %d", rank);
  ScalarValue v(type, rank, nranks);  // read by NCCL during the create call alone
  ZCB_NCCL(calls.create(&op_, on_device ? device_scalar : v.bytes(type), type,
                        on_device ? ncclScalarDevice : ncclScalarHostImmediate, comm));
  made_ = true;
}

CallRedOp::~CallRedOp() {
  if (made_) ZCB_NCCL(calls_.destroy(op_, comm_));
}

}  // namespace zcb
