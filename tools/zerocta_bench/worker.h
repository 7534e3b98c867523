// Entry point of a re-executed rank process (--worker-path ...): runs one path's body and
// reports to the parent through the inherited pipes.
#pragma once

#include "options.h"

namespace zcb {

int worker_main(const Options& o);

// The body used with --fake-gpus: no CUDA, synthetic but self-consistent rows and contention
// numbers for the ranks of the process (worker_rank, or every rank for -1), so the launcher,
// the protocol, the tables and the JSON can be tested on a machine without a GPU. Faults are
// injected with ZCB_FAKE_{HANG,CRASH,WRONG,FALLBACK,EXIT_HANG,NO_POLICY}=<path name>.
class Channel;
void run_fake_worker(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch);

}  // namespace zcb
