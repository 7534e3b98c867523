#include "check.h"

#include <cstring>

#include "cuda_check.h"
#include "kernels.h"

namespace zcb {

WrongCounter::WrongCounter() {
  ZCB_CUDA(cudaMalloc(&d_wrong_, sizeof(*d_wrong_)));
  ZCB_CUDA(cudaMallocHost(&h_wrong_, sizeof(*h_wrong_)));
  ZCB_CUDA(cudaMalloc(&d_maxdiff_, sizeof(*d_maxdiff_)));
  ZCB_CUDA(cudaMallocHost(&h_maxdiff_, sizeof(*h_maxdiff_)));
}

WrongCounter::~WrongCounter() {
  cudaFree(d_wrong_);
  cudaFreeHost(h_wrong_);
  cudaFree(d_maxdiff_);
  cudaFreeHost(h_maxdiff_);
}

int64_t WrongCounter::count_rs(const RsCheck& c, double* maxdiff, cudaStream_t stream) {
  ZCB_CUDA(cudaMemsetAsync(d_wrong_, 0, sizeof(*d_wrong_), stream));
  ZCB_CUDA(cudaMemsetAsync(d_maxdiff_, 0, sizeof(*d_maxdiff_), stream));
  if (!launch_check_rs(c, d_wrong_, d_maxdiff_, stream))
    fatal("no reduce-scatter check for data type %d", static_cast<int>(c.type));
  ZCB_CUDA(cudaGetLastError());
  ZCB_CUDA(
      cudaMemcpyAsync(h_maxdiff_, d_maxdiff_, sizeof(*h_maxdiff_), cudaMemcpyDeviceToHost, stream));
  const int64_t wrong = collect(stream);  // synchronizes
  memcpy(maxdiff, h_maxdiff_, sizeof(*maxdiff));
  return wrong;
}

int64_t WrongCounter::count(const void* recv, size_t chunk_bytes, int nchunks, int elem_bytes,
                            uint64_t seed, int skip_chunk, cudaStream_t stream) {
  ZCB_CUDA(cudaMemsetAsync(d_wrong_, 0, sizeof(*d_wrong_), stream));
  launch_count_wrong(recv, chunk_bytes, nchunks, elem_bytes, seed, skip_chunk, d_wrong_, stream);
  return collect(stream);
}

int64_t WrongCounter::count_sum(const void* out, uint64_t n, uint64_t base, int nranks,
                                ncclDataType_t type, const ReducePattern& p, cudaStream_t stream) {
  ZCB_CUDA(cudaMemsetAsync(d_wrong_, 0, sizeof(*d_wrong_), stream));
  if (!launch_count_wrong_sum(out, n, base, nranks, type, p, d_wrong_, stream))
    fatal("no reduction check for data type %d", static_cast<int>(type));
  return collect(stream);
}

int64_t WrongCounter::collect(cudaStream_t stream) {
  ZCB_CUDA(cudaGetLastError());
  ZCB_CUDA(cudaMemcpyAsync(h_wrong_, d_wrong_, sizeof(*d_wrong_), cudaMemcpyDeviceToHost, stream));
  ZCB_CUDA(cudaStreamSynchronize(stream));
  return static_cast<int64_t>(*h_wrong_);
}

}  // namespace zcb
