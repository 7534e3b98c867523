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
  if (in.mode != AllGatherMode::kAuto && in.mode != AllGatherMode::kZerocta)
    return {AgRoute::kPassthrough, "ZEROCTA_ALLGATHER does not ask for the copy-engine route"};
  if (!in.bytes_valid) return {AgRoute::kPassthrough, "invalid datatype or size: NCCL decides"};
  if (in.total_bytes == 0) return {AgRoute::kPassthrough, "empty all-gather"};
  if (!in.committed)
    return {AgRoute::kPassthrough,
            in.why_not && *in.why_not ? in.why_not : "the route was not agreed"};
  if (in.mode == AllGatherMode::kZerocta) return {AgRoute::kCe, "ZEROCTA_ALLGATHER=zerocta"};
  if (in.total_bytes < in.min_bytes) return {AgRoute::kPassthrough, "below ZEROCTA_MIN_BYTES"};
  return {AgRoute::kCe, "at or above ZEROCTA_MIN_BYTES"};
}

}  // namespace zc
