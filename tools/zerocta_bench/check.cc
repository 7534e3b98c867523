#include "check.h"

#include "cuda_check.h"
#include "kernels.h"

namespace zcb {

WrongCounter::WrongCounter() {
  ZCB_CUDA(cudaMalloc(&d_wrong_, sizeof(*d_wrong_)));
  ZCB_CUDA(cudaMallocHost(&h_wrong_, sizeof(*h_wrong_)));
}

WrongCounter::~WrongCounter() {
  cudaFree(d_wrong_);
  cudaFreeHost(h_wrong_);
}

int64_t WrongCounter::count(const void* recv, size_t chunk_bytes, int nchunks, int elem_bytes,
                            uint64_t seed, int skip_chunk, cudaStream_t stream) {
  ZCB_CUDA(cudaMemsetAsync(d_wrong_, 0, sizeof(*d_wrong_), stream));
  launch_count_wrong(recv, chunk_bytes, nchunks, elem_bytes, seed, skip_chunk, d_wrong_, stream);
  ZCB_CUDA(cudaGetLastError());
  ZCB_CUDA(cudaMemcpyAsync(h_wrong_, d_wrong_, sizeof(*d_wrong_), cudaMemcpyDeviceToHost, stream));
  ZCB_CUDA(cudaStreamSynchronize(stream));
  return static_cast<int64_t>(*h_wrong_);
}

}  // namespace zcb
