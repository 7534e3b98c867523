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

// Marks this thread as inside a wrapper for as long as the wrapper runs. A wrapper entered
// again on the same thread meanwhile is NCCL calling its own API from inside the call we
// forwarded (ncclBcast -> ncclBroadcast, window registration -> ncclCommRegister), also when
// NCCL reaches it by a tail call that carries our return address. NCCL's own threads are
// recognised by the return address instead (real_nccl.h, address_in_real_nccl).
class WrapperScope {
 public:
  WrapperScope() = default;
  explicit WrapperScope(bool enter);
  WrapperScope(WrapperScope&& other) noexcept : entered_(other.entered_) { other.entered_ = false; }
  WrapperScope(const WrapperScope&) = delete;
  WrapperScope& operator=(const WrapperScope&) = delete;
  WrapperScope& operator=(WrapperScope&&) = delete;
  ~WrapperScope();

 private:
  bool entered_ = false;
};

struct Entry {
  Gate gate;
  const RealNccl* real;
  ncclResult_t code;
  WrapperScope scope;
};

Entry enter(const void* return_address);

// What a wrapper returns when the call cannot reach NCCL.
template <typename T>
inline T fail_value(ncclResult_t code) {
  return code;
}
// (ncclGetErrorString, ncclGetLastError.) Says why the call did not reach NCCL, by the code
// enter() or ZC_CALL_REAL failed it with.
template <>
inline const char* fail_value<const char*>(ncclResult_t code) {
  switch (code) {
    case ncclInvalidUsage:  // enter(): ZEROCTA_STRICT=1 and an invalid ZEROCTA_* value
      return "zerocta: configuration error: a ZEROCTA_* value is invalid and ZEROCTA_STRICT=1 "
             "makes every NCCL call fail with ncclInvalidUsage (see the zerocta WARN lines)";
    case ncclInternalError:  // ZC_CALL_REAL: the loaded NCCL lacks the function
      return "zerocta: the loaded NCCL library lacks this function (see the zerocta WARN line)";
    default:  // enter(): no NCCL library found or loadable (ncclSystemError)
      return "zerocta: the NCCL library could not be used (see the zerocta WARN line)";
  }
}
template <>
inline void fail_value<void>(ncclResult_t) {}

}  // namespace zc

// The prologue of every hand-written wrapper: NCCL calling itself, a disabled shim or an NCCL
// it does not transform are forwarded unchanged; past it, `e.real->name` exists.
#define ZC_PROLOGUE(e, name, args)                                                \
  ::zc::Entry e = ::zc::enter(__builtin_return_address(0));                       \
  if ((e).gate == ::zc::Gate::kFail) return (e).code;                             \
  if ((e).gate != ::zc::Gate::kActive) ZC_CALL_REAL(ncclResult_t, e, name, args); \
  if ((e).real->name == nullptr) {                                                \
    ::zc::warn_missing_function(#name);                                           \
    return ncclInternalError;                                                     \
  }

// Forwards `name` to the real NCCL, or fails with one WARN when NCCL lacks it.
#define ZC_CALL_REAL(ret, e, name, args)               \
  do {                                                 \
    if ((e).real->name == nullptr) {                   \
      ::zc::warn_missing_function(#name);              \
      return ::zc::fail_value<ret>(ncclInternalError); \
    }                                                  \
    return (e).real->name args;                        \
  } while (0)
