// Error checks for the worker processes: any CUDA, NCCL or cuBLAS failure is fatal() with the
// call's text and location, which the parent prints and records as the path's error.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "channel.h"

#define ZCB_CUDA(call)                                                                          \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess)                                                                      \
      ::zcb::fatal("%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)

#define ZCB_NCCL(call)                                                          \
  do {                                                                          \
    ncclResult_t r_ = (call);                                                   \
    if (r_ != ncclSuccess)                                                      \
      ::zcb::fatal("%s failed: %s (%d) (%s:%d)", #call, ncclGetErrorString(r_), \
                   static_cast<int>(r_), __FILE__, __LINE__);                   \
  } while (0)
