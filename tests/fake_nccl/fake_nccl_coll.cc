// Fake NCCL: collectives, point-to-point and groups. Nothing touches data (the buffers in
// these tests are made-up addresses); every call is logged with its arguments and succeeds,
// unless FAKE_NCCL_CHECK_ARGS=1 asks for NCCL's argument checks (fake_nccl_argcheck.cc).
// ncclBcast is implemented by calling the exported ncclBroadcast, as the real NCCL does.
// Inside a group a collective is checked and logged at the call ("... -> 0 queued") and
// launched at the outermost ncclGroupEnd of the thread (fake_nccl_state.cc). A collective on a
// comm still in progress (FAKE_NCCL_NONBLOCKING=1) is refused as NCCL refuses it.
#include "fake_nccl_internal.h"

using fake::finish;
using fake::hex_ptr;
using fake::name_of;
using fake::strf;

namespace {

std::string tail(ncclComm_t comm, cudaStream_t stream) {
  return " comm=" + name_of(comm) + " stream=" + hex_ptr(stream);
}

ncclResult_t coll(const char* fn, const std::string& line, const fake::CollArgs& args) {
  if (fake::should_fail(fn)) return finish(line, ncclInternalError);
  ncclResult_t r = fake::check_coll_args(args);
  if (r == ncclSuccess) r = fake::ensure_ready(args.comm);
  if (r != ncclSuccess) return finish(line, r);
  if (fake::queue_if_grouped(line, args.comm)) return ncclSuccess;
  return finish(line, ncclSuccess);
}

fake::CollArgs args_of(ncclComm_t comm, ncclDataType_t datatype) {
  fake::CollArgs a;
  a.comm = comm;
  a.datatype = datatype;
  return a;
}
fake::CollArgs with_op(fake::CollArgs a, ncclRedOp_t op) {
  a.has_op = true;
  a.op = op;
  return a;
}
fake::CollArgs with_root(fake::CollArgs a, int root) {
  a.has_root = true;
  a.root = root;
  return a;
}

}  // namespace

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclReduce",
              "ncclReduce sendbuff=" + hex_ptr(sendbuff) + " recvbuff=" + hex_ptr(recvbuff) +
                  strf(" count=%zu datatype=%d op=%d root=%d", count, datatype, op, root) +
                  tail(comm, stream),
              with_root(with_op(args_of(comm, datatype), op), root));
}
FAKE_PNCCL_ALIAS(ncclReduce)

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return coll("ncclBroadcast",
              "ncclBroadcast sendbuff=" + hex_ptr(sendbuff) + " recvbuff=" + hex_ptr(recvbuff) +
                  strf(" count=%zu datatype=%d root=%d", count, datatype, root) +
                  tail(comm, stream),
              with_root(args_of(comm, datatype), root));
}
FAKE_PNCCL_ALIAS(ncclBroadcast)

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  std::string line = "ncclBcast buff=" + hex_ptr(buff) +
                     strf(" count=%zu datatype=%d root=%d", count, datatype, root) +
                     tail(comm, stream);
  if (fake::should_fail("ncclBcast")) return finish(line, ncclInternalError);
  // Through the PLT (this library is built with default visibility and semantic
  // interposition), so a preloaded shim sees an inner call coming from this library.
  // Inside a group that ncclBroadcast is the operation queued.
  ncclResult_t r = ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
  if (r == ncclSuccess && fake::group_depth() > 0) {
    fake::log_line(line + " -> 0 queued");
    return r;
  }
  return finish(line, r);
}
FAKE_PNCCL_ALIAS(ncclBcast)

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return coll("ncclAllReduce",
              "ncclAllReduce sendbuff=" + hex_ptr(sendbuff) + " recvbuff=" + hex_ptr(recvbuff) +
                  strf(" count=%zu datatype=%d op=%d", count, datatype, op) + tail(comm, stream),
              with_op(args_of(comm, datatype), op));
}
FAKE_PNCCL_ALIAS(ncclAllReduce)

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return coll("ncclReduceScatter",
              "ncclReduceScatter sendbuff=" + hex_ptr(sendbuff) + " recvbuff=" + hex_ptr(recvbuff) +
                  strf(" recvcount=%zu datatype=%d op=%d", recvcount, datatype, op) +
                  tail(comm, stream),
              with_op(args_of(comm, datatype), op));
}
FAKE_PNCCL_ALIAS(ncclReduceScatter)

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclAllGather",
              "ncclAllGather sendbuff=" + hex_ptr(sendbuff) + " recvbuff=" + hex_ptr(recvbuff) +
                  strf(" sendcount=%zu datatype=%d", sendcount, datatype) + tail(comm, stream),
              args_of(comm, datatype));
}
FAKE_PNCCL_ALIAS(ncclAllGather)

ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclAlltoAll",
              "ncclAlltoAll sendbuff=" + hex_ptr(sendbuff) + " recvbuff=" + hex_ptr(recvbuff) +
                  strf(" count=%zu datatype=%d", count, datatype) + tail(comm, stream),
              args_of(comm, datatype));
}
FAKE_PNCCL_ALIAS(ncclAlltoAll)

ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclGather",
              "ncclGather sendbuff=" + hex_ptr(sendbuff) + " recvbuff=" + hex_ptr(recvbuff) +
                  strf(" count=%zu datatype=%d root=%d", count, datatype, root) +
                  tail(comm, stream),
              with_root(args_of(comm, datatype), root));
}
FAKE_PNCCL_ALIAS(ncclGather)

ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclScatter",
              "ncclScatter sendbuff=" + hex_ptr(sendbuff) + " recvbuff=" + hex_ptr(recvbuff) +
                  strf(" count=%zu datatype=%d root=%d", count, datatype, root) +
                  tail(comm, stream),
              with_root(args_of(comm, datatype), root));
}
FAKE_PNCCL_ALIAS(ncclScatter)

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclSend",
              "ncclSend sendbuff=" + hex_ptr(sendbuff) +
                  strf(" count=%zu datatype=%d peer=%d", count, datatype, peer) +
                  tail(comm, stream),
              with_root(args_of(comm, datatype), peer));
}
FAKE_PNCCL_ALIAS(ncclSend)

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return coll("ncclRecv",
              "ncclRecv recvbuff=" + hex_ptr(recvbuff) +
                  strf(" count=%zu datatype=%d peer=%d", count, datatype, peer) +
                  tail(comm, stream),
              with_root(args_of(comm, datatype), peer));
}
FAKE_PNCCL_ALIAS(ncclRecv)

