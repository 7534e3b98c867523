#include "route.h"

#include <nccl.h>

#include "chunk_sum.h"

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
  if (in.mode != RouteMode::kAuto && in.mode != RouteMode::kZerocta)
    return {RouteKind::kPassthrough, "ZEROCTA_ALLGATHER does not ask for the copy-engine route"};
  if (!in.bytes_valid) return {RouteKind::kPassthrough, "invalid datatype or size: NCCL decides"};
  if (in.total_bytes == 0) return {RouteKind::kPassthrough, "empty all-gather"};
  if (!in.committed)
    return {RouteKind::kPassthrough,
            in.why_not && *in.why_not ? in.why_not : "the route was not agreed"};
  if (in.mode == RouteMode::kZerocta) return {RouteKind::kCe, "ZEROCTA_ALLGATHER=zerocta"};
  if (in.auto_max_ranks != 0 && static_cast<uint64_t>(in.nranks) > in.auto_max_ranks)
    return {RouteKind::kPassthrough, "more ranks than ZEROCTA_AUTO_MAX_RANKS"};
  if (in.total_bytes < in.min_bytes) return {RouteKind::kPassthrough, "below ZEROCTA_MIN_BYTES"};
  return {RouteKind::kCe, "at or above ZEROCTA_MIN_BYTES"};
}

RouteDecision choose_reduce_scatter_route(const RsRouteInputs& in) {
  if (in.mode != RouteMode::kAuto && in.mode != RouteMode::kZerocta)
    return {RouteKind::kPassthrough,
            "ZEROCTA_REDUCESCATTER does not ask for the copy-engine route"};
  if (in.datatype != ncclFloat32 && in.datatype != ncclFloat16 && in.datatype != ncclBfloat16)
    return {RouteKind::kPassthrough, "a datatype the route does not sum (float, half, bfloat16)"};
  if (in.reduce == RsReduce::kOther)
    return {RouteKind::kPassthrough,
            "a reduction the route does not do (sum, average, pre-multiplied sum)"};
  if (in.reduce == RsReduce::kPreMulSum && in.scalar_datatype != in.datatype)
    return {RouteKind::kPassthrough,
            "a pre-multiplied sum made for another datatype: NCCL answers it"};
  if (!in.bytes_valid) return {RouteKind::kPassthrough, "invalid size: NCCL decides"};
  if (in.total_bytes == 0) return {RouteKind::kPassthrough, "empty reduce-scatter"};
  if (!in.committed)
    return {RouteKind::kPassthrough,
            in.why_not && *in.why_not ? in.why_not : "the route was not agreed"};
  if (in.nranks < 2 || in.nranks > kChunkSumMaxSources)
    return {RouteKind::kPassthrough, "more ranks than the summing kernel takes (8)"};
  if (!in.every_scratch)
    return {RouteKind::kPassthrough, "a rank of the communicator has no reduce-scatter scratch"};
  if (in.slice == 0)
    return {RouteKind::kPassthrough, "ZEROCTA_RS_SCRATCH holds no slice for this many ranks"};
  if (in.mode == RouteMode::kZerocta) return {RouteKind::kCe, "ZEROCTA_REDUCESCATTER=zerocta"};
  if (in.auto_max_ranks != 0 && static_cast<uint64_t>(in.nranks) > in.auto_max_ranks)
    return {RouteKind::kPassthrough, "more ranks than auto routes reduce-scatters on"};
  if (in.total_bytes < in.min_bytes) return {RouteKind::kPassthrough, "below ZEROCTA_MIN_BYTES"};
  return {RouteKind::kCe, "at or above ZEROCTA_MIN_BYTES"};
}

}  // namespace zc
