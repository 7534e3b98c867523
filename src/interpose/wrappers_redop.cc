// The wrappers of NCCL's reduction-op calls: a pre-multiplied sum's creation and destruction,
// noted in its communicator's PreMulSums (premul_sums.h) for the reduce-scatter's route, which
// must know each rank's scalar where NCCL keeps it hidden. Where ZEROCTA_REDUCESCATTER does not
// ask for the route they only forward.
#include <cstring>
#include <memory>

#include "comm_state.h"
#include "config.h"
#include "log.h"
#include "route.h"
#include "shim_entry.h"

using namespace zc;

namespace {

// The communicator whose notes the reduce-scatter's route may use, or null.
std::shared_ptr<CommState> noting_comm(ncclComm_t comm) {
  return route_asked(config().reducescatter) ? comm_lookup(comm) : nullptr;
}

}  // namespace

ZC_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm) {
  ZC_PROLOGUE(e, ncclRedOpCreatePreMulSum, (op, scalar, datatype, residence, comm));
  const ncclResult_t r = e.real->ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm);
  const std::shared_ptr<CommState> st = r == ncclSuccess ? noting_comm(comm) : nullptr;
  const uint64_t elem = nccl_type_size(datatype);
  // Only what the route sums: a scalar of another type is never read (the op is not routed).
  if (!st || !op || !scalar || elem == 0 || elem > sizeof(uint32_t)) return r;
  PreMulSum p;
  p.op = *op;
  p.datatype = datatype;
  p.on_device = residence == ncclScalarDevice;
  if (p.on_device)
    p.device_scalar = reinterpret_cast<uint64_t>(scalar);
  else
    memcpy(&p.host_bits, scalar, elem);  // the element's bytes, as NCCL copies them
  st->premul_sums.note(p);
  ZC_DEBUG("pre-multiplied sum %d made (datatype %d, %s scalar)", static_cast<int>(*op),
           static_cast<int>(datatype), p.on_device ? "device" : "host-immediate");
  return r;
}

ZC_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  ZC_PROLOGUE(e, ncclRedOpDestroy, (op, comm));
  const ncclResult_t r = e.real->ncclRedOpDestroy(op, comm);
  if (r == ncclSuccess)
    if (const std::shared_ptr<CommState> st = noting_comm(comm)) st->premul_sums.forget(op);
  return r;
}
