// What zerocta says about its configuration: a WARN per invalid value and per unknown
// ZEROCTA_* name, the effective configuration at INFO. Printed once per process at the first
// NCCL call (shim_entry.cc) and on request by zerocta_check_config (zerocta-run --check).
#pragma once

#include <string>
#include <vector>

#include "config.h"
#include "log.h"

namespace zc {

struct ReportLine {
  LogLevel level;
  std::string text;
};

// Pure: the lines, in the order they are printed. `unknown`: find_unknown_vars of the
// environment; `nccl_cta_policy`: NCCL_CTA_POLICY's value, nullptr when it is unset.
std::vector<ReportLine> config_report(const Config& c, const std::vector<UnknownVar>& unknown,
                                      const char* nccl_cta_policy);

}  // namespace zc
