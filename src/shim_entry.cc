#include "shim_entry.h"

#include <cstdlib>
#include <mutex>

#include "config.h"
#include "log.h"
#include "stats.h"

namespace zc {
namespace {

void announce(const Config& c) {
  for (const std::string& e : c.errors) ZC_WARN("%s", e.c_str());
  if (c.strict && !c.errors.empty())
    ZC_WARN(
        "ZEROCTA_STRICT=1: NCCL calls fail with ncclInvalidUsage until the values above are "
        "fixed");
  // Read now, at the first NCCL call, not at load: a process that never calls NCCL (a
  // compiler, nvidia-smi, a worker the preload reached) must stay silent.
  for (const UnknownVar& u : find_unknown_vars_in_environment())
    ZC_WARN("%s", unknown_var_line(u).c_str());
  ZC_INFO(
      "config: zerocta %s ZEROCTA_ENABLE=%d ZEROCTA_STRICT=%d ZEROCTA_LOG=%s%s "
      "ZEROCTA_CTA_POLICY=%s%s ZEROCTA_ALLGATHER=%s ZEROCTA_MIN_BYTES=%llu "
      "ZEROCTA_AUTO_MAX_RANKS=%llu ZEROCTA_STATS=%s ZEROCTA_NVTX=%d fingerprint=%016llx",
      ZEROCTA_VERSION_STRING, c.enable ? 1 : 0, c.strict ? 1 : 0, to_string(c.log),
      c.log_from_nccl_debug ? " (from NCCL_DEBUG)" : "", to_string(c.cta_policy),
      c.cta_policy_force ? " (forced)" : "", to_string(c.allgather),
      static_cast<unsigned long long>(c.min_bytes),
      static_cast<unsigned long long>(c.auto_max_ranks), c.stats.empty() ? "0" : c.stats.c_str(),
      c.nvtx ? 1 : 0, static_cast<unsigned long long>(c.fingerprint));
  if (const char* env = getenv("NCCL_CTA_POLICY"))
    if (c.enable && c.cta_policy != CtaPolicyMode::kKeep)
      ZC_WARN(
          "NCCL_CTA_POLICY=%s is set in the environment: NCCL uses it instead of the policy "
          "zerocta puts in the communicator config",
          quoted(env).c_str());
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
