// The route's agreement (membership.h): one verdict from the frozen membership, the same for
// every rank, with each way to disagree named.
#include "membership.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

namespace {

zc::MemberFacts member(uint32_t index, int64_t order_key = -1) {
  zc::MemberFacts m;
  m.join_index = index;
  m.order_key = order_key < 0 ? index : order_key;
  m.pid = 1000 + static_cast<int32_t>(index);
  m.uid = 42;
  m.fingerprint = 0xfeed;
  m.nccl_version = 22809;
  m.uuid[0] = static_cast<unsigned char>(index + 1);
  return m;
}

std::vector<zc::MemberFacts> ranks(int n) {
  std::vector<zc::MemberFacts> v;
  for (int i = 0; i < n; ++i) v.push_back(member(static_cast<uint32_t>(i)));
  return v;
}

TEST(Membership, EveryRankJoinedWithEqualSettingsCommits) {
  auto v = ranks(4);
  std::shuffle(v.begin(), v.end(), std::mt19937(7));
  const zc::Agreement a = zc::agree(v, 4, 0, 4);
  ASSERT_TRUE(a.commit) << a.why;
  ASSERT_EQ(a.ranks.size(), 4u);
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(a.ranks[r].join_index, r);
}

TEST(Membership, ChildRanksFollowTheSplitKeyThenTheParentRank) {
  // NCCL numbers a split's ranks by key, ties by parent rank.
  std::vector<zc::MemberFacts> v = {member(0, 5), member(3, 1), member(5, 5), member(6, 0)};
  const zc::Agreement a = zc::agree(v, 4, 0, 8);
  ASSERT_TRUE(a.commit) << a.why;
  const uint32_t want[] = {6, 3, 0, 5};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(a.ranks[static_cast<size_t>(r)].join_index, want[r]);
}

TEST(Membership, EachWayToDisagreeIsNamed) {
  struct Case {
    const char* name;
    void (*spoil)(std::vector<zc::MemberFacts>*);
    const char* needle;
    bool warn;
  } const cases[] = {
      {"fingerprint", [](auto* v) { (*v)[1].fingerprint ^= 1; }, "settings", true},
      {"nccl", [](auto* v) { (*v)[2].nccl_version = 22803; }, "NCCL versions", true},
      {"uid", [](auto* v) { (*v)[0].uid = 7; }, "users", true},
      {"flags", [](auto* v) { (*v)[1].problems = zc::kProblemFlags; }, "flags", true},
      {"one connection", [](auto* v) { (*v)[3].problems = zc::kProblemOneConnection; },
       "CUDA_DEVICE_MAX_CONNECTIONS=1", false},
      {"p2p", [](auto* v) { (*v)[3].problems = zc::kProblemP2p; }, "P2P", true},
      {"invisible", [](auto* v) { (*v)[0].problems = zc::kProblemPeerInvisible; },
       "not visible in this process", false},
      {"fd", [](auto* v) { (*v)[2].problems = zc::kProblemFdService; }, "fd service", true},
      {"device", [](auto* v) { (*v)[2].problems = zc::kProblemDevice; }, "device", true},
      {"same gpu", [](auto* v) { (*v)[2].uuid[0] = (*v)[1].uuid[0]; }, "share one GPU", true},
  };
  for (const Case& c : cases) {
    auto v = ranks(4);
    c.spoil(&v);
    const zc::Agreement a = zc::agree(v, 4, 0, 4);
    EXPECT_FALSE(a.commit) << c.name;
    EXPECT_NE(std::string(a.why).find(c.needle), std::string::npos) << c.name << ": " << a.why;
    EXPECT_EQ(a.warn, c.warn) << c.name;
    EXPECT_TRUE(a.ranks.empty()) << c.name;
  }
}

TEST(Membership, OneHardwareQueueOnAnyRankPassesThroughWithAnInfo) {
  // A setting the user chose, not a failure: every rank passes through, and says why at INFO.
  for (size_t who = 0; who < 4; ++who) {
    auto v = ranks(4);
    v[who].problems = zc::kProblemOneConnection;
    const zc::Agreement a = zc::agree(v, 4, 0, 4);
    EXPECT_FALSE(a.commit) << who;
    EXPECT_FALSE(a.warn) << who;
    EXPECT_STREQ(a.why,
                 "a rank runs with CUDA_DEVICE_MAX_CONNECTIONS=1 (a flag wait would block its "
                 "only hardware queue)")
        << who;
    EXPECT_TRUE(a.ranks.empty()) << who;
  }
}

TEST(Membership, FlagsThatCudaWouldNotRegisterAreAWarning) {
  auto v = ranks(2);
  v[0].problems = zc::kProblemFlags;
  const zc::Agreement a = zc::agree(v, 2, 0, 2);
  EXPECT_FALSE(a.commit);
  EXPECT_TRUE(a.warn);
  EXPECT_STREQ(a.why, "a rank could not register the channel's flags with CUDA");
}

TEST(Membership, AMissingRankIsAnotherHostUnlessAGpuHereIsLeftOver) {
  auto v = ranks(2);
  v.pop_back();
  zc::Agreement a = zc::agree(v, 2, 0, /*local_gpus=*/1);  // one GPU visible: elsewhere
  EXPECT_FALSE(a.commit);
  EXPECT_FALSE(a.warn) << a.why;
  a = zc::agree(v, 2, 0, /*local_gpus=*/2);  // a GPU here with nobody on it: a rank opted out
  EXPECT_FALSE(a.commit);
  EXPECT_TRUE(a.warn) << a.why;
  EXPECT_NE(std::string(a.why).find("did not join"), std::string::npos) << a.why;
  // Such a rank's CTA policy may differ: the reason names the risk to NCCL's window ops.
  EXPECT_NE(std::string(a.why).find("window buffers"), std::string::npos) << a.why;
}

TEST(Membership, BrokenChannelsTooManyMembersAndSingleRanksNeverCommit) {
  EXPECT_FALSE(zc::agree(ranks(2), 2, /*broken=*/1, 2).commit);
  EXPECT_TRUE(zc::agree(ranks(2), 2, 1, 2).warn);
  EXPECT_FALSE(zc::agree(ranks(3), 2, 0, 8).commit);
  EXPECT_FALSE(zc::agree(ranks(1), 1, 0, 8).commit);
  EXPECT_FALSE(zc::agree({}, 2, 0, 0).commit);
}

TEST(Membership, TheVerdictDoesNotDependOnTheOrderMembersAreRead) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    auto v = ranks(6);
    if (trial % 3 == 0) v[static_cast<size_t>(trial % 6)].fingerprint ^= 1;
    if (trial % 5 == 0) v[static_cast<size_t>(trial % 6)].order_key = 100 - trial % 6;
    const zc::Agreement base = zc::agree(v, 6, 0, 6);
    std::shuffle(v.begin(), v.end(), rng);
    const zc::Agreement other = zc::agree(v, 6, 0, 6);
    ASSERT_EQ(base.commit, other.commit);
    ASSERT_STREQ(base.why, other.why);
    for (size_t i = 0; i < base.ranks.size(); ++i)
      ASSERT_EQ(base.ranks[i].join_index, other.ranks[i].join_index);
  }
}

}  // namespace
