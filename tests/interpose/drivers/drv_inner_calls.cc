// NCCL calling its own API: ncclBcast -> ncclBroadcast (same thread), and
// ncclCommWindowRegister -> ncclCommRegister (from a thread NCCL creates). Prints the shim's
// counters before, between and after, and each result.
#include <nccl.h>

#include "driver_util.h"

int main() {
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 2, id, 0) != ncclSuccess)
    return 2;
  drv::print_stats("start");
  drv::out("bcast", ncclBcast(drv::fake_buffer(1), 4096, ncclFloat32, 0, comm,
                              static_cast<cudaStream_t>(drv::fake_stream(1))));
  drv::print_stats("after_bcast");
  ncclWindow_t win = nullptr;
  drv::out("window_register",
           ncclCommWindowRegister(comm, drv::fake_buffer(2), 1 << 20, &win, NCCL_WIN_DEFAULT));
  drv::print_stats("after_window");
  drv::out("window_deregister", ncclCommWindowDeregister(comm, win));
  drv::out("destroy", ncclCommDestroy(comm));
  return 0;
}
