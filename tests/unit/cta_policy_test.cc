// Applying the CTA policy to an application's ncclConfig_t (cta_policy.h): the caller's struct
// is never written; every generation of the struct (2.14 .. future) is read the way NCCL's
// parseCommConfig reads it: `size` bytes, fields newer than `version` unset.
#include "cta_policy.h"

#include <gtest/gtest.h>
#include <nccl.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

namespace {

using zc::CtaPolicyMode;
using zc::NullConfig;
using zc::PolicyResult;

constexpr unsigned kMagic = 0xcafebeef;
constexpr size_t kPolicyAt = 60;  // CTAPolicy's byte offset since 2.27

constexpr CtaPolicyMode kApplyingModes[] = {CtaPolicyMode::kZero, CtaPolicyMode::kEfficiency,
                                            CtaPolicyMode::kDefault};

int nccl_value(CtaPolicyMode m) {
  switch (m) {
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

// The fields of the 2.28 struct, with the NCCL version whose parseCommConfig first honours
// them (NCCL resets each to its default for an older `version`; the ones it never gates are
// listed with the release that introduced them).
struct Field {
  const char* name;
  size_t offset, len;
  unsigned since;
  bool pointer;
};
const Field kFields[] = {
    {"blocking", offsetof(ncclConfig_t, blocking), sizeof(int), 21400, false},
    {"cgaClusterSize", offsetof(ncclConfig_t, cgaClusterSize), sizeof(int), 21700, false},
    {"minCTAs", offsetof(ncclConfig_t, minCTAs), sizeof(int), 21700, false},
    {"maxCTAs", offsetof(ncclConfig_t, maxCTAs), sizeof(int), 21700, false},
    {"netName", offsetof(ncclConfig_t, netName), sizeof(const char*), 21700, true},
    {"splitShare", offsetof(ncclConfig_t, splitShare), sizeof(int), 21800, false},
    {"trafficClass", offsetof(ncclConfig_t, trafficClass), sizeof(int), 22500, false},
    {"commName", offsetof(ncclConfig_t, commName), sizeof(const char*), 22700, true},
    {"collnetEnable", offsetof(ncclConfig_t, collnetEnable), sizeof(int), 22700, false},
    {"CTAPolicy", offsetof(ncclConfig_t, CTAPolicy), sizeof(int), 22700, false},
    {"shrinkShare", offsetof(ncclConfig_t, shrinkShare), sizeof(int), 22700, false},
    {"nvlsCTAs", offsetof(ncclConfig_t, nvlsCTAs), sizeof(int), 22700, false},
    {"nChannelsPerNetPeer", offsetof(ncclConfig_t, nChannelsPerNetPeer), sizeof(int), 22800, false},
    {"nvlinkCentricSched", offsetof(ncclConfig_t, nvlinkCentricSched), sizeof(int), 22800, false},
};
static_assert(offsetof(ncclConfig_t, CTAPolicy) == kPolicyAt, "CTAPolicy moved");

// An application's config of `size` bytes exactly (so a sanitizer sees any over-read), as
// that application's nccl.h would have made it: header, then a byte pattern.
class AppConfig {
 public:
  AppConfig(size_t size, unsigned version, unsigned magic = kMagic)
      : size_(size), mem_(static_cast<unsigned char*>(::operator new(size))) {
    for (size_t i = 0; i < size; ++i) mem_.get()[i] = static_cast<unsigned char>(i * 29 + 7);
    if (size >= 16) {
      memcpy(mem_.get(), &size, sizeof(size));
      memcpy(mem_.get() + 8, &magic, sizeof(magic));
      memcpy(mem_.get() + 12, &version, sizeof(version));
    }
  }
  void set_int(size_t offset, int v) {
    if (offset + sizeof(v) <= size_) memcpy(mem_.get() + offset, &v, sizeof(v));
  }
  const ncclConfig_t* get() const { return reinterpret_cast<const ncclConfig_t*>(mem_.get()); }
  const unsigned char* bytes() const { return mem_.get(); }
  std::vector<unsigned char> copy() const { return {mem_.get(), mem_.get() + size_}; }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(unsigned char* p) const { ::operator delete(p); }
  };
  size_t size_;
  std::unique_ptr<unsigned char, Free> mem_;
};

int int_at(const std::vector<unsigned char>& b, size_t off) {
  int v;
  memcpy(&v, b.data() + off, sizeof(v));
  return v;
}

std::vector<unsigned char> result_bytes(const PolicyResult& r,
                                        const std::vector<unsigned char>& s) {
  EXPECT_EQ(static_cast<const void*>(r.config), static_cast<const void*>(s.data()));
  return s;
}

struct Generation {
  size_t size;
  unsigned version;
};
// Every struct NCCL has shipped, plus two from the future with fields we do not know.
const Generation kGenerations[] = {{24, 21400}, {40, 21700}, {48, 21800}, {72, 22700},
                                   {80, 22800}, {88, 22900}, {96, 23000}};

bool has_cta_policy(size_t size, unsigned version) {
  return version >= 22700 && size >= kPolicyAt + sizeof(int);
}

// What the patched copy must hold, for a caller whose CTAPolicy is unset (or forced).
void expect_patched(const AppConfig& app, unsigned version, const PolicyResult& r,
                    const std::vector<unsigned char>& storage, int want) {
  ASSERT_TRUE(r.patched);
  ASSERT_NE(static_cast<const void*>(r.config), static_cast<const void*>(app.get()));
  EXPECT_EQ(r.policy, want);
  EXPECT_FALSE(r.why.empty());
  const std::vector<unsigned char> got = result_bytes(r, storage);
  unsigned magic = 0;
  if (has_cta_policy(app.size(), version)) {
    // Copied whole: same size, every byte but CTAPolicy the caller's (unknown tail too).
    ASSERT_EQ(got.size(), app.size());
    for (size_t i = 0; i < got.size(); ++i) {
      if (i < kPolicyAt || i >= kPolicyAt + 4) {
        EXPECT_EQ(got[i], app.bytes()[i]) << "byte " << i;
      }
    }
    EXPECT_EQ(int_at(got, kPolicyAt), want);
    memcpy(&magic, got.data() + 8, sizeof(magic));
    EXPECT_EQ(magic, kMagic);
    return;
  }
  // Rebuilt in our layout: the caller's fields that exist in its version and size, the
  // rest unset, CTAPolicy ours.
  ASSERT_EQ(got.size(), sizeof(ncclConfig_t));
  ncclConfig_t c;
  memcpy(&c, got.data(), sizeof(c));
  EXPECT_EQ(c.size, sizeof(ncclConfig_t));
  EXPECT_EQ(c.magic, kMagic);
  EXPECT_EQ(c.version, static_cast<unsigned>(NCCL_VERSION_CODE));
  for (const Field& f : kFields) {
    SCOPED_TRACE(f.name);
    if (f.offset == kPolicyAt) {
      EXPECT_EQ(c.CTAPolicy, want);
    } else if (version >= f.since && f.offset + f.len <= app.size()) {
      EXPECT_EQ(memcmp(got.data() + f.offset, app.bytes() + f.offset, f.len), 0)
          << "the caller's value was not kept";
    } else if (f.pointer) {
      const void* p = nullptr;
      memcpy(&p, got.data() + f.offset, sizeof(p));
      EXPECT_EQ(p, nullptr) << "a field the caller's struct does not have is set";
    } else {
      EXPECT_EQ(int_at(got, f.offset), INT_MIN)
          << "a field the caller's struct does not have is set";
    }
  }
}

TEST(CtaPolicy, ValuesAreNcclsConstants) {
  for (CtaPolicyMode m : {CtaPolicyMode::kZero, CtaPolicyMode::kEfficiency, CtaPolicyMode::kDefault,
                          CtaPolicyMode::kKeep})
    EXPECT_EQ(zc::cta_policy_value(m), nccl_value(m));
}

TEST(CtaPolicy, NullConfigForInitGetsAFreshConfig) {
  for (CtaPolicyMode m : kApplyingModes) {
    for (bool force : {false, true}) {
      std::vector<unsigned char> storage;
      const PolicyResult r = zc::apply_cta_policy(nullptr, NullConfig::kFresh, m, force, &storage);
      ASSERT_TRUE(r.patched);
      ASSERT_NE(r.config, nullptr);
      EXPECT_EQ(r.policy, nccl_value(m));
      EXPECT_FALSE(r.why.empty());
      ncclConfig_t want = NCCL_CONFIG_INITIALIZER;
      want.CTAPolicy = nccl_value(m);
      const std::vector<unsigned char> got = result_bytes(r, storage);
      ASSERT_EQ(got.size(), sizeof(ncclConfig_t));
      EXPECT_EQ(memcmp(got.data(), &want, sizeof(want)), 0);
    }
  }
}

TEST(CtaPolicy, NullConfigForSplitStaysNull) {
  for (CtaPolicyMode m : kApplyingModes) {
    std::vector<unsigned char> storage;
    const PolicyResult r = zc::apply_cta_policy(nullptr, NullConfig::kInherit, m, true, &storage);
    EXPECT_EQ(r.config, nullptr);
    EXPECT_FALSE(r.patched);
    EXPECT_FALSE(r.why.empty());
    EXPECT_TRUE(storage.empty());
  }
}

TEST(CtaPolicy, KeepNeverPatches) {
  for (NullConfig nc : {NullConfig::kFresh, NullConfig::kInherit}) {
    std::vector<unsigned char> storage;
    PolicyResult r = zc::apply_cta_policy(nullptr, nc, CtaPolicyMode::kKeep, true, &storage);
    EXPECT_EQ(r.config, nullptr);
    EXPECT_FALSE(r.patched);
    EXPECT_TRUE(storage.empty());
    for (const Generation& g : kGenerations) {
      AppConfig app(g.size, g.version);
      app.set_int(kPolicyAt, INT_MIN);
      const std::vector<unsigned char> before = app.copy();
      r = zc::apply_cta_policy(app.get(), nc, CtaPolicyMode::kKeep, true, &storage);
      EXPECT_EQ(r.config, app.get());
      EXPECT_FALSE(r.patched);
      EXPECT_FALSE(r.why.empty());
      EXPECT_TRUE(storage.empty());
      EXPECT_EQ(app.copy(), before);
    }
  }
}

TEST(CtaPolicy, EveryGenerationIsPatchedInACopy) {
  for (const Generation& g : kGenerations)
    for (CtaPolicyMode m : kApplyingModes)
      for (bool force : {false, true})
        for (NullConfig nc : {NullConfig::kFresh, NullConfig::kInherit}) {
          SCOPED_TRACE("size " + std::to_string(g.size) + " version " + std::to_string(g.version) +
                       " want " + std::to_string(nccl_value(m)) + (force ? " force" : ""));
          AppConfig app(g.size, g.version);
          app.set_int(kPolicyAt, INT_MIN);  // unset, where the struct has the field
          const std::vector<unsigned char> before = app.copy();
          std::vector<unsigned char> storage;
          const PolicyResult r = zc::apply_cta_policy(app.get(), nc, m, force, &storage);
          EXPECT_EQ(app.copy(), before) << "the caller's struct was written";
          expect_patched(app, g.version, r, storage, nccl_value(m));
        }
}

TEST(CtaPolicy, ApplicationsOwnPolicyIsKeptUnlessForced) {
  for (const Generation& g : kGenerations) {
    if (!has_cta_policy(g.size, g.version)) continue;
    for (int app_policy : {NCCL_CTA_POLICY_DEFAULT, NCCL_CTA_POLICY_EFFICIENCY}) {
      SCOPED_TRACE("size " + std::to_string(g.size) + " app policy " + std::to_string(app_policy));
      AppConfig app(g.size, g.version);
      app.set_int(kPolicyAt, app_policy);
      const std::vector<unsigned char> before = app.copy();
      std::vector<unsigned char> storage;
      PolicyResult r = zc::apply_cta_policy(app.get(), NullConfig::kFresh, CtaPolicyMode::kZero,
                                            false, &storage);
      EXPECT_EQ(r.config, app.get());
      EXPECT_FALSE(r.patched);
      EXPECT_EQ(r.policy, app_policy);
      EXPECT_FALSE(r.why.empty());
      r = zc::apply_cta_policy(app.get(), NullConfig::kFresh, CtaPolicyMode::kZero, true, &storage);
      expect_patched(app, g.version, r, storage, NCCL_CTA_POLICY_ZERO);
      EXPECT_EQ(app.copy(), before);
    }
  }
}

TEST(CtaPolicy, UninitialisedConfigIsLeftForNcclToReject) {
  for (const Generation& g : kGenerations) {
    for (unsigned magic : {0u, 0xcafebeefu ^ 1u, 0xbeefcafeu}) {
      AppConfig app(g.size, g.version, magic);
      app.set_int(kPolicyAt, INT_MIN);
      const std::vector<unsigned char> before = app.copy();
      std::vector<unsigned char> storage;
      const PolicyResult r =
          zc::apply_cta_policy(app.get(), NullConfig::kFresh, CtaPolicyMode::kZero, true, &storage);
      EXPECT_EQ(r.config, app.get());
      EXPECT_FALSE(r.patched);
      EXPECT_FALSE(r.why.empty());
      EXPECT_EQ(app.copy(), before);
    }
  }
}

TEST(CtaPolicy, NewVersionButTooShortForCtaPolicyIsTreatedAsOld) {
  for (size_t size : {size_t{48}, size_t{56}}) {
    for (unsigned version : {22700u, 22800u}) {
      SCOPED_TRACE("size " + std::to_string(size) + " version " + std::to_string(version));
      AppConfig app(size, version);
      const std::vector<unsigned char> before = app.copy();
      std::vector<unsigned char> storage;
      const PolicyResult r = zc::apply_cta_policy(app.get(), NullConfig::kFresh,
                                                  CtaPolicyMode::kZero, false, &storage);
      EXPECT_EQ(app.copy(), before);
      expect_patched(app, version, r, storage, NCCL_CTA_POLICY_ZERO);
    }
  }
}

TEST(CtaPolicy, TrafficClassOfA225ConfigSurvivesTheUpgrade) {
  // NCCL honours trafficClass from 2.25 on (parseCommConfig resets it only below 2.25.0);
  // a 2.25/2.26 application's 48-byte struct with a traffic class must keep it.
  for (unsigned version : {22500u, 22503u, 22600u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    AppConfig app(48, version);
    app.set_int(offsetof(ncclConfig_t, trafficClass), 5);
    std::vector<unsigned char> storage;
    const PolicyResult r =
        zc::apply_cta_policy(app.get(), NullConfig::kFresh, CtaPolicyMode::kZero, false, &storage);
    ASSERT_TRUE(r.patched);
    ncclConfig_t c;
    ASSERT_EQ(storage.size(), sizeof(c));
    memcpy(&c, storage.data(), sizeof(c));
    EXPECT_EQ(c.trafficClass, 5);
    EXPECT_EQ(c.CTAPolicy, NCCL_CTA_POLICY_ZERO);
  }
}

}  // namespace
