// The fd exchange (src/channel/fd_exchange.h) on the CPU: memfd descriptors stand in for exported
// cuMem handles, and identity is checked through content written on one side and read on
// the other, or through fstat's inode. Covers the service in this process, a forked child
// as client, the 253-per-message split, unknown and withdrawn tokens, malformed input from
// raw clients, silent clients, credentials (pid, and another uid when run as root), a fake
// service that answers wrongly, close-on-exec of every descriptor, the service thread's
// name and signal mask, concurrency (meant for `make tsan` too) and exit with the service
// running.
#include "fd_exchange.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using zc::fd_fetch;
using zc::fd_probe;
using zc::FdService;
namespace wire = zc::fd_wire;

constexpr int kTimeoutMs = 5000;
constexpr const char* kExitChildEnv = "ZCTEST_FD_EXIT_CHILD";

int64_t elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               since)
      .count();
}

int make_memfd(const std::string& content) {
  const int fd = memfd_create("fdx-test", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (pwrite(fd, content.data(), content.size(), 0) != ssize_t(content.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string content_of(int fd) {
  char buf[256];
  const ssize_t n = pread(fd, buf, sizeof(buf), 0);
  return n < 0 ? std::string("<pread failed>") : std::string(buf, size_t(n));
}

ino_t inode_of(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

bool has_cloexec(int fd) {
  const int flags = fcntl(fd, F_GETFD);
  return flags >= 0 && (flags & FD_CLOEXEC) != 0;
}

// How many descriptors of this process refer to the file with this inode.
int count_open(ino_t ino) {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    struct stat st;
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (stat(path.c_str(), &st) == 0 && st.st_ino == ino && S_ISREG(st.st_mode)) ++count;
  }
  closedir(dir);
  return count;
}

void close_all(std::vector<int>* fds) {
  for (int& fd : *fds) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

FdService* service() { return zc::fd_service(); }

socklen_t abstract_addr(const std::string& name, sockaddr_un* sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path + 1, name.data(), name.size());
  return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// A plain blocking client socket connected to `name`, with a receive timeout.
int raw_connect(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un sa;
  const socklen_t len = abstract_addr(name, &sa);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A listening abstract socket nobody serves unless a test does.
int raw_listen(const std::string& name) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un sa;
  const socklen_t len = abstract_addr(name, &sa);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), len) != 0 || listen(fd, 8) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string unique_name(const char* what) {
  static std::atomic<int> n{0};
  return "zerocta-test-" + std::to_string(getpid()) + "-" + what + "-" + std::to_string(n++);
}

bool send_bytes(int fd, const std::vector<uint8_t>& bytes, int pass_fd = -1) {
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  return sendmsg(fd, &msg, MSG_NOSIGNAL) == ssize_t(bytes.size());
}

// The next thing the peer does on `fd` within timeout_ms: "closed" (EOF or reset),
// "data", or "nothing".
std::string next_event(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return "nothing";
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno == ECONNRESET)) return "closed";
  return n > 0 ? "data" : "nothing";
}

std::vector<uint8_t> header(uint32_t magic, uint16_t version, uint16_t kind, uint32_t count,
                            uint32_t reserved = 0) {
  const wire::Header h{magic, version, kind, count, reserved};
  std::vector<uint8_t> bytes(sizeof(h));
  memcpy(bytes.data(), &h, sizeof(h));
  return bytes;
}

std::vector<uint8_t> request(const std::vector<uint64_t>& tokens) {
  std::vector<uint8_t> bytes =
      header(wire::kMagic, wire::kVersion, wire::kRequest, uint32_t(tokens.size()));
  const size_t at = bytes.size();
  bytes.resize(at + tokens.size() * sizeof(uint64_t));
  if (!tokens.empty()) memcpy(bytes.data() + at, tokens.data(), tokens.size() * sizeof(uint64_t));
  return bytes;
}

// Publishes a memfd holding `content`; the test's own descriptor is closed, so only the
// service's kept duplicate remains.
uint64_t publish_content(const std::string& content, ino_t* ino = nullptr) {
  const int fd = make_memfd(content);
  if (fd < 0) return 0;
  if (ino != nullptr) *ino = inode_of(fd);
  const uint64_t token = service()->publish(fd);
  close(fd);
  return token;
}

// ---------------------------------------------------------------------------------------

TEST(FdExchange, AddressIsAbstractAndFits) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(zc::fd_service(), s);
  const std::string address = s->address();
  ASSERT_LT(address.size(), zc::kFdAddressMax);
  const std::string prefix =
      "zerocta-" + std::to_string(geteuid()) + "-" + std::to_string(getpid()) + "-";
  ASSERT_EQ(address.compare(0, prefix.size(), prefix), 0) << address;
  const std::string suffix = address.substr(prefix.size());
  ASSERT_EQ(suffix.size(), 16u) << address;
  EXPECT_EQ(suffix.find_first_not_of("0123456789abcdef"), std::string::npos) << address;

  // The kernel lists it as an abstract name ('@'), and no file of that name exists.
  FILE* f = fopen("/proc/net/unix", "r");
  ASSERT_NE(f, nullptr);
  char line[512];
  bool listed = false;
  while (fgets(line, sizeof(line), f) != nullptr)
    if (strstr(line, ("@" + address + "\n").c_str()) != nullptr) listed = true;
  fclose(f);
  EXPECT_TRUE(listed) << "@" << address << " not in /proc/net/unix";
  EXPECT_NE(access(address.c_str(), F_OK), 0);
}

TEST(FdExchange, SameProcessPublishFetch) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  const int original = make_memfd("hello from the publisher");
  ASSERT_GE(original, 0);
  const uint64_t token = s->publish(original);
  ASSERT_NE(token, 0u);
  EXPECT_EQ(s->publish(-1), 0u);

  std::vector<int> fds;
  const char* why = nullptr;
  ASSERT_TRUE(fd_fetch(s->address(), getpid(), &token, 1, &fds, kTimeoutMs, &why)) << why;
  ASSERT_EQ(fds.size(), 1u);
  ASSERT_GE(fds[0], 0);
  EXPECT_NE(fds[0], original);
  EXPECT_TRUE(has_cloexec(fds[0]));
  EXPECT_EQ(inode_of(fds[0]), inode_of(original));
  EXPECT_EQ(content_of(fds[0]), "hello from the publisher");
  // Same open file: a write through the fetched descriptor shows through the original.
  ASSERT_EQ(pwrite(fds[0], "HELLO", 5, 0), 5);
  EXPECT_EQ(content_of(original), "HELLO from the publisher");
  close_all(&fds);

  // The service keeps its own duplicate: the publisher may close its descriptor.
  const ino_t ino = inode_of(original);
  close(original);
  ASSERT_TRUE(fd_fetch(s->address(), 0, &token, 1, &fds, kTimeoutMs, &why)) << why;
  ASSERT_GE(fds[0], 0);
  EXPECT_EQ(inode_of(fds[0]), ino);
  EXPECT_EQ(content_of(fds[0]), "HELLO from the publisher");
  close_all(&fds);
  s->withdraw(token);
}

