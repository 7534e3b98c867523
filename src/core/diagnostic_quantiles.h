// One line of a diagnostic build's summary (stream_phase_times.cc, flag_watch.cc): how many
// samples, and their 10th, 50th and 90th percentiles in microseconds, to stderr.
#pragma once

#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace zc {

inline void print_quantiles(const char* source, const char* what, std::vector<double> us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us[static_cast<size_t>(q * static_cast<double>(us.size() - 1))];
  };
  fprintf(stderr, "zerocta %s pid=%d %-58s n=%zu p10=%.1f median=%.1f p90=%.1f us\n", source,
          static_cast<int>(getpid()), what, us.size(), at(0.1), at(0.5), at(0.9));
}

}  // namespace zc
