// 3. The CTA policy on every communicator-creation path, for every config generation.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <sstream>

#include "config_bytes.h"
#include "harness.h"

namespace itest {
namespace {

using Env = std::vector<std::pair<std::string, std::string>>;

RunResult run_config(const std::vector<std::string>& args, const Env& env, const Scratch& scratch,
                     bool preload = true) {
  RunSpec spec;
  spec.argv = {driver("drv_config")};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.env = env;
  spec.preload = preload;
  return run(spec, scratch);
}

std::vector<unsigned char> caller_before(const RunResult& r) { return unhex(r.kv()["before"]); }

// The caller's struct is never written (its page is also read-only during the call).
void expect_caller_untouched(const RunResult& r) {
  auto kv = r.kv();
  EXPECT_FALSE(kv["before"].empty()) << r.describe();
  EXPECT_EQ(kv["after"], kv["before"]) << "the application's config changed\n" << r.describe();
}

// What NCCL must receive for an application config of (size, version) under the zero
// policy: magic intact and CTAPolicy 2 at offset 60. A struct older than 2.27 (size < 72 or
// version < 22700) cannot hold CTAPolicy, so it must arrive extended to the 2.28 layout
// (size 80, version 22809) with the fields its version defines kept and all others
// undefined (INT_MIN / NULL). A 2.28 or newer struct keeps its size, and every byte but
// CTAPolicy, unknown trailing bytes included. The caller's own bytes never change.
void check_zero_policy_generation(size_t size, unsigned version, const RunResult& r,
                                  const std::string& fn) {
  SCOPED_TRACE(::testing::Message() << fn << " size=" << size << " version=" << version);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("result"), 0) << r.describe();
  expect_caller_untouched(r);
  std::vector<unsigned char> before = caller_before(r);
  ASSERT_EQ(before.size(), size);
  SeenConfig seen = seen_config(r, fn);
  ASSERT_TRUE(seen.present && !seen.null) << r.describe();
  ASSERT_EQ(seen.bytes.size(), seen.size);
  EXPECT_EQ(seen.magic, 0xcafebeefu);
  ASSERT_GE(seen.size, 64u) << "NCCL got a struct too short to hold CTAPolicy\n" << r.describe();
  EXPECT_EQ(seen.cta(), 2) << r.describe();

