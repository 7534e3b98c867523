// The out-of-band channel (channel.h) on a private directory: creation and checks, several
// processes meeting in one segment, and the segments it must refuse or mark broken.
#include "channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "op_exchange.h"

namespace {

class ChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/zerocta-channel-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
  zc::MemberFacts facts(uint32_t index) const {
    zc::MemberFacts m;
    m.join_index = index;
    m.pid = getpid();
    m.fingerprint = 0xabc;
    snprintf(m.fd_address, sizeof m.fd_address, "addr-%u", index);
    return m;
  }
  std::string dir_;
};

const zc::CommKey kKey{0x1111, 0x2222};

// A channel with room in the op exchange for every slot.
zc::ChannelShape shape(uint32_t n) { return zc::ChannelShape{n, n}; }

off_t file_size(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

TEST_F(ChannelTest, OpRoomIsSizedByItsOwnCountNotBySlots) {
  // A child of a 64-rank parent in auto mode with ZEROCTA_AUTO_MAX_RANKS=2: 64 slots, op room
  // for 2 ranks. Its file is a fraction of one with room for all 64, and a rank that computed
  // another room cannot open it.
  const char* why = nullptr;
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  auto small = zc::Channel::open(dir_, kKey, zc::ChannelShape{64, 2}, &why);
  ASSERT_TRUE(small) << why;
  EXPECT_EQ(small->op_region_ranks(), 2u);
  EXPECT_EQ(small->op_region_bytes(), zc::OpExchange::region_bytes(2));
  const off_t small_bytes = file_size(path);
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, zc::ChannelShape{64, 8}, &why));
  small->unlink_name();
  auto full = zc::Channel::open(dir_, kKey, shape(64), &why);
  ASSERT_TRUE(full) << why;
  EXPECT_EQ(full->op_region_ranks(), 64u);
  EXPECT_LT(small_bytes * 10, file_size(path)) << "the room for 62 more ranks dominates";
  full->unlink_name();
  // Room beyond the slots or beyond what the exchange serves is refused.
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, zc::ChannelShape{2, 4}, &why));
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, zc::ChannelShape{128, 128}, &why));
}

TEST_F(ChannelTest, CreatesAPrivateSegmentAndLeavesNothingBehind) {
  const char* why = nullptr;
  auto c = zc::Channel::open(dir_, kKey, shape(4), &why);
  ASSERT_TRUE(c) << why;
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/" + c->name()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(zc::channel_entries(dir_), 1);  // no temporary name left over
  c->publish(facts(2));
  auto m = c->members();
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].join_index, 2u);
  EXPECT_STREQ(m[0].fd_address, "addr-2");
  c->unlink_name();
  EXPECT_EQ(zc::channel_entries(dir_), 0);
  EXPECT_EQ(c->members().size(), 1u);  // the mapping outlives the name
  c.reset();
  EXPECT_EQ(zc::channel_entries(dir_), 0);
}

TEST_F(ChannelTest, ProcessesRacingToCreateMeetInOneSegment) {
  constexpr int kProcs = 8;
  std::vector<pid_t> kids;
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  for (int i = 0; i < kProcs; ++i) {
    pid_t p = fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
      char b;
      close(go[1]);
      if (read(go[0], &b, 1) != 0) _exit(3);  // released together by the close below
      const char* why = nullptr;
      auto c = zc::Channel::open(dir_, kKey, shape(kProcs), &why);
      if (!c) _exit(1);
      c->publish(facts(static_cast<uint32_t>(i)));
      c.release();  // keep the name: the parent reads the result
      _exit(0);
    }
    kids.push_back(p);
  }
  close(go[0]);
  close(go[1]);
  for (pid_t p : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(p, &status, 0), p);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  EXPECT_EQ(zc::channel_entries(dir_), 1);
  const char* why = nullptr;
  auto c = zc::Channel::open(dir_, kKey, shape(kProcs), &why);
  ASSERT_TRUE(c) << why;
  const auto m = c->members();
  ASSERT_EQ(m.size(), static_cast<size_t>(kProcs));
  for (int i = 0; i < kProcs; ++i) EXPECT_EQ(m[static_cast<size_t>(i)].join_index, i);
}

