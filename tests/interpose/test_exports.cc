// 2. Every nccl.h function has a wrapper, and the shim exports nothing else but zerocta_* (and
//    the few functions of newer NCCL releases it wraps).
#include <gtest/gtest.h>

#include <sstream>

#include "harness.h"
#include "nccl_header_functions.h"

namespace itest {
namespace {

// Defined dynamic symbols of the shim, from `nm -D --defined-only`. Version-definition
// entries (type 'A', e.g. a version-script node name) are not functions and are skipped.
std::set<std::string> shim_exports() {
  int rc = -1;
  std::string text = capture({"nm", "-D", "--defined-only", shim_path()}, &rc);
  EXPECT_EQ(rc, 0) << "nm -D failed on " << shim_path();
  std::set<std::string> names;
  for (const std::string& line : split_lines(text)) {
    std::istringstream in(line);
    std::string value, type, name;
    if (!(in >> value >> type >> name)) continue;
    if (type == "A") continue;
    size_t at = name.find('@');  // strip symbol versions: ncclFoo@@ZEROCTA_1
    names.insert(name.substr(0, at));
  }
  return names;
}

TEST(Exports, HeaderParserFindsTheKnownApi) {
  std::set<std::string> fns = nccl_header_functions(nccl_header());
  // Spot checks that the parser is reading declarations, not comments or macros.
  for (const char* fn : {"ncclAllGather", "ncclCommInitRankConfig", "ncclResetDebugInit",
                         "ncclGroupSimulateEnd", "ncclCommWindowRegister", "ncclMemAlloc"})
    EXPECT_EQ(fns.count(fn), 1u) << fn;
  for (const std::string& fn : fns) EXPECT_NE(fn.rfind("pnccl", 0), 0u) << fn;
  EXPECT_EQ(fns.count("ncclConfig_t"), 0u);
  EXPECT_EQ(fns.count("ncclRedOpCreate"), 0u) << "matched inside a comment";
}

TEST(Exports, EveryHeaderFunctionIsExported) {
  std::set<std::string> exported = shim_exports();
  std::set<std::string> fns = nccl_header_functions(nccl_header());
  ASSERT_FALSE(fns.empty()) << "could not read " << nccl_header();
  for (const std::string& fn : fns)
    EXPECT_EQ(exported.count(fn), 1u)
        << fn << " is declared in " << nccl_header() << " but libzerocta.so has no wrapper for it";
}

// Functions of NCCL releases newer than the header the library builds with, which it wraps all
// the same (src/core/nccl_api.def, its last section).
const std::set<std::string> kNewerThanTheHeader = {"ncclCommSuspend", "ncclCommResume"};

TEST(Exports, NothingButTheNcclApiAndZeroctaApi) {
  std::set<std::string> fns = nccl_header_functions(nccl_header());
  for (const std::string& fn : kNewerThanTheHeader) fns.insert(fn);
  std::set<std::string> exported = shim_exports();
  ASSERT_FALSE(exported.empty());
  for (const std::string& name : exported) {
    bool ok = fns.count(name) == 1 || name.rfind("zerocta_", 0) == 0;
    EXPECT_TRUE(ok) << "libzerocta.so exports " << name
                    << " (only nccl.h functions, those of newer NCCL releases it wraps, and "
                       "zerocta_* may be exported)";
  }
  std::set<std::string> api = nccl_header_functions(zerocta_header(), "zerocta_");
  EXPECT_GE(api.size(), 6u) << "could not read " << zerocta_header();
  for (const std::string& fn : api) EXPECT_EQ(exported.count(fn), 1u) << fn;
}

}  // namespace
}  // namespace itest