TEST(FdExchange, UnknownAndWithdrawnTokensAnswerMinusOne) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  ino_t ino_a = 0, ino_b = 0;
  const uint64_t a = publish_content("token a", &ino_a);
  const uint64_t b = publish_content("token b", &ino_b);
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  ASSERT_NE(a, b);
  EXPECT_EQ(count_open(ino_b), 1);  // the service's kept duplicate
  s->withdraw(b);
  EXPECT_EQ(count_open(ino_b), 0);  // withdraw closed it
  s->withdraw(b);                   // twice, and unknown tokens: ignored
  s->withdraw(0);

  const std::vector<uint64_t> tokens = {a, b, 0, a ^ 0x5a5a5a5a00000000ull, a};
  std::vector<int> fds;
  const char* why = nullptr;
  ASSERT_TRUE(
      fd_fetch(s->address(), getpid(), tokens.data(), tokens.size(), &fds, kTimeoutMs, &why))
      << why;
  ASSERT_EQ(fds.size(), tokens.size());
  ASSERT_GE(fds[0], 0);
  EXPECT_EQ(fds[1], -1);
  EXPECT_EQ(fds[2], -1);
  EXPECT_EQ(fds[3], -1);
  ASSERT_GE(fds[4], 0);
  EXPECT_NE(fds[0], fds[4]);
  EXPECT_EQ(inode_of(fds[0]), ino_a);
  EXPECT_EQ(inode_of(fds[4]), ino_a);
  EXPECT_EQ(content_of(fds[4]), "token a");
  close_all(&fds);
  s->withdraw(a);

  // Withdrawn after a successful fetch: the next fetch answers -1.
  ASSERT_TRUE(fd_fetch(s->address(), getpid(), &a, 1, &fds, kTimeoutMs, &why)) << why;
  EXPECT_EQ(fds[0], -1);
  EXPECT_EQ(count_open(ino_a), 0);
}

// The status query answers what a fetch would find, without sending a descriptor: a process
// that imported a peer's allocation learns from it that the peer freed (withdrew) it.
TEST(FdExchange, PublishedAnswersWithoutDescriptors) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  ino_t ino_a = 0, ino_b = 0;
  const uint64_t a = publish_content("status a", &ino_a);
  const uint64_t b = publish_content("status b", &ino_b);
  s->withdraw(b);
  std::vector<uint64_t> tokens = {a, b, 0, a};
  for (size_t i = 0; i < 2 * zc::kFdMaxPerMessage; ++i) tokens.push_back(i % 2 ? a : b);
  std::vector<bool> published;
  const char* why = nullptr;
  ASSERT_TRUE(zc::fd_published(s->address(), getpid(), tokens.data(), tokens.size(), &published,
                               kTimeoutMs, &why))
      << why;
  ASSERT_EQ(published.size(), tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i)
    EXPECT_EQ(published[i], tokens[i] == a) << "token " << i;
  EXPECT_EQ(count_open(ino_a), 1) << "a descriptor came with the statuses (only the service's "
                                     "own duplicate may be open)";

  s->withdraw(a);
  ASSERT_TRUE(zc::fd_published(s->address(), getpid(), &a, 1, &published, kTimeoutMs, &why));
  EXPECT_FALSE(published[0]);
  // A service that is not there: false, every answer "not published".
  EXPECT_FALSE(zc::fd_published("zerocta-nobody-1-0000000000000000", 0, tokens.data(), 3,
                                &published, 200, &why));
  EXPECT_EQ(published, std::vector<bool>(3, false));
}

