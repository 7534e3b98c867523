// Communicator keys (comm_key.h): SipHash against the paper's vectors, and the properties the
// channel's names rely on: equal inputs give equal keys, every instance its own key, no raw
// id bytes in the name.
#include "comm_key.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

namespace {

TEST(CommKey, SipHashMatchesTheReferenceVectors) {
  // SipHash-2-4 paper, key 00..0f, messages 00..(n-1): outputs for n = 0, 1, 8, 15, 63.
  unsigned char key[16], msg[64];
  for (int i = 0; i < 16; ++i) key[i] = static_cast<unsigned char>(i);
  for (int i = 0; i < 64; ++i) msg[i] = static_cast<unsigned char>(i);
  uint64_t k0, k1;
  memcpy(&k0, key, 8);
  memcpy(&k1, key + 8, 8);
  EXPECT_EQ(zc::siphash24(msg, 0, k0, k1), 0x726fdb47dd0e0e31ull);
  EXPECT_EQ(zc::siphash24(msg, 1, k0, k1), 0x74f839c593dc67fdull);
  EXPECT_EQ(zc::siphash24(msg, 8, k0, k1), 0x93f5f5799a932462ull);
  EXPECT_EQ(zc::siphash24(msg, 15, k0, k1), 0xa129ca6149be45e5ull);
  EXPECT_EQ(zc::siphash24(msg, 63, k0, k1), 0x958a324ceb064572ull);
}

ncclUniqueId id_with(unsigned char fill) {
  ncclUniqueId id;
  memset(&id, fill, sizeof id);
  return id;
}

TEST(CommKey, TheSameIdNamesANewInstanceEachTime) {
  zc::reset_key_counts();
  const ncclUniqueId a = id_with(1);
  const zc::CommKey first = zc::key_for_init(&a, 1, 0);
  const zc::CommKey second = zc::key_for_init(&a, 1, 0);  // NCCL_COMM_ID: the same id again
  EXPECT_FALSE(first == second);
  // Another process (here: counts reset, as in a fresh rank) names them alike, in order.
  zc::reset_key_counts();
  EXPECT_TRUE(zc::key_for_init(&a, 1, 0) == first);
  EXPECT_TRUE(zc::key_for_init(&a, 1, 0) == second);
}

TEST(CommKey, RanksOfOneCommunicatorInOneProcessShareItsKey) {
  // One thread creating a communicator per GPU: rank 0 and rank 1 of the same instance.
  zc::reset_key_counts();
  const ncclUniqueId a = id_with(3);
  const zc::CommKey r0 = zc::key_for_init(&a, 1, 0);
  EXPECT_TRUE(zc::key_for_init(&a, 1, 1) == r0);
  const zc::CommKey next = zc::key_for_init(&a, 1, 0);  // the next communicator of that id
  EXPECT_FALSE(next == r0);
  EXPECT_TRUE(zc::key_for_init(&a, 1, 1) == next);
}

TEST(CommKey, DifferentIdsAndIdListsGiveDifferentKeys) {
  zc::reset_key_counts();
  const ncclUniqueId ids[2] = {id_with(1), id_with(2)};
  std::set<std::string> seen;
  seen.insert(zc::key_for_init(&ids[0], 1, 0).hex());
  seen.insert(zc::key_for_init(&ids[1], 1, 0).hex());
  seen.insert(zc::key_for_init(ids, 2, 0).hex());  // InitRankScalable's list is its own identity
  EXPECT_EQ(seen.size(), 3u);
}

TEST(CommKey, ChildrenDependOnOrdinalColorAndExcludeSet) {
  const zc::CommKey parent{0x1234, 0x5678};
  std::set<std::string> seen;
  for (uint64_t ordinal : {0, 1})
    for (int color : {0, 1, 7}) seen.insert(zc::key_for_split(parent, ordinal, color).hex());
  EXPECT_EQ(seen.size(), 6u);
  EXPECT_TRUE(zc::key_for_split(parent, 3, 1) == zc::key_for_split(parent, 3, 1));
  // A shrink's exclude list is a set: its order on the caller's side does not matter.
  EXPECT_TRUE(zc::key_for_shrink(parent, 2, {3, 1}) == zc::key_for_shrink(parent, 2, {1, 3}));
  EXPECT_FALSE(zc::key_for_shrink(parent, 2, {1}) == zc::key_for_shrink(parent, 2, {1, 3}));
  EXPECT_FALSE(zc::key_for_shrink(parent, 2, {1}) == zc::key_for_split(parent, 2, 1));
}

// What a channel directory shows of a communicator to anyone: the hex of its name, parsed back.
zc::CommKey key_from_name(const zc::CommKey& k) {
  const std::string hex = k.hex();  // hi, then lo
  zc::CommKey seen;
  seen.hi = strtoull(hex.substr(0, 16).c_str(), nullptr, 16);
  seen.lo = strtoull(hex.substr(16).c_str(), nullptr, 16);
  return seen;
}

// Another local user who reads a parent's channel name must not be able to compute its
// children's names (and create files there first: the ranks would silently pass through).
TEST(CommKey, AChildsNameCannotBeComputedFromItsParentsName) {
  zc::reset_key_counts();
  const ncclUniqueId id = id_with(5);
  const zc::CommKey parent = zc::key_for_init(&id, 1, 0);
  const zc::CommKey seen = key_from_name(parent);
  ASSERT_EQ(seen.hex(), parent.hex());
  for (uint64_t ordinal : {0, 1})
    for (int color : {0, 1})
      EXPECT_FALSE(zc::key_for_split(seen, ordinal, color) ==
                   zc::key_for_split(parent, ordinal, color))
          << "split " << ordinal << " color " << color;
  EXPECT_FALSE(zc::key_for_shrink(seen, 0, {1}) == zc::key_for_shrink(parent, 0, {1}));
  // Nor a grandchild's from its parent's.
  const zc::CommKey child = zc::key_for_split(parent, 0, 0);
  EXPECT_FALSE(zc::key_for_split(key_from_name(child), 0, 0) == zc::key_for_split(child, 0, 0));
}

// Two jobs whose parents had one name but whose unique ids differ name their children apart:
// the ids' secret, not the parent's name, decides; and every rank of one job agrees.
TEST(CommKey, ChildrenFollowTheJobsIdsNotThePublicName) {
  zc::reset_key_counts();
  const ncclUniqueId job_a = id_with(7), job_b = id_with(8);
  const zc::CommKey a = zc::key_for_init(&job_a, 1, 0);
  zc::CommKey forged = zc::key_for_init(&job_b, 1, 0);
  forged.lo = a.lo;  // job b's parent, under job a's public name
  forged.hi = a.hi;
  EXPECT_FALSE(zc::key_for_split(forged, 0, 0) == zc::key_for_split(a, 0, 0));
  EXPECT_FALSE(zc::key_for_shrink(forged, 0, {2}) == zc::key_for_shrink(a, 0, {2}));
  zc::reset_key_counts();  // another rank of job a, in another process
  const zc::CommKey a_elsewhere = zc::key_for_init(&job_a, 1, 1);
  EXPECT_TRUE(zc::key_for_split(a_elsewhere, 0, 0) == zc::key_for_split(a, 0, 0));
  EXPECT_TRUE(zc::key_for_shrink(a_elsewhere, 0, {2}) == zc::key_for_shrink(a, 0, {2}));
}

TEST(CommKey, TheNameHidesTheIdBytes) {
  zc::reset_key_counts();
  ncclUniqueId id = id_with(0);
  const char addr[] = "10.1.2.3:29500";  // what a bootstrap root's address looks like
  memcpy(id.internal, addr, sizeof addr);
  const std::string hex = zc::key_for_init(&id, 1, 0).hex();
  EXPECT_EQ(hex.size(), 32u);
  for (char c : hex) EXPECT_TRUE(isxdigit(static_cast<unsigned char>(c))) << hex;
  char raw[8];
  snprintf(raw, sizeof raw, "%02x%02x%02x", addr[0], addr[1], addr[2]);
  EXPECT_EQ(hex.find(raw), std::string::npos);
}

}  // namespace
