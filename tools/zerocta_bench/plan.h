// Run-time estimates and per-path time limits, so that a run's length is known before it
// starts (the GPU hosts give a command at most 10 minutes). The model is deliberately
// pessimistic: startup dominates at the default sizes.
#pragma once

#include "options.h"

namespace zcb {

double estimate_sweep_s(const Options& o, PathId p, int nranks);
double estimate_contention_s(const Options& o, PathId p, int nranks);

// --timeout if given, else max(90, 4 x estimate + 30) seconds.
int path_timeout_s(const Options& o, double estimate_s);

}  // namespace zcb