// FABRIC handles (cuMem memory of an IMEX node) are bytes, not descriptors: published as blobs,
// fetched inline from another process, known to the status query, gone once withdrawn; a
// descriptor's token is no blob and a blob's token no descriptor.
TEST(FdExchange, BlobsArriveInlineInAnotherProcessAndNeverAsDescriptors) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  zc::FdBlob blob{};
  for (size_t i = 0; i < zc::kFdBlobBytes; ++i) blob.bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  const uint64_t b = s->publish_blob(blob);
  ASSERT_NE(b & zc::kFdBlobToken, 0u);
  ino_t ino = 0;
  const uint64_t f = publish_content("a descriptor", &ino);
  ASSERT_EQ(f & zc::kFdBlobToken, 0u);
  const std::string address = s->address();
  const int parent = getpid();

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // 600 tokens: three messages, the blob among unknown and descriptor tokens.
    std::vector<uint64_t> tokens;
    for (size_t i = 0; i < 600; ++i) tokens.push_back(i % 3 == 0 ? b : i % 3 == 1 ? f : 12345);
    std::vector<zc::FdBlob> blobs;
    std::vector<bool> found;
    const char* why = nullptr;
    if (!zc::fd_fetch_blobs(address.c_str(), parent, tokens.data(), tokens.size(), &blobs,
                            &found, kTimeoutMs, &why))
      _exit(10);
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (found[i] != (i % 3 == 0)) _exit(11);
      const zc::FdBlob& want = found[i] ? blob : zc::FdBlob{};
      if (memcmp(blobs[i].bytes, want.bytes, zc::kFdBlobBytes) != 0) _exit(12);
    }
    std::vector<int> fds;  // a blob's token fetched as a descriptor: unknown
    if (!fd_fetch(address.c_str(), parent, &b, 1, &fds, kTimeoutMs, &why) || fds[0] != -1)
      _exit(13);
    std::vector<bool> published;
    if (!zc::fd_published(address.c_str(), parent, &b, 1, &published, kTimeoutMs, &why) ||
        !published[0])
      _exit(14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
  EXPECT_EQ(count_open(ino), 1) << "only the service's own duplicate";

  s->withdraw(b);
  std::vector<zc::FdBlob> blobs;
  std::vector<bool> found, published;
  const char* why = nullptr;
  ASSERT_TRUE(zc::fd_fetch_blobs(s->address(), getpid(), &b, 1, &blobs, &found, kTimeoutMs, &why))
      << why;
  EXPECT_FALSE(found[0]);
  ASSERT_TRUE(zc::fd_published(s->address(), getpid(), &b, 1, &published, kTimeoutMs, &why));
  EXPECT_FALSE(published[0]);
  s->withdraw(f);
}

// Publishes `count` memfds whose contents are `prefix` + their index: their tokens, and each
// one's inode in *inodes.
std::vector<uint64_t> publish_numbered(size_t count, const std::string& prefix,
                                       std::vector<ino_t>* inodes) {
  std::vector<uint64_t> tokens(count);
  inodes->assign(count, 0);
  for (size_t i = 0; i < count; ++i)
    tokens[i] = publish_content(prefix + std::to_string(i), &(*inodes)[i]);
  return tokens;
}

TEST(FdExchange, SixHundredTokensInOneFetch) {
  constexpr size_t kCount = 600;
  static_assert(kCount > 2 * zc::kFdMaxPerMessage, "spans three messages");
  rlimit lim;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  if (lim.rlim_cur < 2 * kCount + 256) {
    if (lim.rlim_max < 2 * kCount + 256) GTEST_SKIP() << "RLIMIT_NOFILE hard limit too low";
    rlimit raised = lim;
    raised.rlim_cur = 2 * kCount + 256;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &raised), 0);
  }
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  std::vector<ino_t> inodes;
  const std::vector<uint64_t> published = publish_numbered(kCount, "memfd #", &inodes);
  for (uint64_t t : published) ASSERT_NE(t, 0u);
  // Asked in reverse order, with an unknown token in each message.
  std::vector<uint64_t> tokens;
  std::vector<long> expect;  // index into published, or -1
  for (size_t i = kCount; i-- > 0;) {
    tokens.push_back(published[i]);
    expect.push_back(long(i));
    if (i % 200 == 7) {
      tokens.push_back(0);
      expect.push_back(-1);
    }
  }
  std::vector<int> fds;
  const char* why = nullptr;
  const bool ok =
      fd_fetch(s->address(), getpid(), tokens.data(), tokens.size(), &fds, kTimeoutMs, &why);
  ASSERT_TRUE(ok) << why;
  ASSERT_EQ(fds.size(), tokens.size());
  size_t found = 0;
  for (size_t k = 0; k < tokens.size(); ++k) {
    if (expect[k] < 0) {
      EXPECT_EQ(fds[k], -1) << k;
      continue;
    }
    ASSERT_GE(fds[k], 0) << k;
    ++found;
    EXPECT_TRUE(has_cloexec(fds[k])) << k;
    EXPECT_EQ(inode_of(fds[k]), inodes[size_t(expect[k])]) << k;
    EXPECT_EQ(content_of(fds[k]), "memfd #" + std::to_string(expect[k])) << k;
  }
  EXPECT_EQ(found, kCount);
  close_all(&fds);
  for (uint64_t t : published) s->withdraw(t);
  if (lim.rlim_cur < 2 * kCount + 256) setrlimit(RLIMIT_NOFILE, &lim);
}

