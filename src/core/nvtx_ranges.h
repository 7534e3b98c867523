// NVTX ranges in the "zerocta" domain around each intercepted collective, naming the op, the
// bytes and the route. Costs one branch when no tool is attached (NVTX3 injection model).
#pragma once

#include <cstdint>

#include "zerocta.h"

namespace zc {

class NvtxRange {
 public:
  NvtxRange(zerocta_op_t op, zerocta_route_t route, uint64_t bytes);
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  bool active_;
};

}  // namespace zc
