// The out-of-band channel (channel.h) on a private directory: creation and checks, several
// processes meeting in one segment, and the segments it must refuse or mark broken.
#include "channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "op_exchange.h"
#include "process_info.h"

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

// The file a path names now (0: none), to tell a replaced file from the one that was there.
ino_t inode_of(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A forked process that runs `body` (0: it went well), reports its result, then stays alive
// until released (SIGKILL, then reaped): a channel's creator or member that lives while the
// test looks.
class Kid {
 public:
  explicit Kid(const std::function<int()>& body) {
    int ready[2];
    if (pipe(ready) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      const char code = static_cast<char>(body());
      if (write(ready[1], &code, 1) != 1) _exit(4);
      for (;;) pause();
    }
    close(ready[1]);
    ready_ = ready[0];
  }
  ~Kid() {
    release();
    if (ready_ >= 0) close(ready_);
  }
  // body's result, -1 when the process died first (or was never forked).
  int wait_ready() {
    char code;
    return ready_ >= 0 && read(ready_, &code, 1) == 1 ? code : -1;
  }
  // Kills and reaps it: its pid is then gone.
  void release() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int ready_ = -1;
};

// The file a rank killed during set-up leaves, held open by the test so that its inode number
// is not reused by the file that replaces it.
struct StaleFile {
  int fd = -1;
  ino_t ino = 0;
  ~StaleFile() {
    if (fd >= 0) close(fd);
  }
};

// Leaves the file of a channel of `shape` in `dir` as a rank killed during set-up does: made,
// `slot` published (none when negative), then the process SIGKILLed and reaped before any
// freeze.
void leave_stale_channel(const std::string& dir, const zc::ChannelShape& shape, int slot,
                         StaleFile* out) {
  Kid dead([&] {
    const char* why = nullptr;
    auto c = zc::Channel::open(dir, kKey, shape, &why);
    if (!c) return 1;
    if (slot >= 0) {
      zc::MemberFacts m;
      m.join_index = static_cast<uint32_t>(slot);
      m.pid = getpid();
      m.start_time = zc::process_start_time(getpid());
      c->publish(m);
    }
    c.release();  // its name stays
    return 0;
  });
  ASSERT_EQ(dead.wait_ready(), 0);
  dead.release();
  const std::string path = dir + "/zerocta-" + kKey.hex();
  out->fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(out->fd, 0) << "no file left behind";
  out->ino = inode_of(path);
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

// Every process that races to open one channel ends up in the one segment at its name. The
// racers stay alive while it is read (a file whose creator is gone would be replaced).
void expect_racers_meet(const std::string& dir, int procs, uint32_t first_slot) {
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<std::unique_ptr<Kid>> kids;
  for (int i = 0; i < procs; ++i)
    kids.emplace_back(new Kid([&, i] {
      char b;
      close(go[1]);
      if (read(go[0], &b, 1) != 0) return 3;  // released together by the close below
      const char* why = nullptr;
      auto c = zc::Channel::open(dir, kKey, shape(static_cast<uint32_t>(procs) + first_slot), &why);
      if (!c) return 1;
      zc::MemberFacts m;
      m.join_index = first_slot + static_cast<uint32_t>(i);
      m.pid = getpid();
      m.start_time = zc::process_start_time(getpid());
      c->publish(m);
      c.release();  // keep the name: the test reads the result
      return 0;
    }));
  close(go[0]);
  close(go[1]);
  for (auto& k : kids) ASSERT_EQ(k->wait_ready(), 0);
  EXPECT_EQ(zc::channel_entries(dir), 1);
  const char* why = nullptr;
  auto c = zc::Channel::open(dir, kKey, shape(static_cast<uint32_t>(procs) + first_slot), &why);
  ASSERT_TRUE(c) << why;
  EXPECT_EQ(c->broken(), 0u);
  const auto m = c->members();
  ASSERT_EQ(m.size(), static_cast<size_t>(procs));
  for (int i = 0; i < procs; ++i)
    EXPECT_EQ(m[static_cast<size_t>(i)].join_index, first_slot + static_cast<uint32_t>(i));
}

TEST_F(ChannelTest, ProcessesRacingToCreateMeetInOneSegment) {
  constexpr int kProcs = 8;
  expect_racers_meet(dir_, kProcs, 0);
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

// A member gone from a channel whose creator lives: the channel is kept, and broken.
TEST_F(ChannelTest, AMemberLeftByADeadProcessMarksTheChannelBroken) {
  const char* why = nullptr;
  auto creator = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(creator) << why;
  Kid member([&] {
    auto c = zc::Channel::open(dir_, kKey, shape(2), &why);
    if (!c) return 1;
    zc::MemberFacts m;
    m.join_index = 1;
    m.pid = getpid();
    c->publish(m);
    c.release();  // killed during set-up: its member stays
    return 0;
  });
  ASSERT_EQ(member.wait_ready(), 0);
  member.release();
  auto c = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(c) << why;
  EXPECT_EQ(c->members().size(), 1u) << "the creator's own segment, not a fresh one";
  EXPECT_NE(c->broken(), 0u);
}

// A rank killed between creating its channel and the freeze leaves the file behind: the next
// process to open that name removes it and makes a fresh one, which others then join.
TEST_F(ChannelTest, AFileLeftByADeadCreatorIsReplacedByTheNextOpener) {
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  StaleFile stale;
  ASSERT_NO_FATAL_FAILURE(leave_stale_channel(dir_, shape(2), /*slot=*/0, &stale));
  const char* why = nullptr;
  auto first = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(first) << why;
  EXPECT_NE(inode_of(path), stale.ino);
  EXPECT_EQ(zc::channel_entries(dir_), 1);
  EXPECT_EQ(first->broken(), 0u) << "the dead rank's member came along";
  EXPECT_TRUE(first->members().empty());
  auto second = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(second) << why;
  first->publish(facts(0));
  second->publish(facts(1));
  EXPECT_EQ(first->members().size(), 2u) << "the two openers are not in one channel";
  EXPECT_EQ(first->broken(), 0u);
}

// The same id used again by a job of another size (NCCL_COMM_ID fixed): the dead job's file is
// of another shape, which only its creator's death allows to replace.
TEST_F(ChannelTest, AStaleFileOfAnotherShapeIsReplaced) {
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  StaleFile stale;
  ASSERT_NO_FATAL_FAILURE(leave_stale_channel(dir_, shape(4), /*slot=*/-1, &stale));
  const off_t stale_bytes = file_size(path);
  const char* why = nullptr;
  auto first = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(first) << why;
  EXPECT_NE(inode_of(path), stale.ino);
  EXPECT_LT(file_size(path), stale_bytes) << "not a channel of 2";
  auto second = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(second) << why;
  second->publish(facts(1));
  EXPECT_EQ(first->members().size(), 1u);
}

// A live creator's file is never removed, whatever a later opener thinks of it; once its
// creator is gone, it is.
TEST_F(ChannelTest, ALiveCreatorsFileStaysUntilItsCreatorIsGone) {
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  Kid creator([&] {
    const char* why = nullptr;
    auto c = zc::Channel::open(dir_, kKey, shape(4), &why);
    if (!c) return 1;
    c.release();
    return 0;
  });
  ASSERT_EQ(creator.wait_ready(), 0);
  const ino_t live = inode_of(path);
  const char* why = nullptr;
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(2), &why)) << "another shape, a live creator";
  EXPECT_NE(std::string(why).find("foreign"), std::string::npos) << why;
  EXPECT_EQ(inode_of(path), live);
  auto joined = zc::Channel::open(dir_, kKey, shape(4), &why);
  ASSERT_TRUE(joined) << why;
  EXPECT_EQ(inode_of(path), live);
  creator.release();
  auto fresh = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(fresh) << why;
  const ino_t replaced = inode_of(path);
  EXPECT_NE(replaced, live);
  // The old channel's last holder drops it (a freeze or a teardown): the name is no longer its
  // own, so the fresh channel keeps it.
  joined.reset();
  EXPECT_EQ(inode_of(path), replaced) << "the old channel's unlink removed the fresh one";
}

// Removing a frozen channel's name removes only that channel's: another linked at the name
// since (after a stale file's removal) stays.
TEST_F(ChannelTest, UnlinkingANameSparesTheFileThatReplacedIt) {
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  const char* why = nullptr;
  auto old_channel = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(old_channel) << why;
  ASSERT_EQ(unlink(path.c_str()), 0);  // as a stale file's remover does
  auto fresh = zc::Channel::open(dir_, kKey, shape(2), &why);
  ASSERT_TRUE(fresh) << why;
  const ino_t fresh_ino = inode_of(path);
  old_channel->unlink_name();
  EXPECT_EQ(inode_of(path), fresh_ino);
  fresh->unlink_name();
  EXPECT_EQ(inode_of(path), 0u);
}

// Openers racing over one stale file remove it once and all meet in the one fresh channel.
TEST_F(ChannelTest, OpenersRacingOverAStaleFileMeetInOneFreshChannel) {
  constexpr int kProcs = 8;
  StaleFile stale;
  ASSERT_NO_FATAL_FAILURE(leave_stale_channel(dir_, shape(kProcs + 1), /*slot=*/0, &stale));
  // Slot 0 stays the dead rank's: a racer that joined the stale file would bring it along.
  expect_racers_meet(dir_, kProcs, /*first_slot=*/1);
}

// Another user's file is never removed, even with its creator gone: it may not be ours to
// judge (and a sticky /dev/shm would refuse anyway). Once it is ours, it is replaced.
TEST_F(ChannelTest, AnotherUsersStaleFileIsNeverRemoved) {
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  StaleFile stale;
  ASSERT_NO_FATAL_FAILURE(leave_stale_channel(dir_, shape(2), /*slot=*/-1, &stale));
  constexpr uid_t kNobody = 65534;
  if (geteuid() == kNobody || chown(path.c_str(), kNobody, static_cast<gid_t>(-1)) != 0)
    GTEST_SKIP() << "cannot give the file to another user here: " << strerror(errno);
  const char* why = nullptr;
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(2), &why));
  EXPECT_NE(std::string(why).find("foreign"), std::string::npos) << why;
  EXPECT_EQ(inode_of(path), stale.ino);
  ASSERT_EQ(chown(path.c_str(), geteuid(), static_cast<gid_t>(-1)), 0);
  auto fresh = zc::Channel::open(dir_, kKey, shape(2), &why);
  EXPECT_TRUE(fresh) << why;
  EXPECT_NE(inode_of(path), stale.ino);
  EXPECT_NE(inode_of(path), 0u);
}