// Descriptors open in this process now.
int open_descriptors() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(dir)) n += e->d_name[0] != '.';
    closedir(dir);
  }
  return n - 1;  // less the directory's own
}

TEST(FdExchange, BatchedFetchFitsWhereOneFetchOfEveryDescriptorDoesNot) {
  // A process near its RLIMIT_NOFILE (src/channel/fd_headroom.h): 100 published descriptors, 24 free.
  // One fetch of all of them receives more than the process may open (the kernel drops what it
  // cannot install, and the fetch fails); fetched 16 at a time, each batch closed by the taker
  // before the next is asked for, every one of them arrives, in order. A taker that stops gets
  // no more, and nothing it was not handed stays open.
  constexpr size_t kCount = 100, kBatch = 16;
  constexpr int kFree = 24;
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  std::vector<ino_t> inodes;
  const std::vector<uint64_t> tokens = publish_numbered(kCount, "batched #", &inodes);
  for (uint64_t t : tokens) ASSERT_NE(t, 0u);
  rlimit lim;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &lim), 0);
  rlimit tight = lim;
  tight.rlim_cur = static_cast<rlim_t>(open_descriptors() + kFree);
  ASSERT_LE(tight.rlim_cur, lim.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  std::vector<int> all;
  const char* why = nullptr;
  EXPECT_FALSE(fd_fetch(s->address(), getpid(), tokens.data(), kCount, &all, kTimeoutMs, &why));
  size_t seen = 0, most = 0;
  auto take = [&](size_t first, const int* fds, size_t n) {
    EXPECT_EQ(first, seen);
    most = std::max(most, n);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(inode_of(fds[i]), inodes[first + i]) << first + i;
      EXPECT_TRUE(has_cloexec(fds[i]));
      close(fds[i]);
    }
    seen += n;
    return true;
  };
  why = nullptr;
  EXPECT_TRUE(zc::fd_fetch_batches(s->address(), getpid(), tokens.data(), kCount, kBatch, take,
                                   kTimeoutMs, &why))
      << why;
  EXPECT_EQ(seen, kCount);
  EXPECT_EQ(most, kBatch);
  // Stopped after the first batch: the rest are never handed over, nor left open.
  auto stop = [](size_t, const int* fds, size_t n) {
    for (size_t i = 0; i < n; ++i) close(fds[i]);
    return false;
  };
  EXPECT_FALSE(zc::fd_fetch_batches(s->address(), getpid(), tokens.data(), kCount, kBatch, stop,
                                    kTimeoutMs, &why));
  setrlimit(RLIMIT_NOFILE, &lim);
  for (size_t i = 0; i < kCount; ++i) EXPECT_EQ(count_open(inodes[i]), 1) << i;  // the service's
  for (uint64_t t : tokens) s->withdraw(t);
}

TEST(FdExchange, ForkedChildFetchesFromParentsService) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  ino_t ino = 0;
  const int original = make_memfd("written by the parent");
  ASSERT_GE(original, 0);
  ino = inode_of(original);
  const uint64_t token = s->publish(original);
  ASSERT_NE(token, 0u);
  const std::string address = s->address();
  const int parent = getpid();

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The service thread does not exist here: no service, and publishing does nothing.
    if (zc::fd_service() != nullptr) _exit(10);
    if (s->publish(original) != 0) _exit(11);
    // The inherited duplicates of the service were closed: only `original` is left.
    if (count_open(ino) != 1) _exit(12);
    if (!fd_probe(address.c_str(), parent, kTimeoutMs)) _exit(13);
    std::vector<int> fds;
    const char* why = nullptr;
    if (!fd_fetch(address.c_str(), parent, &token, 1, &fds, kTimeoutMs, &why)) _exit(14);
    if (fds.size() != 1 || fds[0] < 0 || !has_cloexec(fds[0])) _exit(15);
    if (content_of(fds[0]) != "written by the parent") _exit(16);
    if (pwrite(fds[0], "WRITTEN BY THE CHILD!", 21, 0) != 21) _exit(17);
    // A fetch that expects this (the child's) pid must refuse the parent's service.
    if (fd_fetch(address.c_str(), getpid(), &token, 1, &fds, kTimeoutMs, &why)) _exit(18);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
  EXPECT_EQ(content_of(original), "WRITTEN BY THE CHILD!");

  // The parent's service goes on serving after the fork.
  EXPECT_EQ(zc::fd_service(), s);
  std::vector<int> fds;
  const char* why = nullptr;
  ASSERT_TRUE(fd_fetch(s->address(), getpid(), &token, 1, &fds, kTimeoutMs, &why)) << why;
  EXPECT_EQ(inode_of(fds[0]), ino);
  close_all(&fds);
  s->withdraw(token);
  close(original);
}

