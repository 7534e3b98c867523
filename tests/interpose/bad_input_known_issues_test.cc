// KNOWN ISSUES: bad input that the shim mishandles today. Each test states the correct
// behaviour and FAILS until src/ is fixed; the fix proposed for each is in its comment and in
// docs/RELIABILITY.md ("Bad input"). They live in their own binary, labelled known_issue,
// so `ctest -LE known_issue` gives the rest of the suite while a fix is pending; once fixed,
// a test stays as the regression test for it.
//
// Every case runs in a process of its own, since the failure is a crash.
#include <gtest/gtest.h>

#include <map>

#include "bad_input_log.h"
#include "harness.h"

namespace itest {
namespace {

// Runs `steps` without and with the shim; returns the shim's run after checking the baseline.
RunResult compare_once(const std::vector<std::string>& steps, RunResult* base_out,
                       const Scratch& scratch,
                       const std::vector<std::pair<std::string, std::string>>& env = {}) {
  *base_out = run_bad_input(steps, false, {}, scratch);
  EXPECT_EQ(base_out->exit_code, 0) << base_out->describe();
  return run_bad_input(steps, true, env, scratch);
}

// KNOWN ISSUE 1 (src/wrappers_comm.cc): ncclCommInitRank, ncclCommInitRankConfig and
// ncclCommInitRankScalable evaluate `*comm` / `*newcomm` for after_create() even when the
// application passed NULL. NCCL answers ncclInvalidArgument (PtrCheck); the shim crashes.
// Fix: pass `comm ? *comm : nullptr` (resp. newcomm) to after_create, as Split/Shrink do
// with `if (newcomm)`.
TEST(BadInputKnownIssue, InitWithNullCommPointerReturnsNcclsAnswer) {
  for (const char* step : {"initrank_nullcomm", "initrankconfig_nullcomm", "scalable_nullcomm"}) {
    SCOPED_TRACE(step);
    Scratch scratch;
    RunResult base;
    RunResult r = compare_once({step}, &base, scratch);
    EXPECT_EQ(base.num(step), 4) << "NCCL's answer is ncclInvalidArgument\n" << base.describe();
    ASSERT_EQ(r.signal, 0) << "KNOWN ISSUE 1: the shim dereferences the NULL ncclComm_t*\n"
                           << r.describe();
    EXPECT_EQ(r.kv(), base.kv()) << r.describe();
  }
}

// KNOWN ISSUE 2 (src/wrappers_comm.cc nonblocking_config, src/comms/cta_policy.cc): the shim reads
// `blocking` at offset 16 of the application's ncclConfig_t whatever its `size` (and
// apply_cta_policy reads magic and version at 8..16 before looking at `size`). NCCL copies
// exactly `size` bytes (parseCommConfig), so a 16-byte config ending at an unmapped page
// works with NCCL and crashes under the shim, whether the magic is right or not, with every
// ZEROCTA_CTA_POLICY; so does a 12-byte one (NCCL accepts it: size and magic). Fix: read `size`
// first; read magic only if size >= 12, version only if size >= 16, blocking only if size >= 20 and
// the magic is right (else NCCL's default, i.e. NCCL_COMM_BLOCKING); and decide nonblocking only
// after NCCL returned success.
TEST(BadInputKnownIssue, ShortConfigIsReadOnlyWithinItsSize) {
  for (const char* policy : {"zero", "keep"}) {
    for (const char* step : {"config16", "config16_badmagic", "config12"}) {
      SCOPED_TRACE(std::string(step) + " ZEROCTA_CTA_POLICY=" + policy);
      Scratch scratch;
      RunResult base;
      RunResult r = compare_once({step}, &base, scratch, {{"ZEROCTA_CTA_POLICY", policy}});
      ASSERT_EQ(r.signal, 0) << "KNOWN ISSUE 2: the shim reads past the config's size\n"
                             << r.describe();
      EXPECT_EQ(r.kv(), base.kv()) << r.describe();
    }
  }
}

// KNOWN ISSUE 3 (src/wrappers_comm.cc ncclCommInitAll): the shim rebuilds ncclCommInitAll
// from a group of ncclCommInitRankConfig calls and checks each device only when it reaches
// it. NCCL checks the whole list first (a device outside 0..count-1: ncclInvalidArgument; a
// device twice: ncclInvalidUsage) and creates nothing. With {0, 99} the shim has already
// queued rank 0's init when it stops at 99: on real NCCL that rank waits in ncclGroupEnd for
// a rank 1 that never comes (a hang), and on success paths the comm would leak. With {1, 1}
// it creates two ranks on one GPU, which NCCL refuses. Fix: before the rebuild, validate
// devlist exactly as NCCL does (cuDeviceGetCount; range, duplicates) and return NCCL's
// error without calling NCCL, or simply forward such a call unchanged.
TEST(BadInputKnownIssue, InitAllWithBadDeviceListCreatesNothing) {
  for (const char* step : {"initall_baddev", "initall_dupdev"}) {
    SCOPED_TRACE(step);
    Scratch scratch;
    RunResult base;
    RunResult r = compare_once({step}, &base, scratch);
    ASSERT_EQ(r.signal, 0) << r.describe();
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(base.num(std::string(step) + ".created"), 0) << base.describe();
    EXPECT_EQ(r.kv(), base.kv()) << "KNOWN ISSUE 3: result or created communicators differ\n"
                                 << r.describe();
    EXPECT_TRUE(log_calls(r, "ncclCommInitRankConfig").empty())
        << "KNOWN ISSUE 3: a rank was initialised before the device list was checked\n"
        << r.describe();
  }
}

// KNOWN ISSUE 5 (src/core/real_nccl.cc find_handle/real_nccl): while no NCCL can be found, every
// NCCL call retries the dlopen of ZEROCTA_NCCL_LIBRARY and says again why it failed ("could
// not be loaded", "is libzerocta itself"): one WARN line per call, so a training loop floods
// stderr. The "no NCCL library is loaded" line is already said once. Fix: remember the
// failed resolution (a std::once_flag around resolve_locked, or a `tried` flag under
// g_resolve_mu) so that the search, and its WARN, happen once per process.
TEST(BadInputKnownIssue, UnusableNcclLibraryIsReportedOncePerProcess) {
  for (const std::string& value : {std::string(), std::string("/nonexistent-zerocta/libnccl.so.2"),
                                   std::string("/etc/hostname"), shim_path()}) {
    SCOPED_TRACE("ZEROCTA_NCCL_LIBRARY=" + value);
    Scratch scratch;
    RunSpec spec;
    spec.argv = {BAD_INPUT_DLSYM_DRIVER, "5"};
    if (!value.empty()) spec.env = {{"ZEROCTA_NCCL_LIBRARY", value}};
    RunResult r = run(spec, scratch);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    EXPECT_EQ(r.num("call.4"), 2);
    std::map<std::string, int> said;  // WARN message (without the host:pid:tid prefix) -> times
    for (const std::string& line : split_lines(r.err)) {
      const size_t at = line.find(" zerocta WARN ");
      if (at != std::string::npos) ++said[line.substr(at)];
    }
    EXPECT_FALSE(said.empty()) << r.describe();
    for (const auto& [message, n] : said)
      EXPECT_EQ(n, 1) << "KNOWN ISSUE 5: said " << n << " times for 5 calls:" << message;
  }
}

// KNOWN ISSUE 7 (src/interpose/shim_entry.cc announce): NCCL_CTA_POLICY is printed into a WARN line as
// it is, so a value with a newline starts a line of its own choosing on stderr; ZEROCTA_*
// values are quoted and escaped (config.cc quote()). Fix: print NCCL_CTA_POLICY through the
// same quoting (export it from config.cc, e.g. `std::string quoted(const char*)`).
TEST(BadInputKnownIssue, NcclCtaPolicyIsPrintedEscaped) {
  Scratch scratch;
  RunSpec spec;
  spec.argv = {driver("drv_script"), "init", "destroy"};
  spec.env = {{"NCCL_CTA_POLICY", "1\nforged: zerocta WARN everything is fine"}};
  RunResult r = run(spec, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(r.err, "NCCL_CTA_POLICY")) << "the warning itself is expected\n"
                                                  << r.describe();
  for (const std::string& line : r.err_lines())
    EXPECT_NE(line.rfind("forged:", 0), 0u)
        << "KNOWN ISSUE 7: the environment wrote a log line of its own\n"
        << r.describe();
}

}  // namespace
}  // namespace itest
