// Applying the CTA policy to an application's ncclConfig_t without ever writing into it.
// The application's struct may be older (24/40/48/72 bytes) or newer (88/96) than our
// headers; it is read the way NCCL reads it: `size` bytes, fields newer than `version` unset.
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

#include "config.h"

namespace zc {

enum class NullConfig {
  kFresh,    // InitRank/InitRankConfig/InitRankScalable: NULL means "defaults": we pass ours.
  kInherit,  // Split/Shrink: NULL means "inherit the parent's whole config": keep NULL.
};

struct PolicyResult {
  ncclConfig_t* config = nullptr;  // what to hand to NCCL (the caller's, or `storage`)
  bool patched = false;            // we pass our own copy
  int policy = -1;                 // CTAPolicy NCCL will see, -1 when unknown/inherited
  std::string why;                 // for the INFO log
};

// Pure. `storage` receives the patched copy when one is needed (kept alive by the caller
// until the NCCL call returns).
PolicyResult apply_cta_policy(const ncclConfig_t* caller, NullConfig null_config,
                              CtaPolicyMode mode, bool force, std::vector<unsigned char>* storage);

// NCCL's value for a mode (-1 for keep).
int cta_policy_value(CtaPolicyMode mode);

}  // namespace zc