TEST_F(ChannelTest, RefusesSegmentsItDidNotMake) {
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  const char* why = nullptr;
  // Readable by others.
  int fd = ::open(path.c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0644), 0);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  close(fd);
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(4), &why));
  EXPECT_NE(std::string(why).find("foreign"), std::string::npos) << why;
  // Private but of another size (ranks disagree on nranks, or garbage).
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(4), &why));
  // The right size, but not our header.
  ASSERT_EQ(unlink(path.c_str()), 0);
  {
    auto real = zc::Channel::open(dir_, kKey, shape(4), &why);
    ASSERT_TRUE(real);
    real.release();  // leaves a well-formed segment of capacity 4 behind
  }
  fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "garbage!", 8, 0), 8);
  close(fd);
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(4), &why));
  EXPECT_NE(std::string(why).find("corrupt"), std::string::npos) << why;
  // A symbolic link in its place.
  ASSERT_EQ(unlink(path.c_str()), 0);
  ASSERT_EQ(symlink("/etc/passwd", path.c_str()), 0);
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(4), &why));
  ASSERT_EQ(unlink(path.c_str()), 0);
}

// A rank of another zerocta version lays the segment out otherwise (the op region's posts, for
// one): where the size happens to match, the version word still refuses it, and the ranks pass
// through rather than read each other's posts wrongly.
TEST_F(ChannelTest, RefusesASegmentOfAnotherVersion) {
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  const char* why = nullptr;
  {
    auto real = zc::Channel::open(dir_, kKey, shape(4), &why);
    ASSERT_TRUE(real);
    real.release();
  }
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint32_t version = 0;
  ASSERT_EQ(pread(fd, &version, sizeof version, 8), 4);  // after the 8-byte magic
  ++version;
  ASSERT_EQ(pwrite(fd, &version, sizeof version, 8), 4);
  close(fd);
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(4), &why));
  EXPECT_NE(std::string(why).find("another zerocta version"), std::string::npos) << why;
  ASSERT_EQ(unlink(path.c_str()), 0);
}

TEST_F(ChannelTest, AMemberLeftByADeadProcessMarksTheChannelBroken) {
  const char* why = nullptr;
  pid_t p = fork();
  ASSERT_GE(p, 0);
  if (p == 0) {
    auto c = zc::Channel::open(dir_, kKey, shape(2), &why);
    if (!c) _exit(1);
    zc::MemberFacts m;
    m.join_index = 0;
    m.pid = getpid();
    c->publish(m);
    c.release();  // killed during set-up: the name stays
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(p, &status, 0), p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto c = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(c) << why;
  EXPECT_NE(c->broken(), 0u);
}

TEST_F(ChannelTest, ASlotClaimedTwiceMarksTheChannelBroken) {
  const char* why = nullptr;
  auto a = zc::Channel::open(dir_, kKey, shape(2), &why);
  auto b = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(a && b);
  a->publish(facts(1));
  EXPECT_EQ(a->broken(), 0u);
  b->publish(facts(1));
  EXPECT_NE(a->broken(), 0u);
  b->publish(facts(7));  // outside the capacity
  EXPECT_EQ(a->members().size(), 1u);
}

TEST_F(ChannelTest, ThePoisonWordReachesEveryMember) {
  const char* why = nullptr;
  auto a = zc::Channel::open(dir_, kKey, shape(2), &why);
  auto b = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->poisoned(), 0);
  a->poison(5);
  a->poison(6);  // the first error stays
  EXPECT_EQ(b->poisoned(), 5);
}

TEST_F(ChannelTest, ADirectoryThatCannotHoldItIsAFailedJoin) {
  const char* why = nullptr;
  EXPECT_FALSE(zc::Channel::open("/nonexistent/zerocta", kKey, shape(2), &why));
  ASSERT_NE(why, nullptr);
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(0), &why));
}

}  // namespace