TEST(FdExchange, MalformedMessagesCloseOnlyThatConnection) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  const std::string address = s->address();
  const uint64_t token = publish_content("still served");
  ASSERT_NE(token, 0u);

  // Positive control: the raw client gets answers to well-formed messages, two at once.
  {
    const int fd = raw_connect(address);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> two = header(wire::kMagic, wire::kVersion, wire::kHello, 0);
    const std::vector<uint8_t> again = two;
    two.insert(two.end(), again.begin(), again.end());
    ASSERT_TRUE(send_bytes(fd, two));
    uint8_t reply[2 * sizeof(wire::Header)];
    ASSERT_EQ(recv(fd, reply, sizeof(reply), MSG_WAITALL), ssize_t(sizeof(reply)));
    wire::Header h;
    memcpy(&h, reply + sizeof(wire::Header), sizeof(h));
    EXPECT_EQ(h.magic, wire::kMagic);
    EXPECT_EQ(h.kind, wire::kHelloReply);
    EXPECT_EQ(h.count, 0u);
    close(fd);
  }

  std::vector<std::pair<std::string, std::vector<uint8_t>>> cases = {
      {"bad magic", header(0x12345678, wire::kVersion, wire::kHello, 0)},
      {"bad version", header(wire::kMagic, wire::kVersion + 1, wire::kHello, 0)},
      {"reserved set", header(wire::kMagic, wire::kVersion, wire::kHello, 0, 1)},
      {"reply kind", header(wire::kMagic, wire::kVersion, wire::kReply, 0)},
      {"unknown kind", header(wire::kMagic, wire::kVersion, 77, 0)},
      {"hello with items", header(wire::kMagic, wire::kVersion, wire::kHello, 1)},
      {"254 tokens", request(std::vector<uint64_t>(zc::kFdMaxPerMessage + 1, token))},
      {"4G tokens", header(wire::kMagic, wire::kVersion, wire::kRequest, 0xffffffffu)},
  };
  std::vector<uint8_t> garbage(100);
  uint32_t x = 12345;
  for (uint8_t& b : garbage) b = uint8_t((x = x * 1103515245u + 12345u) >> 24);
  cases.push_back({"garbage", garbage});
  // A valid request followed by a bad one: the first is answered, then the connection ends.
  std::vector<uint8_t> good_then_bad = request({token});
  const std::vector<uint8_t> bad = header(0, 0, 0, 0);
  good_then_bad.insert(good_then_bad.end(), bad.begin(), bad.end());

  for (const auto& c : cases) {
    const int fd = raw_connect(address);
    ASSERT_GE(fd, 0) << c.first;
    ASSERT_TRUE(send_bytes(fd, c.second)) << c.first;
    EXPECT_EQ(next_event(fd, kTimeoutMs), "closed") << c.first;
    close(fd);
  }
  {
    const int fd = raw_connect(address);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_bytes(fd, good_then_bad));
    uint8_t reply[sizeof(wire::Header) + sizeof(uint32_t)];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    iovec iov{reply, sizeof(reply)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ASSERT_EQ(recvmsg(fd, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC), ssize_t(sizeof(reply)));
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    ASSERT_NE(cm, nullptr);
    int got;
    memcpy(&got, CMSG_DATA(cm), sizeof(int));
    EXPECT_EQ(content_of(got), "still served");
    close(got);
    EXPECT_EQ(next_event(fd, kTimeoutMs), "closed");
    close(fd);
  }
  // Descriptors sent to the service: connection closed, the descriptor not kept.
  {
    const int passed = make_memfd("sent to the service");
    ASSERT_GE(passed, 0);
    const int fd = raw_connect(address);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_bytes(fd, request({token}), passed));
    EXPECT_EQ(next_event(fd, kTimeoutMs), "closed");
    close(fd);
    EXPECT_EQ(count_open(inode_of(passed)), 1);
    close(passed);
  }
  // Half a message, then the client goes away.
  {
    const int fd = raw_connect(address);
    ASSERT_GE(fd, 0);
    std::vector<uint8_t> half = request({token, token});
    half.resize(20);
    ASSERT_TRUE(send_bytes(fd, half));
    close(fd);
  }

  // Others are still served, promptly.
  std::vector<int> fds;
  const char* why = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(fd_fetch(address.c_str(), getpid(), &token, 1, &fds, kTimeoutMs, &why)) << why;
  EXPECT_LT(elapsed_ms(t0), 1000);
  ASSERT_GE(fds[0], 0);
  EXPECT_EQ(content_of(fds[0]), "still served");
  close_all(&fds);
  EXPECT_TRUE(fd_probe(address.c_str(), getpid(), kTimeoutMs));
  s->withdraw(token);
}

