#include "shim_entry.h"

#include <cstdlib>
#include <mutex>

#include "config.h"
#include "config_report.h"
#include "log.h"
#include "stats.h"

namespace zc {
namespace {

void announce(const Config& c) {
  // Read now, at the first NCCL call, not at load: a process that never calls NCCL (a
  // compiler, nvidia-smi, a worker the preload reached) must stay silent.
  for (const ReportLine& line :
       config_report(c, find_unknown_vars_in_environment(), getenv("NCCL_CTA_POLICY")))
    log_print(line.level, "%s", line.text.c_str());
}

}  // namespace

namespace {
thread_local int t_wrapper_depth = 0;
}  // namespace

WrapperScope::WrapperScope(bool enter) : entered_(enter) {
  if (entered_) ++t_wrapper_depth;
}

WrapperScope::~WrapperScope() {
  if (entered_) --t_wrapper_depth;
}

Entry enter(const void* return_address) {
  static std::once_flag once;
  const Config& c = config();
  std::call_once(once, [&c] {
    log_set_level(c.log);
    log_set_file(c.log_file.c_str(), c.nccl_writes_log_file);
    announce(c);
    if (c.enable) stats_install_reporter();
  });
  const RealNccl* real = real_nccl();
  if (real == nullptr) return {Gate::kFail, nullptr, ncclSystemError, {}};
  if (t_wrapper_depth > 0 || address_in_real_nccl(return_address)) {
    if (c.enable) stats_inner_call();
    return {Gate::kInner, real, ncclSuccess, {}};
  }
  if (c.strict && !c.errors.empty()) return {Gate::kFail, real, ncclInvalidUsage, {}};
  if (!c.enable) return {Gate::kForward, real, ncclSuccess, WrapperScope(true)};
  return {Gate::kActive, real, ncclSuccess, WrapperScope(true)};
}

}  // namespace zc
