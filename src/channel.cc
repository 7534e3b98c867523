#include "channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "op_exchange.h"
#include "process_info.h"

namespace zc {
namespace {

constexpr uint64_t kMagic = 0x7a65726f6368616eull;  // "zerochan"
// Bumped whenever the segment's layout changes: ranks of different versions then pass through.
constexpr uint32_t kVersion = 6;
// A child's channel has one slot per parent rank; parents beyond this size never route here.
constexpr uint32_t kMaxCapacity = 1u << 16;

enum SlotState : uint32_t { kEmpty = 0, kWriting = 1, kJoined = 2 };
enum Broken : uint32_t { kStale = 1, kConflict = 2 };

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t capacity;
  uint32_t header_bytes;
  uint32_t slot_bytes;
  uint32_t op_ranks;  // the ranks the op exchange has room for
  uint32_t reserved32;
  uint64_t key_lo, key_hi;
  std::atomic<uint32_t> broken;
  std::atomic<int32_t> poison;
  uint64_t reserved[4];
};

struct Slot {
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> late_problems;  // MemberProblem bits found after publishing
  MemberFacts facts;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory words must be lock-free");

// The op exchange starts on a page boundary (it is registered with CUDA) after the slots, with
// room for `op_ranks` ranks.
constexpr size_t kPage = 4096;
size_t op_region_offset(uint32_t capacity) {
  return (sizeof(Header) + sizeof(Slot) * capacity + kPage - 1) / kPage * kPage;
}
size_t segment_bytes(const ChannelShape& shape) {
  return op_region_offset(shape.capacity) + OpExchange::region_bytes(shape.op_ranks);
}

Header* header_of(void* map) { return static_cast<Header*>(map); }
Slot* slot_of(void* map, uint32_t i) {
  return reinterpret_cast<Slot*>(static_cast<char*>(map) + sizeof(Header)) + i;
}

std::string random_suffix() {
  std::random_device rd;
  char text[32];
  snprintf(text, sizeof text, "%d.%08x%08x", static_cast<int>(getpid()), rd(), rd());
  return text;
}

// Creates the segment complete under a private name and links it into place. Returns the
// mapping, or nullptr: *exists when another rank created it first, else *why.
void* create_linked(int dirfd, const std::string& name, const CommKey& key,
                    const ChannelShape& shape, bool* exists, const char** why) {
  *exists = false;
  const size_t bytes = segment_bytes(shape);
  const std::string tmp = name + ".tmp." + random_suffix();
  int fd = openat(dirfd, tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot create a file in the channel directory";
    return nullptr;
  }
  void* map = MAP_FAILED;
  // fallocate, not ftruncate: a full tmpfs (Docker's 64 MiB /dev/shm) must fail here, not with
  // SIGBUS at the first write into the mapping.
  if (fchmod(fd, 0600) == 0 && posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0)
    map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    unlinkat(dirfd, tmp.c_str(), 0);
    *why = "no room for the channel segment (is /dev/shm full?)";
    return nullptr;
  }
  Header* h = header_of(map);
  h->magic = kMagic;
  h->version = kVersion;
  h->capacity = shape.capacity;
  h->header_bytes = sizeof(Header);
  h->slot_bytes = sizeof(Slot);
  h->op_ranks = shape.op_ranks;
  h->key_lo = key.lo;
  h->key_hi = key.hi;
  const int linked = linkat(dirfd, tmp.c_str(), dirfd, name.c_str(), 0);
  const int err = errno;
  unlinkat(dirfd, tmp.c_str(), 0);
  if (linked == 0) return map;
  munmap(map, bytes);
  if (err == EEXIST)
    *exists = true;
  else
    *why = "cannot link the channel segment into place";
  return nullptr;
}

// Opens a segment another rank created, trusting nothing in it.
void* open_existing(int dirfd, const std::string& name, const CommKey& key,
                    const ChannelShape& shape, const char** why) {
  const size_t bytes = segment_bytes(shape);
  int fd = openat(dirfd, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    *why = "the channel segment vanished while joining";
    return nullptr;
  }
  struct stat st;
  void* map = MAP_FAILED;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
      (st.st_mode & 0777) == 0600 && static_cast<size_t>(st.st_size) == bytes)
    map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    *why = "a foreign channel segment (owner, mode or size differ: ranks disagree on the size?)";
    return nullptr;
  }
  const Header* h = header_of(map);
  if (h->magic != kMagic || h->version != kVersion || h->capacity != shape.capacity ||
      h->op_ranks != shape.op_ranks || h->header_bytes != sizeof(Header) ||
      h->slot_bytes != sizeof(Slot) || h->key_lo != key.lo || h->key_hi != key.hi) {
    munmap(map, bytes);
    *why = "a corrupt or foreign channel segment (another zerocta version?)";
    return nullptr;
  }
  return map;
}

