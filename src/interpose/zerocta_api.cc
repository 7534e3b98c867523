// The public C API of include/zerocta.h. The library is built with -fvisibility=hidden, so each
// entry point is marked default-visible here (and listed in exports.map); applications find
// them with dlsym(RTLD_DEFAULT, "zerocta_...") without linking the shim.
#include <cerrno>
#include <cstdlib>

#include "config.h"
#include "config_report.h"
#include "log.h"
#include "stats_snapshot.h"
#include "zerocta.h"

#define ZEROCTA_EXPORT __attribute__((visibility("default")))

namespace {

// Indexed by zerocta_op_t / zerocta_route_t; the static_asserts catch an enum that grew.
const char* const kOpNames[] = {"allgather", "allreduce", "reducescatter", "broadcast", "reduce",
                                "alltoall",  "gather",    "scatter",       "send",      "recv"};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == zerocta_op_count, "op names");

const char* const kRouteNames[] = {"passthrough", "ce", "nccl-ce"};
static_assert(sizeof(kRouteNames) / sizeof(kRouteNames[0]) == zerocta_route_count, "route names");

// The version as text in the file itself, what(1)-style, so that tools/zerocta-run --version
// can read it from a library it does not load.
__attribute__((used)) const char kVersionTag[] = "@(#)zerocta " ZEROCTA_VERSION_STRING;

}  // namespace

ZEROCTA_EXPORT int zerocta_version(void) {
  return ZEROCTA_VERSION_MAJOR * 10000 + ZEROCTA_VERSION_MINOR * 100 + ZEROCTA_VERSION_PATCH;
}

ZEROCTA_EXPORT int zerocta_get_stats(zerocta_stats_t* out) {
  if (out == nullptr) return EINVAL;
  zc::stats_snapshot(out);
  return 0;
}

ZEROCTA_EXPORT void zerocta_reset_stats(void) { zc::stats_reset(); }

ZEROCTA_EXPORT int zerocta_write_stats_json(const char* path) { return zc::stats_write_json(path); }

ZEROCTA_EXPORT const char* zerocta_op_name(zerocta_op_t op) {
  // Unsigned compare: also rejects negative values forced into the enum.
  return static_cast<unsigned>(op) < zerocta_op_count ? kOpNames[op] : nullptr;
}

ZEROCTA_EXPORT const char* zerocta_route_name(zerocta_route_t route) {
  return static_cast<unsigned>(route) < zerocta_route_count ? kRouteNames[route] : nullptr;
}

ZEROCTA_EXPORT int zerocta_check_config(int fd) {
  const zc::Config c = zc::parse_config([](const char* name) { return std::getenv(name); });
  for (const zc::ReportLine& line :
       zc::config_report(c, zc::find_unknown_vars_in_environment(), std::getenv("NCCL_CTA_POLICY")))
    zc::log_print_to(fd, line.level, "%s", line.text.c_str());
  return static_cast<int>(c.errors.size());
}
