// The prologue every exported NCCL wrapper runs first: resolve the real NCCL, recognise
// NCCL's calls into its own API, apply ZEROCTA_ENABLE / ZEROCTA_STRICT, and do the
// once-per-process start-up (config errors, effective config, stats reporter).
#pragma once

#include <nccl.h>

#include "real_nccl.h"

#define ZC_EXPORT extern "C" __attribute__((visibility("default")))

namespace zc {

enum class Gate {
  kInner,    // NCCL calling itself: forward straight, never count or transform
  kForward,  // shim disabled or NCCL too old: forward unchanged
  kActive,   // full shim behaviour
  kFail,     // return `code` without calling NCCL
};

struct Entry {
  Gate gate;
  const RealNccl* real;
  ncclResult_t code;
};

Entry enter(const void* return_address);

// What a wrapper returns when the call cannot reach NCCL.
template <typename T>
inline T fail_value(ncclResult_t code) {
  return code;
}
template <>
inline const char* fail_value<const char*>(ncclResult_t) {
  return "zerocta: the NCCL library could not be used (see the zerocta WARN line)";
}
template <>
inline void fail_value<void>(ncclResult_t) {}

}  // namespace zc

// Forwards `name` to the real NCCL, or fails with one WARN when NCCL lacks it.
#define ZC_CALL_REAL(ret, e, name, args)               \
  do {                                                 \
    if ((e).real->name == nullptr) {                   \
      ::zc::warn_missing_function(#name);              \
      return ::zc::fail_value<ret>(ncclInternalError); \
    }                                                  \
    return (e).real->name args;                        \
  } while (0)