// A member whose process is gone (or whose pid now belongs to another process) was left by an
// earlier job that used the same unique id and died during set-up.
bool member_alive(const MemberFacts& m) {
  if (m.pid <= 0) return false;
  if (kill(m.pid, 0) != 0 && errno == ESRCH) return false;
  const uint64_t t = process_start_time(m.pid);
  return t == 0 || t == m.start_time;  // 0: not readable (hidepid): trust the pid
}

}  // namespace

std::unique_ptr<Channel> Channel::open(const std::string& dir, const CommKey& key,
                                       const ChannelShape& shape, const char** why) {
  if (shape.capacity == 0 || shape.capacity > kMaxCapacity || shape.op_ranks > kOpRanks ||
      shape.op_ranks > shape.capacity) {
    *why = "communicator too large for a channel";
    return nullptr;
  }
  int dirfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0) {
    *why = "the channel directory cannot be opened";
    return nullptr;
  }
  const std::string name = "zerocta-" + key.hex();
  bool exists = false;
  void* map = create_linked(dirfd, name, key, shape, &exists, why);
  if (!map && exists) map = open_existing(dirfd, name, key, shape, why);
  close(dirfd);
  if (!map) return nullptr;

  std::unique_ptr<Channel> c(new Channel);
  c->map_ = map;
  c->bytes_ = segment_bytes(shape);
  c->capacity_ = shape.capacity;
  c->op_ranks_ = shape.op_ranks;
  c->dir_ = dir;
  c->name_ = name;
  Header* h = header_of(map);
  for (const MemberFacts& m : c->members())
    if (!member_alive(m)) h->broken.fetch_or(kStale);
  return c;
}

void Channel::publish(const MemberFacts& mine) {
  if (mine.join_index >= capacity_) {
    header_of(map_)->broken.fetch_or(kConflict);
    return;
  }
  Slot* s = slot_of(map_, mine.join_index);
  uint32_t expected = kEmpty;
  if (!s->state.compare_exchange_strong(expected, kWriting)) {
    header_of(map_)->broken.fetch_or(kConflict);  // every member passes through, this one too
    return;
  }
  memcpy(&s->facts, &mine, sizeof mine);
  s->state.store(kJoined, std::memory_order_release);
}

Channel::~Channel() {
  unlink_name();
  if (map_) munmap(map_, bytes_);
}

std::vector<MemberFacts> Channel::members() const {
  std::vector<MemberFacts> out;
  for (uint32_t i = 0; i < capacity_; ++i) {
    const Slot* s = slot_of(map_, i);
    if (s->state.load(std::memory_order_acquire) != kJoined) continue;
    MemberFacts m;
    memcpy(&m, &s->facts, sizeof m);
    m.problems |= s->late_problems.load(std::memory_order_acquire);
    m.join_index = i;  // the slot says who it is, whatever its bytes claim
    m.fd_address[sizeof m.fd_address - 1] = '\0';
    out.push_back(m);
  }
  return out;
}

void Channel::add_problems(uint32_t join_index, uint32_t problems) {
  if (join_index < capacity_ && problems != 0)
    slot_of(map_, join_index)->late_problems.fetch_or(problems, std::memory_order_release);
}

uint32_t Channel::broken() const { return header_of(map_)->broken.load(); }

void Channel::unlink_name() {
  if (!linked_) return;
  linked_ = false;
  unlink((dir_ + "/" + name_).c_str());
}

void Channel::poison(int code) {
  int32_t none = 0;
  header_of(map_)->poison.compare_exchange_strong(none, code);
}

int Channel::poisoned() const { return header_of(map_)->poison.load(std::memory_order_acquire); }

void* Channel::op_region() const { return static_cast<char*>(map_) + op_region_offset(capacity_); }

size_t Channel::op_region_bytes() const { return bytes_ - op_region_offset(capacity_); }

uint32_t Channel::op_region_ranks() const { return op_ranks_; }

int channel_entries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  int n = 0;
  while (dirent* e = readdir(d))
    if (strncmp(e->d_name, "zerocta-", 8) == 0) ++n;
  closedir(d);
  return n;
}

}  // namespace zc
