// src/interpose/glibc_compat.c, the local arc4random and _dl_find_object that keep libzerocta.so on a
// glibc 2.34 baseline, checked against glibc's own. The top-level CMakeLists.txt links the file
// into this test binary as well; its hidden definitions take this binary's calls, while
// dlvsym() still finds glibc's.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

namespace {

#ifdef DLFO_STRUCT_HAS_EH_DBASE

using FindObject = int (*)(void*, dl_find_object*);

__attribute__((noinline)) int local_function(int x) { return x * 3 + 1; }

TEST(FirstContactGlibc, CompatFindObjectAgreesWithGlibc) {
  const auto real =
      reinterpret_cast<FindObject>(dlvsym(RTLD_DEFAULT, "_dl_find_object", "GLIBC_2.35"));
  if (real == nullptr) GTEST_SKIP() << "this glibc has no _dl_find_object";
  const FindObject ours = &_dl_find_object;
  ASSERT_NE(reinterpret_cast<void*>(ours), reinterpret_cast<void*>(real))
      << "src/interpose/glibc_compat.c is not linked into this test";

  int on_stack = 0;
  void* heap = malloc(16);
  struct Case {
    const char* what;
    void* address;
  } cases[] = {
      {"this binary", reinterpret_cast<void*>(&local_function)},
      {"libc", reinterpret_cast<void*>(&snprintf)},
      {"libstdc++", reinterpret_cast<void*>(static_cast<void (*)(void*)>(&::operator delete))},
      {"libgtest", reinterpret_cast<void*>(&testing::UnitTest::GetInstance)},
      {"the stack", &on_stack},
      {"the heap", heap},
      {"null", nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    dl_find_object want{}, got{};
    const int want_rc = real(c.address, &want);
    const int got_rc = ours(c.address, &got);
    ASSERT_EQ(got_rc, want_rc);
    if (want_rc != 0) continue;
    EXPECT_EQ(got.dlfo_map_start, want.dlfo_map_start);
    EXPECT_EQ(got.dlfo_map_end, want.dlfo_map_end);
    EXPECT_EQ(got.dlfo_eh_frame, want.dlfo_eh_frame);  // what the unwinder uses
    EXPECT_EQ(got.dlfo_link_map, want.dlfo_link_map);
  }
  free(heap);
  EXPECT_EQ(local_function(2), 7);
}

#endif  // DLFO_STRUCT_HAS_EH_DBASE

#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 36)
TEST(FirstContactGlibc, CompatArc4randomGivesRandomWords) {
  using Arc4random = uint32_t (*)();
  const auto real = reinterpret_cast<Arc4random>(dlvsym(RTLD_DEFAULT, "arc4random", "GLIBC_2.36"));
  const Arc4random ours = &arc4random;
  ASSERT_NE(reinterpret_cast<void*>(ours), reinterpret_cast<void*>(real))
      << "src/interpose/glibc_compat.c is not linked into this test";
  std::set<uint32_t> seen;
  uint32_t all_or = 0, all_and = ~0u;
  for (int i = 0; i < 256; ++i) {
    const uint32_t v = ours();
    seen.insert(v);
    all_or |= v;
    all_and &= v;
  }
  EXPECT_GE(seen.size(), 250u);  // 256 draws of 32 bits: a repeat is already unlikely
  EXPECT_EQ(all_or, ~0u);        // every bit is set sometimes ...
  EXPECT_EQ(all_and, 0u);        // ... and clear sometimes
}
#endif

}  // namespace
