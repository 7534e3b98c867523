// A libnccl.so.2 whose functions return at once: the baseline zerocta-overhead measures the
// shim against on a machine without a GPU (the test fake logs every call, far too slow to
// resolve tens of nanoseconds). Exports each function and its pncclX alias, like NCCL.
#include <nccl.h>

#include <cstring>

#define NULL_EXPORT extern "C" __attribute__((visibility("default")))
#define NULL_ALIAS(name) NULL_EXPORT __attribute__((alias(#name))) decltype(name) p##name;

namespace {
int g_comm_storage;
}

NULL_EXPORT ncclResult_t ncclGetVersion(int* v) {
  *v = NCCL_VERSION_CODE;
  return ncclSuccess;
}
NULL_ALIAS(ncclGetVersion)
NULL_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof(*id));
  return ncclSuccess;
}
NULL_ALIAS(ncclGetUniqueId)
NULL_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t* c, int, ncclUniqueId, int,
                                                ncclConfig_t*) {
  *c = reinterpret_cast<ncclComm_t>(&g_comm_storage);
  return ncclSuccess;
}
NULL_ALIAS(ncclCommInitRankConfig)
NULL_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* c, int n, ncclUniqueId id, int r) {
  return ncclCommInitRankConfig(c, n, id, r, nullptr);
}
NULL_ALIAS(ncclCommInitRank)
NULL_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclSuccess; }
NULL_ALIAS(ncclCommDestroy)
NULL_EXPORT ncclResult_t ncclCommCount(const ncclComm_t, int* n) {
  *n = 1;
  return ncclSuccess;
}
NULL_ALIAS(ncclCommCount)
NULL_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t, int* r) {
  *r = 0;
  return ncclSuccess;
}
NULL_ALIAS(ncclCommUserRank)
NULL_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t, int* d) {
  *d = 0;
  return ncclSuccess;
}
NULL_ALIAS(ncclCommCuDevice)
NULL_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) {
  *e = ncclSuccess;
  return ncclSuccess;
}
NULL_ALIAS(ncclCommGetAsyncError)
NULL_EXPORT ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                       ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}
NULL_ALIAS(ncclAllReduce)
NULL_EXPORT ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                                       cudaStream_t) {
  return ncclSuccess;
}
NULL_ALIAS(ncclAllGather)
