// The verdict on the facts every rank exchanges at pool set-up (ce_setup.h): the same array
// gives every rank the same answer, and each disagreement names itself.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ce_setup.h"

namespace {

std::vector<zc::RankFacts> agreeing(int n, int version) {
  std::vector<zc::RankFacts> all(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    zc::RankFacts& f = all[static_cast<size_t>(r)];
    memset(&f, 0, sizeof f);
    f.magic = 0x7a65726f63746131ull;
    f.host_hash = 42;
    f.fingerprint = 7;
    f.pool_bytes = 1 << 30;
    f.nccl_version = version;
    f.rank = r;
  }
  return all;
}

TEST(Facts, AgreeingRanksOnNccl228) {
  for (int v : {22803, 22809}) {
    auto all = agreeing(4, v);
    EXPECT_EQ(zc::facts_disagreement(all.data(), 4), nullptr) << v;
  }
}

TEST(Facts, EachDisagreementIsNamed) {
  auto all = agreeing(3, 22809);
  all[2].fingerprint = 8;
  EXPECT_NE(std::string(zc::facts_disagreement(all.data(), 3)).find("ZEROCTA_"), std::string::npos);
  all = agreeing(3, 22809);
  all[1].host_hash = 1;
  EXPECT_NE(std::string(zc::facts_disagreement(all.data(), 3)).find("hosts"), std::string::npos);
  all = agreeing(3, 22809);
  all[1].nccl_version = 22803;
  EXPECT_NE(std::string(zc::facts_disagreement(all.data(), 3)).find("NCCL versions"),
            std::string::npos);
  all = agreeing(3, 22809);
  all[2].nccl_env_hash = 5;
  EXPECT_NE(std::string(zc::facts_disagreement(all.data(), 3)).find("NCCL_WIN_ENABLE"),
            std::string::npos);
  all = agreeing(3, 22809);
  all[0].magic = 0;
  EXPECT_NE(zc::facts_disagreement(all.data(), 3), nullptr);
  all = agreeing(2, 22700);
  EXPECT_NE(zc::facts_disagreement(all.data(), 2), nullptr);
}

TEST(Facts, StagedRouteNeedsNccl2289) {
  auto old = agreeing(2, 22803);
  EXPECT_EQ(zc::facts_disagreement(old.data(), 2, /*staged=*/false), nullptr);
  const char* why = zc::facts_disagreement(old.data(), 2, /*staged=*/true);
  ASSERT_NE(why, nullptr);
  EXPECT_NE(std::string(why).find("2.28.9"), std::string::npos);
  auto ok = agreeing(2, zc::kStagedMinNcclVersion);
  EXPECT_EQ(zc::facts_disagreement(ok.data(), 2, /*staged=*/true), nullptr);
}

}  // namespace
