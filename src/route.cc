#include "route.h"

#include <nccl.h>

namespace zc {

uint64_t nccl_type_size(int datatype) {
  switch (datatype) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

RouteDecision choose_allgather_route(const RouteInputs& in) {
  if (in.mode == AllGatherMode::kOff) return {AgRoute::kPassthrough, "ZEROCTA_ALLGATHER=off"};
  if (!in.bytes_valid) return {AgRoute::kPassthrough, "invalid datatype or size: NCCL decides"};
  if (in.total_bytes == 0) return {AgRoute::kPassthrough, "empty all-gather"};
  if (in.app_windows) return {AgRoute::kNcclCe, "buffers are in application-registered windows"};
  if (in.mode == AllGatherMode::kNccl)
    return {AgRoute::kPassthrough, "ZEROCTA_ALLGATHER=nccl and the buffers are not in windows"};
  if (!in.ce_ready)
    return {AgRoute::kPassthrough,
            in.ce_missing && *in.ce_missing ? in.ce_missing : "copy-engine pool not ready"};
  if (in.mode == AllGatherMode::kNcclStaged)
    return in.total_bytes < in.min_bytes
               ? RouteDecision{AgRoute::kPassthrough, "below ZEROCTA_MIN_BYTES"}
               : RouteDecision{AgRoute::kNcclStaged, "ZEROCTA_ALLGATHER=nccl-staged"};
  if (in.mode == AllGatherMode::kZerocta) return {AgRoute::kCe, "ZEROCTA_ALLGATHER=zerocta"};
  if (in.auto_max_ranks != 0 && in.nranks > in.auto_max_ranks)
    return {AgRoute::kPassthrough, "more ranks than ZEROCTA_AUTO_MAX_RANKS"};
  if (in.total_bytes < in.min_bytes) return {AgRoute::kPassthrough, "below ZEROCTA_MIN_BYTES"};
  return {AgRoute::kCe, "at or above ZEROCTA_MIN_BYTES"};
}

}  // namespace zc