ncclResult_t ncclGroupStart() {
  if (fake::should_fail("ncclGroupStart")) return finish("ncclGroupStart", ncclInternalError);
  fake::group_start();
  return finish(strf("ncclGroupStart depth=%d", fake::group_depth()), ncclSuccess);
}
FAKE_PNCCL_ALIAS(ncclGroupStart)

ncclResult_t ncclGroupEnd() {
  if (fake::should_fail("ncclGroupEnd")) return finish("ncclGroupEnd", ncclInternalError);
  if (fake::group_depth() == 0) return finish("ncclGroupEnd depth=0", ncclInvalidUsage);
  fake::group_leave();
  const int depth = fake::group_depth();
  // The outermost end completes the deferred inits and launches the queued operations; the
  // line says what it did (nothing is added for an empty group).
  std::string summary;
  ncclResult_t r = depth == 0 ? fake::group_finish(/*simulate=*/false, &summary) : ncclSuccess;
  return finish(strf("ncclGroupEnd depth=%d", depth) + summary, r);
}
FAKE_PNCCL_ALIAS(ncclGroupEnd)

ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  std::string line = "ncclGroupSimulateEnd simInfo=" + hex_ptr(simInfo);
  if (simInfo != nullptr)
    line += strf(" size=%zu magic=%#x version=%u", simInfo->size, simInfo->magic, simInfo->version);
  if (fake::should_fail("ncclGroupSimulateEnd")) return finish(line, ncclInternalError);
  if (simInfo != nullptr && simInfo->magic != 0x74685283) return finish(line, ncclInvalidArgument);
  if (fake::group_depth() == 0) return finish(line + " depth=0", ncclInvalidUsage);
  fake::group_leave();
  const int depth = fake::group_depth();
  // As in NCCL: the deferred inits run, the queued operations are only simulated.
  std::string summary;
  ncclResult_t r = depth == 0 ? fake::group_finish(/*simulate=*/true, &summary) : ncclSuccess;
  if (simInfo != nullptr) simInfo->estimatedTime = 42.0f;
  return finish(line + strf(" depth=%d", depth) + summary, r);
}
FAKE_PNCCL_ALIAS(ncclGroupSimulateEnd)
