// Opens zerocta NVTX ranges the way the collective wrappers do, with no GPU and no NCCL: linked
// with the zerocta_core objects, run by nvtx_range_test.cc under the recorder tool.
//   main thread:   allgather/ce 268435456 B, and inside it allreduce/passthrough 1024 B
//   second thread: reducescatter/nccl-ce 4096 B (domain set-up is shared across threads)
//   out-of-range op: must record nothing
#include <thread>

#include "nvtx_ranges.h"

int main() {
  {
    zc::NvtxRange outer(zerocta_op_allgather, zerocta_route_ce, 268435456);
    zc::NvtxRange inner(zerocta_op_allreduce, zerocta_route_passthrough, 1024);
  }
  std::thread worker(
      [] { zc::NvtxRange r(zerocta_op_reducescatter, zerocta_route_nccl_ce, 4096); });
  worker.join();
  { zc::NvtxRange ignored(zerocta_op_count, zerocta_route_ce, 1); }
  return 0;
}