TEST(FdExchange, SilentClientDoesNotStallOthers) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  const std::string address = s->address();
  const uint64_t token = publish_content("served despite silence");
  ASSERT_NE(token, 0u);

  const auto connected = std::chrono::steady_clock::now();
  const int silent = raw_connect(address);
  ASSERT_GE(silent, 0);
  const int partial = raw_connect(address);  // sends 8 bytes of a header, then nothing
  ASSERT_GE(partial, 0);
  ASSERT_TRUE(send_bytes(partial, std::vector<uint8_t>(8, 0)));

  std::vector<int> fds;
  const char* why = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(fd_fetch(address.c_str(), getpid(), &token, 1, &fds, kTimeoutMs, &why)) << why;
  // Stalled behind the silent ones, it would wait for their idle limit.
  EXPECT_LT(elapsed_ms(t0), zc::kFdServiceIdleMs / 2);
  ASSERT_GE(fds[0], 0);
  EXPECT_EQ(content_of(fds[0]), "served despite silence");
  close_all(&fds);

  // Both idle connections are closed by the service, not before the idle limit.
  EXPECT_EQ(next_event(silent, zc::kFdServiceIdleMs + 2000), "closed");
  EXPECT_EQ(next_event(partial, 2000), "closed");
  EXPECT_GE(elapsed_ms(connected), zc::kFdServiceIdleMs - 50);
  EXPECT_LT(elapsed_ms(connected), zc::kFdServiceIdleMs + 2000);
  close(silent);
  close(partial);
  s->withdraw(token);
}

TEST(FdExchange, ExpectedPidIsChecked) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  const uint64_t token = publish_content("pid checked");
  ASSERT_NE(token, 0u);
  std::vector<int> fds;
  const char* why = nullptr;
  EXPECT_FALSE(fd_fetch(s->address(), getpid() + 1, &token, 1, &fds, kTimeoutMs, &why));
  ASSERT_NE(why, nullptr);
  EXPECT_STREQ(why, "service is not the expected process");
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(fds[0], -1);
  EXPECT_FALSE(fd_probe(s->address(), getpid() + 1, kTimeoutMs));
  EXPECT_TRUE(fd_probe(s->address(), getpid(), kTimeoutMs));
  EXPECT_TRUE(fd_probe(s->address(), 0, kTimeoutMs));
  why = nullptr;
  EXPECT_TRUE(fd_fetch(s->address(), 0, &token, 1, &fds, kTimeoutMs, &why)) << why;
  EXPECT_GE(fds[0], 0);
  close_all(&fds);
  s->withdraw(token);
}

TEST(FdExchange, ProbeAndFetchFailCleanlyWithinTheTimeout) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(fd_probe(s->address(), getpid(), kTimeoutMs));

  // Nobody there, or no address at all.
  const std::string nobody = unique_name("nobody");
  EXPECT_FALSE(fd_probe(nobody.c_str(), 0, kTimeoutMs));
  EXPECT_FALSE(fd_probe(nullptr, 0, kTimeoutMs));
  EXPECT_FALSE(fd_probe("", 0, kTimeoutMs));
  EXPECT_FALSE(fd_probe(std::string(zc::kFdAddressMax, 'z').c_str(), 0, kTimeoutMs));
  EXPECT_FALSE(fd_probe(s->address(), 0, 0));
  const uint64_t token = 1;
  std::vector<int> fds;
  const char* why = nullptr;
  EXPECT_FALSE(fd_fetch(nobody.c_str(), 0, &token, 1, &fds, kTimeoutMs, &why));
  EXPECT_STREQ(why, "no service at the address");
  EXPECT_FALSE(fd_fetch(s->address(), 0, &token, 1, &fds, 0, &why));
  EXPECT_FALSE(fd_fetch(s->address(), 0, nullptr, 1, &fds, kTimeoutMs, &why));
  EXPECT_TRUE(fd_fetch(s->address(), 0, &token, 0, &fds, kTimeoutMs, &why));
  EXPECT_TRUE(fds.empty());

  // A listener that never answers: both calls give up after their timeout.
  const std::string mute = unique_name("mute");
  const int listener = raw_listen(mute);
  ASSERT_GE(listener, 0);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(fd_probe(mute.c_str(), getpid(), 300));
  EXPECT_GE(elapsed_ms(t0), 290);
  EXPECT_LT(elapsed_ms(t0), 1500);
  t0 = std::chrono::steady_clock::now();
  why = nullptr;
  EXPECT_FALSE(fd_fetch(mute.c_str(), getpid(), &token, 1, &fds, 300, &why));
  EXPECT_STREQ(why, "timed out");
  EXPECT_GE(elapsed_ms(t0), 290);
  EXPECT_LT(elapsed_ms(t0), 1500);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_EQ(fds[0], -1);
  close(listener);
}

// A fake service: accepts one connection, reads one request of `tokens` tokens, and answers
// with `reply` (plus `pass_fd` when >= 0), then waits for the client to leave; with an empty
// reply it hangs up at once.
struct FakeService {
  std::string name = unique_name("fake");
  int listener = raw_listen(name);
  std::thread thread;

