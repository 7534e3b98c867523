#include "gpu_hello.h"

#include <unistd.h>

#include <cstdio>

#include "cuda_check.h"

namespace zcb {

HelloMsg gpu_hello(int rank, int device) {
  HelloMsg h{};
  h.rank = rank;
  h.device = device;
  h.pid = static_cast<int32_t>(getpid());
  cudaDeviceProp prop{};
  ZCB_CUDA(cudaGetDeviceProperties(&prop, device));
  snprintf(h.gpu_name, sizeof(h.gpu_name), "%.*s", static_cast<int>(sizeof(h.gpu_name) - 1),
           prop.name);
  ZCB_CUDA(cudaDeviceGetPCIBusId(h.bus_id, sizeof(h.bus_id), device));
  return h;
}

}  // namespace zcb
