#include "cta_policy.h"

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace zc {
namespace {

constexpr unsigned kConfigMagic = 0xcafebeef;
constexpr unsigned kCtaPolicyIntroduced = 22700;  // NCCL_VERSION(2,27,0)
constexpr size_t kCtaPolicyOffset = offsetof(ncclConfig_t, CTAPolicy);
static_assert(kCtaPolicyOffset == 60, "ncclConfig_t layout: CTAPolicy is at byte 60");

// Fields of the 2.28 struct and the NCCL version that introduced each one. Layouts only
// ever grew at the end, so a field's offset is the same in every struct that has it.
struct FieldIntro {
  size_t offset, len;
  unsigned since;
};
constexpr FieldIntro kFields[] = {
    {offsetof(ncclConfig_t, blocking), sizeof(int), 21400},
    {offsetof(ncclConfig_t, cgaClusterSize), sizeof(int), 21700},
    {offsetof(ncclConfig_t, minCTAs), sizeof(int), 21700},
    {offsetof(ncclConfig_t, maxCTAs), sizeof(int), 21700},
    {offsetof(ncclConfig_t, netName), sizeof(const char*), 21700},
    {offsetof(ncclConfig_t, splitShare), sizeof(int), 21800},
    {offsetof(ncclConfig_t, trafficClass), sizeof(int), 22500},  // NCCL honours it from 2.25
    {offsetof(ncclConfig_t, commName), sizeof(const char*), 22700},
    {offsetof(ncclConfig_t, collnetEnable), sizeof(int), 22700},
    {offsetof(ncclConfig_t, CTAPolicy), sizeof(int), 22700},
    {offsetof(ncclConfig_t, shrinkShare), sizeof(int), 22700},
    {offsetof(ncclConfig_t, nvlsCTAs), sizeof(int), 22700},
    {offsetof(ncclConfig_t, nChannelsPerNetPeer), sizeof(int), 22800},
    {offsetof(ncclConfig_t, nvlinkCentricSched), sizeof(int), 22800},
};

ncclConfig_t fresh_config() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  return c;
}

}  // namespace

int cta_policy_value(CtaPolicyMode mode) {
  switch (mode) {
    case CtaPolicyMode::kZero:
      return NCCL_CTA_POLICY_ZERO;
    case CtaPolicyMode::kEfficiency:
      return NCCL_CTA_POLICY_EFFICIENCY;
    case CtaPolicyMode::kDefault:
      return NCCL_CTA_POLICY_DEFAULT;
    case CtaPolicyMode::kKeep:
      return -1;
  }
  return -1;
}

PolicyResult apply_cta_policy(const ncclConfig_t* caller, NullConfig null_config,
                              CtaPolicyMode mode, bool force, std::vector<unsigned char>* storage) {
  PolicyResult r;
  r.config = const_cast<ncclConfig_t*>(caller);
  const int want = cta_policy_value(mode);
  if (want < 0) {
    r.why = "ZEROCTA_CTA_POLICY=keep";
    return r;
  }
  if (caller == nullptr) {
    if (null_config == NullConfig::kInherit) {
      r.why = "NULL config: inherits the parent's configuration";
      return r;
    }
    storage->resize(sizeof(ncclConfig_t));
    ncclConfig_t c = fresh_config();
    c.CTAPolicy = want;
    memcpy(storage->data(), &c, sizeof(c));
    r.config = reinterpret_cast<ncclConfig_t*>(storage->data());
    r.patched = true;
    r.policy = want;
    r.why = "fresh config";
    return r;
  }

  // Read the header the way NCCL does before trusting anything else.
  size_t size = 0;
  unsigned magic = 0, version = 0;
  memcpy(&size, caller, sizeof(size));
  if (size >= 24 && size <= 65536) {  // only bytes the struct's own size covers
    memcpy(&magic, reinterpret_cast<const char*>(caller) + 8, sizeof(magic));
    memcpy(&version, reinterpret_cast<const char*>(caller) + 12, sizeof(version));
  }
  if (magic != kConfigMagic || size < 24 || size > 65536) {
    r.why = "config is not initialised (bad magic or size): left for NCCL to reject";
    return r;
  }
  const bool has_cta = size >= kCtaPolicyOffset + sizeof(int) && version >= kCtaPolicyIntroduced;
  if (has_cta) {
    int app = 0;
    memcpy(&app, reinterpret_cast<const char*>(caller) + kCtaPolicyOffset, sizeof(app));
    if (app != NCCL_CONFIG_UNDEF_INT && !force) {
      r.policy = app;
      r.why = "the application set CTAPolicy itself (ZEROCTA_CTA_POLICY_FORCE=1 overrides)";
      return r;
    }
    // A struct that already carries CTAPolicy: copy it whole, newer fields included.
    storage->assign(reinterpret_cast<const unsigned char*>(caller),
                    reinterpret_cast<const unsigned char*>(caller) + size);
    memcpy(storage->data() + kCtaPolicyOffset, &want, sizeof(want));
  } else {
    // An older struct: rebuild it in the 2.28 layout so that NCCL reads CTAPolicy, keeping
    // every field the caller's version and size define, the rest unset.
    storage->resize(sizeof(ncclConfig_t));
    ncclConfig_t c = fresh_config();
    unsigned char* dst = reinterpret_cast<unsigned char*>(&c);
    const unsigned char* src = reinterpret_cast<const unsigned char*>(caller);
    for (const FieldIntro& f : kFields)
      if (f.since <= version && f.offset + f.len <= size)
        memcpy(dst + f.offset, src + f.offset, f.len);
    c.CTAPolicy = want;
    memcpy(storage->data(), &c, sizeof(c));
  }
  r.config = reinterpret_cast<ncclConfig_t*>(storage->data());
  r.patched = true;
  r.policy = want;
  r.why = has_cta ? "copied the application's config" : "upgraded an older config struct";
  return r;
}

}  // namespace zc
