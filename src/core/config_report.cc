#include "config_report.h"

#include <cstdarg>
#include <cstdio>

namespace zc {
namespace {

std::string text_of(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string text_of(const char* fmt, ...) {
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string text(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(&text[0], text.size() + 1, fmt, again);
  va_end(again);
  return text;
}

}  // namespace

std::vector<ReportLine> config_report(const Config& c, const std::vector<UnknownVar>& unknown,
                                      const char* nccl_cta_policy) {
  std::vector<ReportLine> lines;
  for (const std::string& e : c.errors) lines.push_back({LogLevel::kWarn, e});
  if (c.strict && !c.errors.empty())
    lines.push_back({LogLevel::kWarn,
                     "ZEROCTA_STRICT=1: NCCL calls fail with ncclInvalidUsage until the values "
                     "above are fixed"});
  for (const UnknownVar& u : unknown) lines.push_back({LogLevel::kWarn, unknown_var_line(u)});
  lines.push_back(
      {LogLevel::kInfo,
       text_of("config: zerocta %s ZEROCTA_ENABLE=%d ZEROCTA_STRICT=%d ZEROCTA_LOG=%s%s "
               "ZEROCTA_CTA_POLICY=%s%s ZEROCTA_ALLGATHER=%s ZEROCTA_MIN_BYTES=%llu "
               "ZEROCTA_AUTO_MAX_RANKS=%llu ZEROCTA_REDUCESCATTER=%s ZEROCTA_RS_SCRATCH=%llu "
               "ZEROCTA_RS_CTAS=%llu ZEROCTA_STATS=%s ZEROCTA_NVTX=%d fingerprint=%016llx",
               ZEROCTA_VERSION_STRING, c.enable ? 1 : 0, c.strict ? 1 : 0, to_string(c.log),
               c.log_from_nccl_debug ? " (from NCCL_DEBUG)" : "", to_string(c.cta_policy),
               c.cta_policy_force ? " (forced)" : "", to_string(c.allgather),
               static_cast<unsigned long long>(c.min_bytes),
               static_cast<unsigned long long>(c.auto_max_ranks), to_string(c.reducescatter),
               static_cast<unsigned long long>(c.rs_scratch_bytes),
               static_cast<unsigned long long>(c.rs_ctas), c.stats.empty() ? "0" : c.stats.c_str(), c.nvtx ? 1 : 0,
               static_cast<unsigned long long>(c.fingerprint))});
  if (nccl_cta_policy != nullptr && c.enable && c.cta_policy != CtaPolicyMode::kKeep)
    lines.push_back({LogLevel::kWarn,
                     "NCCL_CTA_POLICY=" + quoted(nccl_cta_policy) +
                         " is set in the environment: NCCL uses it instead of the policy zerocta "
                         "puts in the communicator config"});
  return lines;
}

}  // namespace zc