  const bool must_extend = size < 72 || version < 22700;
  const bool extended = seen.size != size;
  if (must_extend) {
    EXPECT_EQ(seen.size, kConfigSize228) << r.describe();
    EXPECT_EQ(seen.version, 22809u) << r.describe();
  } else if (size == 72) {
    // A 2.27 struct already holds CTAPolicy: patching in place or extending are both fine.
    EXPECT_TRUE(seen.size == 72 || seen.size == kConfigSize228) << r.describe();
    if (extended) {
      EXPECT_EQ(seen.version, 22809u);
    }
  } else {
    EXPECT_EQ(seen.size, size) << "a newer struct must keep its size\n" << r.describe();
  }
  if (!extended) {
    // Identical bytes except CTAPolicy: everything past offset 64 of a newer struct included.
    for (size_t i = 0; i < size && i < seen.bytes.size(); ++i) {
      if (i >= kCtaOffset && i < kCtaOffset + 4) continue;
      ASSERT_EQ(seen.bytes[i], before[i]) << "byte " << i << " changed\n" << r.describe();
    }
    return;
  }
  // Extended to the 2.28 layout: the fields the caller's struct defines (by size and by
  // version) kept, every other field undefined.
  for (const ConfigField& f : kConfigFields) {
    if (f.offset == kCtaOffset) continue;
    const bool defined = f.offset + f.len <= size && f.since <= version;
    std::vector<unsigned char> want(f.len, 0);
    if (defined) {
      memcpy(want.data(), before.data() + f.offset, f.len);
    } else if (!f.pointer) {
      int undef = INT_MIN;
      memcpy(want.data(), &undef, sizeof undef);
    }
    std::vector<unsigned char> got(seen.bytes.begin() + f.offset,
                                   seen.bytes.begin() + f.offset + f.len);
    EXPECT_EQ(got, want) << "field at offset " << f.offset
                         << (defined ? " (set by the caller)" : " (must be undefined)") << "\n"
                         << r.describe();
  }
}

struct Generation {
  size_t size;
  unsigned version;
};
const Generation kGenerations[] = {{24, 21400}, {40, 21700}, {48, 21800}, {72, 22700},
                                   {80, 22800}, {88, 22900}, {96, 23000}};

TEST(Policy, FakeSeesCallerBytesWithoutShim) {
  // Baseline for the rules: without the shim NCCL receives the caller's own struct.
  Scratch scratch;
  for (const Generation& g : kGenerations) {
    RunResult r = run_config({"rankconfig", std::to_string(g.size), std::to_string(g.version)}, {},
                             scratch, false);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    SeenConfig seen = seen_config(r, "ncclCommInitRankConfig");
    EXPECT_EQ(seen.bytes, caller_before(r)) << r.describe();
    EXPECT_EQ(seen.ptr, r.kv()["caller_ptr"]);
  }
}

TEST(Policy, InitRankArrivesAsInitRankConfigWithZeroPolicy) {
  Scratch scratch;
  RunResult r = run_config({"initrank"}, {}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("result"), 0);
  EXPECT_TRUE(log_calls(r, "ncclCommInitRank").empty()) << r.describe();
  SeenConfig seen = seen_config(r, "ncclCommInitRankConfig");
  ASSERT_TRUE(seen.present && !seen.null) << r.describe();
  EXPECT_EQ(seen.magic, 0xcafebeefu);
  ASSERT_GE(seen.size, 64u);
  EXPECT_EQ(seen.cta(), 2);
  auto f = log_fields(log_calls(r, "ncclCommInitRankConfig").front());
  EXPECT_EQ(f["nranks"], "4");
  EXPECT_EQ(f["rank"], "2");
}

TEST(Policy, NullConfigGetsAFreshZeroPolicyConfig) {
  Scratch scratch;
  for (const char* entry : {"rankconfig", "scalable"}) {
    RunResult r = run_config({entry, "null"}, {}, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    std::string fn =
        std::string(entry) == "scalable" ? "ncclCommInitRankScalable" : "ncclCommInitRankConfig";
    SeenConfig seen = seen_config(r, fn);
    ASSERT_TRUE(seen.present && !seen.null) << entry << "\n" << r.describe();
    EXPECT_EQ(seen.magic, 0xcafebeefu);
    EXPECT_EQ(seen.size, kConfigSize228);
    EXPECT_EQ(seen.cta(), 2);
    // Everything else undefined, as NCCL_CONFIG_INITIALIZER leaves it.
    for (const ConfigField& f : kConfigFields) {
      if (f.offset == kCtaOffset) continue;
      if (f.pointer) {
        EXPECT_EQ(seen.ptr_at(f.offset), 0u) << "offset " << f.offset;
      } else {
        EXPECT_EQ(seen.int_at(f.offset), INT_MIN) << "offset " << f.offset;
      }
    }
  }
}

TEST(Policy, EveryConfigGenerationInitRankConfig) {
  Scratch scratch;
  for (const Generation& g : kGenerations) {
    RunResult r =
        run_config({"rankconfig", std::to_string(g.size), std::to_string(g.version)}, {}, scratch);
    check_zero_policy_generation(g.size, g.version, r, "ncclCommInitRankConfig");
  }
}

TEST(Policy, EveryConfigGenerationInitRankScalable) {
  Scratch scratch;
  for (const Generation& g : kGenerations) {
    RunResult r =
        run_config({"scalable", std::to_string(g.size), std::to_string(g.version)}, {}, scratch);
    check_zero_policy_generation(g.size, g.version, r, "ncclCommInitRankScalable");
    auto calls = log_calls(r, "ncclCommInitRankScalable");
    if (!calls.empty()) {
      EXPECT_EQ(log_fields(calls.front())["nId"], "2");
    }
  }
}

TEST(Policy, ApplicationChoiceIsKeptUnlessForced) {
  Scratch scratch;
  RunResult kept = run_config({"rankconfig", "80", "22809", "1"}, {}, scratch);
  ASSERT_EQ(kept.exit_code, 0) << kept.describe();
  expect_caller_untouched(kept);
  EXPECT_EQ(seen_config(kept, "ncclCommInitRankConfig").cta(), 1) << kept.describe();

  RunResult forced =
      run_config({"rankconfig", "80", "22809", "1"}, {{"ZEROCTA_CTA_POLICY_FORCE", "1"}}, scratch);
  ASSERT_EQ(forced.exit_code, 0) << forced.describe();
  expect_caller_untouched(forced);
  EXPECT_EQ(seen_config(forced, "ncclCommInitRankConfig").cta(), 2) << forced.describe();
}

TEST(Policy, KeepLeavesEverythingUntouched) {
  Scratch scratch;
  for (const Generation& g : kGenerations) {
    RunResult r = run_config({"rankconfig", std::to_string(g.size), std::to_string(g.version)},
                             {{"ZEROCTA_CTA_POLICY", "keep"}}, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    SeenConfig seen = seen_config(r, "ncclCommInitRankConfig");
    EXPECT_EQ(seen.ptr, r.kv()["caller_ptr"]) << "keep must pass the caller's own struct";
    EXPECT_EQ(seen.bytes, caller_before(r)) << r.describe();
  }
  RunResult initrank = run_config({"initrank"}, {{"ZEROCTA_CTA_POLICY", "keep"}}, scratch);
  EXPECT_EQ(log_calls(initrank, "ncclCommInitRank").size(), 1u) << initrank.describe();
  EXPECT_TRUE(log_calls(initrank, "ncclCommInitRankConfig").empty()) << initrank.describe();
  RunResult null_cfg =
      run_config({"rankconfig", "null"}, {{"ZEROCTA_CTA_POLICY", "keep"}}, scratch);
  EXPECT_TRUE(seen_config(null_cfg, "ncclCommInitRankConfig").null) << null_cfg.describe();
}

TEST(Policy, EfficiencyGivesOne) {
  Scratch scratch;
  RunResult r =
      run_config({"rankconfig", "80", "22809"}, {{"ZEROCTA_CTA_POLICY", "efficiency"}}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(seen_config(r, "ncclCommInitRankConfig").cta(), 1) << r.describe();
  RunResult initrank = run_config({"initrank"}, {{"ZEROCTA_CTA_POLICY", "efficiency"}}, scratch);
  EXPECT_EQ(seen_config(initrank, "ncclCommInitRankConfig").cta(), 1) << initrank.describe();
}

TEST(Policy, BadMagicIsForwardedUntouched) {
  Scratch scratch;
  RunResult r = run_config({"rankconfig", "80", "22809", "unset", "badmagic"}, {}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  expect_caller_untouched(r);
  SeenConfig seen = seen_config(r, "ncclCommInitRankConfig");
  EXPECT_EQ(seen.ptr, r.kv()["caller_ptr"]) << r.describe();
  EXPECT_EQ(seen.bytes, caller_before(r));
  // NCCL's own verdict on the struct reaches the application.
  EXPECT_EQ(r.num("result"), 4) << "ncclInvalidArgument from NCCL must propagate";
}

TEST(Policy, SplitAndShrinkWithNullConfigInherit) {
  Scratch scratch;
  for (const char* entry : {"split", "shrink"}) {
    RunResult r = run_config({entry, "null"}, {}, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.num("result"), 0);
    std::string fn = std::string(entry) == "split" ? "ncclCommSplit" : "ncclCommShrink";
    SeenConfig seen = seen_config(r, fn);
    ASSERT_TRUE(seen.present) << r.describe();
    EXPECT_TRUE(seen.null) << fn << " with a NULL config must keep NULL (inherit)\n"
                           << r.describe();
  }
}

TEST(Policy, SplitAndShrinkWithConfigArePatched) {
  Scratch scratch;
  for (const char* entry : {"split", "shrink"}) {
    std::string fn = std::string(entry) == "split" ? "ncclCommSplit" : "ncclCommShrink";
    for (const Generation& g : {Generation{48, 21800}, Generation{80, 22809}}) {
      RunResult r =
          run_config({entry, std::to_string(g.size), std::to_string(g.version)}, {}, scratch);
      check_zero_policy_generation(g.size, g.version, r, fn);
    }
  }
}

TEST(Policy, SplitNoColorReturnsNullComm) {
  Scratch scratch;
  for (const char* cfg : {"null", "80"}) {
    RunResult r = run_config({"split_nocolor", cfg}, {}, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.num("result"), 0) << r.describe();
    EXPECT_EQ(r.num("newcomm_null"), 1) << r.describe();
  }
}

// Log lines of the fake NCCL, without the fake driver's and the drivers' markers.
std::vector<std::string> nccl_lines_between(const RunResult& r, const std::string& from,
                                            const std::string& to) {
  std::vector<std::string> out;
  bool in = false;
  for (const std::string& line : r.log_lines()) {
    if (line == "marker " + from) {
      in = true;
    } else if (line == "marker " + to) {
      break;
    } else if (in && line.rfind("nccl", 0) == 0) {
      out.push_back(line);
    }
  }
  return out;
}

TEST(Policy, InitAllBecomesGroupedInitRankConfigOnEachDevice) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_init_all"), "initall"};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(r.num("result"), 0);
  EXPECT_EQ(r.num("dev_before"), 3);
  EXPECT_EQ(r.num("dev_after"), 3) << "the caller's current device was not restored";
  // The shim's read-only queries (version probe, rank/count/device of the new comms) are
  // allowed here; Forwarding.* checks whether they are made when nothing needs them.
  std::vector<std::string> calls;
  for (const std::string& line : nccl_lines_between(r, "driver-setup-end", "driver-check-begin")) {
    std::string fn = log_fields(line)["fn"];
    if (fn != "ncclGetVersion" && fn != "ncclCommUserRank" && fn != "ncclCommCount" &&
        fn != "ncclCommCuDevice")
      calls.push_back(line);
  }
  ASSERT_EQ(calls.size(), 6u) << r.describe();
  EXPECT_EQ(log_fields(calls[0])["fn"], "ncclGetUniqueId");
  EXPECT_EQ(log_fields(calls[1])["fn"], "ncclGroupStart");
  const int kDevlist[3] = {2, 0, 1};
  std::string id;
  for (int i = 0; i < 3; ++i) {
    auto f = log_fields(calls[2 + i]);
    EXPECT_EQ(f["fn"], "ncclCommInitRankConfig") << calls[2 + i];
    EXPECT_EQ(f["nranks"], "3");
    EXPECT_EQ(f["rank"], std::to_string(i));
    EXPECT_EQ(f["device"], std::to_string(kDevlist[i])) << "rank " << i << " on the wrong device";
    EXPECT_EQ(f["cta"], "2");
    EXPECT_EQ(f["magic"], "0xcafebeef");
    if (i == 0) id = f["id"];
    EXPECT_EQ(f["id"], id) << "ranks created with different unique ids";
    EXPECT_EQ(r.num("comm" + std::to_string(i) + ".device"), kDevlist[i]);
    EXPECT_EQ(r.num("comm" + std::to_string(i) + ".rank"), i);
  }
  EXPECT_EQ(log_fields(calls[5])["fn"], "ncclGroupEnd");
  EXPECT_TRUE(log_calls(r, "ncclCommInitAll").empty());
}

TEST(Policy, OlderNcclIsForwardedUntouched) {
  Scratch scratch;
  Env env = {{"FAKE_NCCL_VERSION", "22703"}, {"ZEROCTA_LOG", "info"}};
  RunResult initrank = run_config({"initrank"}, env, scratch);
  ASSERT_EQ(initrank.exit_code, 0) << initrank.describe();
  EXPECT_EQ(log_calls(initrank, "ncclCommInitRank").size(), 1u) << initrank.describe();
  EXPECT_TRUE(log_calls(initrank, "ncclCommInitRankConfig").empty()) << initrank.describe();
  int mentions = 0;
  for (const std::string& line : initrank.err_lines())
    if (contains(line, "22703") || contains(line, "2.27.3")) ++mentions;
  EXPECT_EQ(mentions, 1) << "one line must say NCCL 2.27.3 is forwarded untouched\n"
                         << initrank.describe();

  RunResult cfg = run_config({"rankconfig", "80", "22809"}, env, scratch);
  ASSERT_EQ(cfg.exit_code, 0) << cfg.describe();
  SeenConfig seen = seen_config(cfg, "ncclCommInitRankConfig");
  EXPECT_EQ(seen.ptr, cfg.kv()["caller_ptr"]) << cfg.describe();
  EXPECT_EQ(seen.bytes, caller_before(cfg)) << cfg.describe();
}

TEST(Policy, NewerNcclGetsThePolicyAndAWarning) {
  Scratch scratch;
  RunResult r = run_config({"initrank"}, {{"FAKE_NCCL_VERSION", "22907"}}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_EQ(seen_config(r, "ncclCommInitRankConfig").cta(), 2) << r.describe();
  int mentions = 0;
  for (const std::string& line : r.err_lines())
    if ((contains(line, "22907") || contains(line, "2.29.7")) && contains(line, "tested"))
      ++mentions;
  EXPECT_EQ(mentions, 1) << "one line must say NCCL 2.29.7 is untested beyond the policy\n"
                         << r.describe();
}

TEST(Policy, NcclCtaPolicyEnvironmentOverrideIsWarned) {
  Scratch scratch;
  RunResult quiet = run_config({"initrank"}, {}, scratch);
  ASSERT_EQ(quiet.exit_code, 0) << quiet.describe();
  EXPECT_FALSE(contains(quiet.err, "NCCL_CTA_POLICY")) << quiet.describe();

  RunResult r = run_config({"initrank"}, {{"NCCL_CTA_POLICY", "1"}}, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  int warns = 0;
  for (const std::string& line : r.err_lines())
    if (contains(line, "WARN") && contains(line, "NCCL_CTA_POLICY")) ++warns;
  EXPECT_EQ(warns, 1) << r.describe();
}

}  // namespace
}  // namespace itest
