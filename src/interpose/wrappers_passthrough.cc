// Generated pass-through wrappers: every function marked PASS in nccl_api.def. They exist so
// that the library exports the whole nccl.h API and answers for a missing real function.
#include "shim_entry.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define ZC_PASS_WRAPPER(ret, name, params, args)                           \
  ZC_EXPORT ret name params {                                              \
    ::zc::Entry e = ::zc::enter(__builtin_return_address(0));              \
    if (e.gate == ::zc::Gate::kFail) return ::zc::fail_value<ret>(e.code); \
    ZC_CALL_REAL(ret, e, name, args);                                      \
  }
#define ZC_HAND_WRAPPER(ret, name, params, args)
#define ZC_NCCL_FN(ret, name, params, args, kind) ZC_##kind##_WRAPPER(ret, name, params, args)
#include "nccl_api.def"
#undef ZC_NCCL_FN