// A creator recorded in another pid namespace (a container sharing /dev/shm) cannot be judged
// from here: its pid means nothing in this namespace. Its file stays.
TEST_F(ChannelTest, ACreatorOfAnotherPidNamespaceIsNeverJudgedGone) {
  const std::string path = dir_ + "/zerocta-" + kKey.hex();
  StaleFile stale;
  ASSERT_NO_FATAL_FAILURE(leave_stale_channel(dir_, shape(4), /*slot=*/-1, &stale));
  struct stat ns_file;
  if (stat("/proc/self/ns/pid", &ns_file) != 0) GTEST_SKIP() << "no /proc/self/ns/pid here";
  const uint64_t here = ns_file.st_ino;
  // The header's creator_pid_ns word (channel.cc's Header, version 6).
  constexpr off_t kCreatorPidNsOffset = 64;
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint64_t ns = 0;
  ASSERT_EQ(pread(fd, &ns, sizeof ns, kCreatorPidNsOffset), 8);
  ASSERT_EQ(ns, here) << "the header's layout moved: update the offset";
  const uint64_t elsewhere = here + 1;
  ASSERT_EQ(pwrite(fd, &elsewhere, sizeof elsewhere, kCreatorPidNsOffset), 8);
  const char* why = nullptr;
  EXPECT_FALSE(zc::Channel::open(dir_, kKey, shape(2), &why));
  EXPECT_EQ(inode_of(path), stale.ino);
  ASSERT_EQ(pwrite(fd, &here, sizeof here, kCreatorPidNsOffset), 8);
  close(fd);
  auto fresh = zc::Channel::open(dir_, kKey, shape(2), &why);
  EXPECT_TRUE(fresh) << why;
  EXPECT_NE(inode_of(path), stale.ino);
  EXPECT_NE(inode_of(path), 0u);
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