  void serve(size_t tokens, std::vector<uint8_t> reply, int pass_fd) {
    thread = std::thread([this, tokens, reply, pass_fd] {
      pollfd p{listener, POLLIN, 0};
      if (poll(&p, 1, kTimeoutMs) <= 0) return;
      const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      timeval tv{5, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      std::vector<uint8_t> req(sizeof(wire::Header) + tokens * sizeof(uint64_t));
      if (recv(fd, req.data(), req.size(), MSG_WAITALL) == ssize_t(req.size()) && !reply.empty()) {
        send_bytes(fd, reply, pass_fd);
        char c;
        while (recv(fd, &c, 1, 0) > 0) {  // until the client leaves
        }
      }
      close(fd);
    });
  }
  ~FakeService() {
    if (thread.joinable()) thread.join();
    close(listener);
  }
};

std::vector<uint8_t> reply_bytes(uint32_t count, const std::vector<uint32_t>& statuses,
                                 uint16_t kind = wire::kReply) {
  std::vector<uint8_t> bytes = header(wire::kMagic, wire::kVersion, kind, count);
  const size_t at = bytes.size();
  bytes.resize(at + statuses.size() * sizeof(uint32_t));
  memcpy(bytes.data() + at, statuses.data(), statuses.size() * sizeof(uint32_t));
  return bytes;
}

TEST(FdExchange, ClientRejectsWrongReplies) {
  const int memfd = make_memfd("from the fake service");
  ASSERT_GE(memfd, 0);
  const ino_t ino = inode_of(memfd);
  struct Case {
    const char* what;
    std::vector<uint8_t> reply;
    bool pass_fd;
    const char* why;  // nullptr: the fetch succeeds
  };
  const std::vector<Case> cases = {
      {"a correct reply (control)", reply_bytes(1, {wire::kFound}), true, nullptr},
      {"unknown, no descriptor (control)", reply_bytes(1, {wire::kUnknown}), false, nullptr},
      {"wrong count", reply_bytes(2, {wire::kFound, wire::kFound}), true, "malformed reply"},
      {"wrong kind", reply_bytes(1, {wire::kFound}, wire::kHelloReply), true, "malformed reply"},
      {"found without descriptor", reply_bytes(1, {wire::kFound}), false, "malformed reply"},
      {"descriptor for unknown", reply_bytes(1, {wire::kUnknown}), true, "malformed reply"},
      {"bad status", reply_bytes(1, {7}), true, "malformed reply"},
      {"no reply", {}, false, "service closed the connection"},
  };
  for (const Case& c : cases) {
    FakeService fake;
    ASSERT_GE(fake.listener, 0);
    fake.serve(1, c.reply, c.pass_fd ? memfd : -1);
    const uint64_t token = 42;
    std::vector<int> fds;
    const char* why = nullptr;
    const bool ok = fd_fetch(fake.name.c_str(), getpid(), &token, 1, &fds, kTimeoutMs, &why);
    ASSERT_EQ(fds.size(), 1u) << c.what;
    if (c.why == nullptr) {
      EXPECT_TRUE(ok) << c.what << ": " << why;
      if (c.pass_fd) {
        ASSERT_GE(fds[0], 0) << c.what;
        EXPECT_EQ(inode_of(fds[0]), ino) << c.what;
        EXPECT_TRUE(has_cloexec(fds[0])) << c.what;
      } else {
        EXPECT_EQ(fds[0], -1) << c.what;
      }
    } else {
      EXPECT_FALSE(ok) << c.what;
      EXPECT_STREQ(why, c.why) << c.what;
      EXPECT_EQ(fds[0], -1) << c.what;
    }
    close_all(&fds);
    fake.thread.join();
    // Nothing the fake sent is left open on the client side.
    EXPECT_EQ(count_open(ino), 1) << c.what;
  }
  close(memfd);
}

TEST(FdExchange, OtherUserIsRefusedBothWays) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to become another user";
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  const std::string address = s->address();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0)
      _exit(20);
    // The client refuses a service of another user...
    if (fd_probe(address.c_str(), 0, kTimeoutMs)) _exit(21);
    // ...and the service answers nothing to another user's raw hello.
    const int fd = raw_connect(address);
    if (fd < 0) _exit(22);
    if (!send_bytes(fd, header(wire::kMagic, wire::kVersion, wire::kHello, 0))) {
      // The service may have closed already: that is the refusal too.
      _exit(0);
    }
    if (next_event(fd, kTimeoutMs) != "closed") _exit(23);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child failed at step " << WEXITSTATUS(status);
  EXPECT_TRUE(fd_probe(address.c_str(), getpid(), kTimeoutMs));
}

TEST(FdExchange, EveryDescriptorIsCloseOnExec) {
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  const uint64_t token = publish_content("cloexec");
  ASSERT_NE(token, 0u);
  std::vector<int> fds;
  const char* why = nullptr;
  ASSERT_TRUE(fd_fetch(s->address(), getpid(), &token, 1, &fds, kTimeoutMs, &why)) << why;
  const int conn = raw_connect(s->address());  // gives the service an accepted socket
  ASSERT_GE(conn, 0);
  ASSERT_TRUE(fd_probe(s->address(), getpid(), kTimeoutMs));  // the accept has happened

  int sockets = 0, memfds = 0;
  DIR* dir = opendir("/proc/self/fd");
  ASSERT_NE(dir, nullptr);
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    char target[256] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(path.c_str(), target, sizeof(target) - 1) < 0) continue;
    const bool socket = strncmp(target, "socket:", 7) == 0;
    const bool memfd = strncmp(target, "/memfd:fdx-test", 15) == 0;
    if (!socket && !memfd) continue;
    sockets += socket;
    memfds += memfd;
    EXPECT_TRUE(has_cloexec(atoi(e->d_name))) << path << " -> " << target;
  }
  closedir(dir);
  EXPECT_GE(sockets, 3);  // listener, accepted connection, raw client
  EXPECT_GE(memfds, 2);   // the kept duplicate and the fetched one
  close(conn);
  close_all(&fds);
  s->withdraw(token);
}

