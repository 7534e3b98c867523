#include "worker.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdlib>

#include "channel.h"
#include "contention.h"
#include "sweep.h"

namespace zcb {

int worker_main(const Options& o) {
  PathId path;
  if (!parse_path_name(o.worker_path, &path)) return kExitUsage;
  Channel ch(o.worker_in_fd, o.worker_out_fd, o.worker_rank);
  set_fatal_channel(&ch);
  // A closed pipe must end the worker through fatal()/write errors, not SIGPIPE mid-message.
  signal(SIGPIPE, SIG_IGN);

  const int n = o.worker_nranks;
  if (o.fake_gpus > 0) {
    run_fake_worker(o, path, o.worker_rank, n, &ch);
  } else if (o.worker_mode == "sweep") {
    if (path == PathId::kCeiling || path == PathId::kBareCe)
      run_ceiling_sweep(o, n, &ch);
    else if (path == PathId::kSumKernel)
      run_sum_kernel_sweep(o, n, &ch);
    else
      run_nccl_sweep(o, path, o.worker_rank, n, &ch);
  } else {
    if (path == PathId::kBareCe)
      run_bare_ce_contention(o, n, &ch);
    else
      run_nccl_contention(o, path, o.worker_rank, n, &ch);
  }
  DoneMsg d{o.worker_rank};
  ch.send(kMsgDone, &d, sizeof(d));
  // Test hook (fake GPUs only): a teardown that never ends.
  const char* hang = getenv("ZCB_FAKE_EXIT_HANG");
  if (o.fake_gpus > 0 && hang && o.worker_path == hang && o.worker_rank <= 0) pause();
  return kExitOk;
}

}  // namespace zcb
