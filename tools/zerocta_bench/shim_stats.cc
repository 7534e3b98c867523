#include "shim_stats.h"

#include <dlfcn.h>

#include <cstring>

namespace zcb {

namespace {

using VersionFn = int (*)();
using GetStatsFn = int (*)(zerocta_stats_t*);

template <typename Fn>
Fn lookup(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

ShimProbe probe_shim() {
  ShimProbe p;
  if (VersionFn v = lookup<VersionFn>("zerocta_version")) {
    p.loaded = true;
    p.version = v();
  }
  return p;
}

bool shim_stats(zerocta_stats_t* out) {
  GetStatsFn fn = lookup<GetStatsFn>("zerocta_get_stats");
  memset(out, 0, sizeof(*out));
  return fn && fn(out) == 0;
}

RouteCounts shim_routes(zerocta_op_t op) {
  RouteCounts r;
  zerocta_stats_t s;
  if (!shim_stats(&s)) return r;
  for (int i = 0; i < zerocta_route_count; ++i) r.calls[i] = s.counters[op][i].calls;
  return r;
}

RouteCounts operator-(const RouteCounts& a, const RouteCounts& b) {
  RouteCounts d;
  for (int i = 0; i < zerocta_route_count; ++i) d.calls[i] = a.calls[i] - b.calls[i];
  return d;
}

}  // namespace zcb
