// Fork safety of the shim's counters: the parent makes collectives and forks; the child must
// start from zero, count its own call, and the parent's counters stay its own.
// Prints stats for tags parent_before_fork, child_start, child_after_call, parent_after_child
// and child_exit.
#include <nccl.h>
#include <sys/wait.h>

#include "driver_util.h"

int main() {
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 2, id, 0) != ncclSuccess)
    return 2;
  cudaStream_t s = static_cast<cudaStream_t>(drv::fake_stream(1));
  for (int i = 0; i < 3; ++i)
    ncclAllReduce(drv::fake_buffer(1), drv::fake_buffer(1), 64, ncclFloat32, ncclSum, comm, s);
  drv::print_stats("parent_before_fork");
  pid_t pid = fork();
  if (pid < 0) return 3;
  if (pid == 0) {
    drv::print_stats("child_start");
    drv::out("child_call", ncclAllReduce(drv::fake_buffer(1), drv::fake_buffer(1), 64, ncclFloat32,
                                         ncclSum, comm, s));
    drv::print_stats("child_after_call");
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  drv::out("child_exit", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  drv::print_stats("parent_after_child");
  ncclCommDestroy(comm);
  return 0;
}
