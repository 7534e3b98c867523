// Mimics a PyTorch extension (torch/lib/libtorch_cuda.so): a library with libnccl.so.2 as a
// DT_NEEDED dependency that the application opens with dlopen(RTLD_NOW | RTLD_LOCAL). NCCL
// then lives in a local scope that RTLD_NEXT from a preloaded shim cannot see.
#include <nccl.h>

#define EXT_API extern "C" __attribute__((visibility("default")))

namespace {
ncclComm_t g_comm = nullptr;
}

// Creates this process's communicator the way ProcessGroupNCCL does without a config.
EXT_API int ext_init(int nranks, int rank) {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  return ncclCommInitRank(&g_comm, nranks, id, rank);
}

EXT_API int ext_allgather(const void* send, void* recv, size_t count, void* stream) {
  return ncclAllGather(send, recv, count, ncclFloat32, g_comm, static_cast<cudaStream_t>(stream));
}

EXT_API int ext_allreduce(const void* send, void* recv, size_t count, void* stream) {
  return ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, g_comm,
                       static_cast<cudaStream_t>(stream));
}

EXT_API int ext_bcast(void* buff, size_t count, int root, void* stream) {
  return ncclBcast(buff, count, ncclFloat32, root, g_comm, static_cast<cudaStream_t>(stream));
}

EXT_API int ext_destroy() {
  ncclResult_t r = ncclCommDestroy(g_comm);
  g_comm = nullptr;
  return r;
}
