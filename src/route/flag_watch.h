// When each rank's streams write the route's flags, on one host clock, in a diagnostic build
// only (cmake -DZEROCTA_FLAG_WATCH=ON; flag_watch.cc): rank 0 spins a thread over the flags of
// the exchange (they are host memory every member maps) and notes when each changes; at teardown it
// prints how far apart the ranks announce ready, how long the copies take from the last ready to
// each done, and how long a rank takes from the last done into it to its next ready. Event
// timings cannot compare two GPUs; this can. A release build has none of it.
#pragma once

#include <cstdint>

namespace zc {

class OpExchange;

#ifdef ZC_FLAG_WATCH
void watch_flags(OpExchange* ops, int rank);
// Before the exchange's region goes: stops the watcher and prints its summary.
void unwatch_flags(OpExchange* ops);
#else
inline void watch_flags(OpExchange*, int) {}
inline void unwatch_flags(OpExchange*) {}
#endif

}  // namespace zc
