// The real NCCL: found lazily at the first intercepted call, never loaded twice.
// Order: the already-loaded libnccl.so.2 (dlopen RTLD_NOLOAD: PyTorch loads NCCL RTLD_LOCAL,
// so RTLD_NEXT alone finds nothing there), then RTLD_NEXT, then ZEROCTA_NCCL_LIBRARY.
#pragma once

#include <nccl.h>

#include <cstdint>

namespace zc {

struct RealNccl {
#define ZC_NCCL_FN(ret, name, params, args, kind) ret(*name) params;
#include "nccl_api.def"
#undef ZC_NCCL_FN
};

enum class RuntimeTier {
  kUnresolved,   // no NCCL found (yet)
  kForwardOnly,  // older than 2.28: pure forwarding, said once
  kFull,         // 2.28.x: policy and copy-engine routes
  kPolicyOnly,   // newer than tested: the policy only, said once
};

// Resolves on first use (thread-safe; retried on later calls while nothing is found).
// Returns nullptr when no NCCL can be found.
const RealNccl* real_nccl();

// Runtime NCCL version code (e.g. 22809); 0 when unresolved.
int real_nccl_version();
RuntimeTier runtime_tier();

// True when addr lies in the executable text of the real libnccl: a call whose return
// address is there is NCCL calling its own public API (ncclBcast -> ncclBroadcast, window
// registration -> ncclCommRegister), possibly from one of NCCL's own threads.
bool address_in_real_nccl(const void* addr);

// Logs one WARN naming a function the real library lacks (once per function).
void warn_missing_function(const char* name);

}  // namespace zc