TEST(FdExchange, ServiceThreadIsNamedAndBlocksSignals) {
  ASSERT_NE(service(), nullptr);
  int found = 0;
  std::string sigblk;
  DIR* dir = opendir("/proc/self/task");
  ASSERT_NE(dir, nullptr);
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    FILE* f = fopen((task + "/comm").c_str(), "r");
    if (f == nullptr) continue;
    char comm[64] = {};
    const bool named = fgets(comm, sizeof(comm), f) != nullptr && strcmp(comm, "zerocta-fd\n") == 0;
    fclose(f);
    if (!named) continue;
    ++found;
    f = fopen((task + "/status").c_str(), "r");
    ASSERT_NE(f, nullptr);
    char line[256];
    while (fgets(line, sizeof(line), f) != nullptr)
      if (strncmp(line, "SigBlk:", 7) == 0) sigblk = line + 7;
    fclose(f);
  }
  closedir(dir);
  ASSERT_EQ(found, 1);
  const unsigned long long blocked = strtoull(sigblk.c_str(), nullptr, 16);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE, SIGCHLD, SIGALRM})
    EXPECT_NE(blocked & (1ull << (sig - 1)), 0u) << "signal " << sig << " not blocked";
}

TEST(FdExchange, ManyThreadsPublishFetchWithdraw) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 30;
  FdService* s = service();
  ASSERT_NE(s, nullptr);
  const std::string address = s->address();
  std::atomic<uint64_t> latest[kThreads];
  for (auto& t : latest) t.store(0);
  std::atomic<int> fetched{0}, failures{0}, neighbours_seen{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const std::string text = "thread " + std::to_string(t) + " round " + std::to_string(round);
        FdService* mine = zc::fd_service();
        const int fd = make_memfd(text);
        const uint64_t token = mine == nullptr ? 0 : mine->publish(fd);
        close(fd);
        if (token == 0) {
          ++failures;
          continue;
        }
        latest[t].store(token);
        const uint64_t neighbour = latest[(t + 1) % kThreads].load();
        const uint64_t tokens[3] = {token, neighbour, ~token};
        std::vector<int> fds;
        const char* why = nullptr;
        if (!fd_fetch(address.c_str(), getpid(), tokens, 3, &fds, kTimeoutMs, &why) || fds[0] < 0 ||
            content_of(fds[0]) != text || !has_cloexec(fds[0]) || fds[2] != -1) {
          ++failures;
        } else {
          ++fetched;
        }
        // The neighbour's token is either gone or its memfd, never someone else's.
        if (fds.size() == 3 && fds[1] >= 0) {
          const std::string prefix = "thread " + std::to_string((t + 1) % kThreads) + " ";
          if (content_of(fds[1]).compare(0, prefix.size(), prefix) != 0) ++failures;
          ++neighbours_seen;
        }
        close_all(&fds);
        if (round % 10 == 0 && !fd_probe(address.c_str(), getpid(), kTimeoutMs)) ++failures;
        latest[t].store(0);
        mine->withdraw(token);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(fetched.load(), kThreads * kRounds);
  ::testing::Test::RecordProperty("neighbours_seen", neighbours_seen.load());
}

// Runs this binary again with only this test selected and kExitChildEnv set: there the
// service starts, serves, keeps an idle connection open, and the process exits normally
// (static destructors run while the thread sits in poll). It must not hang or crash.
TEST(FdExchange, ExitWithServiceRunningDoesNotHang) {
  if (getenv(kExitChildEnv) != nullptr) {
    FdService* s = service();
    ASSERT_NE(s, nullptr);
    const uint64_t token = publish_content("exit");
    std::vector<int> fds;
    const char* why = nullptr;
    ASSERT_TRUE(fd_fetch(s->address(), getpid(), &token, 1, &fds, kTimeoutMs, &why)) << why;
    ASSERT_GE(fds[0], 0);
    static int idle = -1;  // left open on purpose
    idle = raw_connect(s->address());
    ASSERT_GE(idle, 0);
    return;  // the token stays published
  }
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
  env_text.push_back(std::string(kExitChildEnv) + "=1");
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(&e[0]);
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string filter = "--gtest_filter=FdExchange.ExitWithServiceRunningDoesNotHang";
  char* argv[] = {&exe[0], &filter[0], nullptr};

  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
    execve(argv[0], argv, envp.data());
    _exit(127);
  }
  int status = 0;
  pid_t done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while ((done = waitpid(child, &status, WNOHANG)) == 0 && elapsed_ms(t0) < 30000)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (done == 0) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
    FAIL() << "the child did not exit within 30 s";
  }
  ASSERT_EQ(done, child);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
