#include "peer_push.h"

#include "cuda_check.h"
#include "gpu_hello.h"

namespace zcb {

void setup_peer_gpu(int g, int ngpus, Channel* ch) {
  ZCB_CUDA(cudaSetDevice(g));
  for (int p = 0; p < ngpus; ++p) {
    if (p == g) continue;
    int can = 0;
    ZCB_CUDA(cudaDeviceCanAccessPeer(&can, g, p));
    if (!can) fatal("GPU %d cannot access GPU %d's memory (no P2P): no copy-engine ceiling", g, p);
    cudaError_t e = cudaDeviceEnablePeerAccess(p, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled)
      cudaGetLastError();  // clear it, so a later cudaGetLastError() does not report it
    else if (e != cudaSuccess)
      fatal("cudaDeviceEnablePeerAccess(%d) on GPU %d: %s", p, g, cudaGetErrorString(e));
  }
  HelloMsg h = gpu_hello(g, g);
  ch->send(kMsgHello, &h, sizeof(h));
}

namespace {

// One cudaMemcpyBatchAsync of every (dst, src, size) on `stream`, "prefer overlap with compute".
void batch(std::vector<void*>& dsts, std::vector<const void*>& srcs, std::vector<size_t>& sizes,
           cudaStream_t stream) {
  if (dsts.empty()) return;
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attr_index = 0;
#if CUDART_VERSION >= 13000
  ZCB_CUDA(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr,
                                &attr_index, 1, stream));
#else
  size_t fail_index = 0;
  ZCB_CUDA(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr,
                                &attr_index, 1, &fail_index, stream));
#endif
}

}  // namespace

void enqueue_pushes(int g, const std::vector<PeerBuffers>& bufs, uint64_t chunk, bool in_place,
                    cudaStream_t stream) {
  const int n = static_cast<int>(bufs.size());
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  const char* src = in_place ? bufs[g].recv + g * chunk : bufs[g].send;
  for (int k = 1; k < n; ++k) {
    const int q = (g + k) % n;  // rotated, so that no GPU is written by every GPU first
    dsts.push_back(bufs[q].recv + g * chunk);
    srcs.push_back(src);
    sizes.push_back(chunk);
  }
  batch(dsts, srcs, sizes, stream);
}

void enqueue_rs_pushes(int g, const std::vector<PeerBuffers>& bufs, uint64_t chunk,
                       cudaStream_t stream) {
  const int n = static_cast<int>(bufs.size());
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (int k = 1; k < n; ++k) {
    const int q = (g + k) % n;  // rotated, as the all-gather's pushes
    dsts.push_back(bufs[q].recv + g * chunk);
    srcs.push_back(bufs[g].send + q * chunk);
    sizes.push_back(chunk);
  }
  batch(dsts, srcs, sizes, stream);
}

}  // namespace zcb
