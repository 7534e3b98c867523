#include "channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "log.h"
#include "op_exchange.h"
#include "process_info.h"

namespace zc {
namespace {

constexpr uint64_t kMagic = 0x7a65726f6368616eull;  // "zerochan"
// Bumped whenever the segment's layout or what ranks expect of each other's memory changes
// (9: capture blocks with a reduce-scatter's tokens, and the reduce-scatter scratch split into a
// region for eager ops and one for captured ones): ranks of different versions then pass
// through.
constexpr uint32_t kVersion = 9;
// A child's channel has one slot per parent rank; parents beyond this size never route here.
constexpr uint32_t kMaxCapacity = 1u << 16;
// Tries at creating or joining: each retry follows a name that changed under this opener (a
// stale file removed, a frozen channel unlinked). More in a row means something keeps changing
// it: the rank passes through rather than spin.
constexpr int kOpenAttempts = 4;

enum SlotState : uint32_t { kEmpty = 0, kWriting = 1, kJoined = 2 };
enum Broken : uint32_t { kStale = 1, kConflict = 2 };

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t capacity;
  uint32_t header_bytes;
  uint32_t slot_bytes;
  uint32_t op_ranks;    // the ranks the op exchange has room for
  int32_t creator_pid;  // the process that created it: once it is gone, the file is stale
  uint64_t key_lo, key_hi;
  std::atomic<uint32_t> broken;
  std::atomic<int32_t> poison;
  uint64_t creator_start_time;  // with creator_pid (process_info.h)
  uint64_t creator_pid_ns;      // the namespace creator_pid is a pid of (0: unknown)
  uint64_t reserved[2];
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

// A mapping of a channel file and the file it maps (for removing its name later).
struct Mapped {
  void* map = nullptr;
  dev_t dev = 0;
  ino_t ino = 0;
};

void write_header(Header* h, const CommKey& key, const ChannelShape& shape) {
  h->magic = kMagic;
  h->version = kVersion;
  h->capacity = shape.capacity;
  h->header_bytes = sizeof(Header);
  h->slot_bytes = sizeof(Slot);
  h->op_ranks = shape.op_ranks;
  h->key_lo = key.lo;
  h->key_hi = key.hi;
  h->creator_pid = static_cast<int32_t>(getpid());
  h->creator_start_time = process_start_time(getpid());
  h->creator_pid_ns = pid_namespace_id();
}

// Creates the segment complete under a private name and links it into place. `map` null: *exists
// when the name is taken already, else *why.
Mapped create_linked(int dirfd, const std::string& name, const CommKey& key,
                     const ChannelShape& shape, bool* exists, const char** why) {
  *exists = false;
  const size_t bytes = segment_bytes(shape);
  const std::string tmp = name + ".tmp." + random_suffix();
  int fd = openat(dirfd, tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot create a file in the channel directory";
    return {};
  }
  void* map = MAP_FAILED;
  struct stat st;
  // fallocate, not ftruncate: a full tmpfs (Docker's 64 MiB /dev/shm) must fail here, not with
  // SIGBUS at the first write into the mapping.
  if (fchmod(fd, 0600) == 0 && posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0 &&
      fstat(fd, &st) == 0)
    map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) {
    unlinkat(dirfd, tmp.c_str(), 0);
    *why = "no room for the channel segment (is /dev/shm full?)";
    return {};
  }
  write_header(header_of(map), key, shape);
  const int linked = linkat(dirfd, tmp.c_str(), dirfd, name.c_str(), 0);
  const int err = errno;
  unlinkat(dirfd, tmp.c_str(), 0);
  if (linked == 0) return Mapped{map, st.st_dev, st.st_ino};
  munmap(map, bytes);
  if (err == EEXIST)
    *exists = true;
  else
    *why = "cannot link the channel segment into place";
  return {};
}

// Removes `name` in `dirfd` if it still names the file open as `fd`. Every remover of a channel
// name holds the named file's flock while it checks and unlinks, and a name is only ever
// linked where none is: so a name checked under that lock names the same file until unlinked,
// and two processes that met one stale file remove it once, never the fresh one after it.
void unlink_if_names(int dirfd, const char* name, int fd) {
  int locked = flock(fd, LOCK_EX);
  while (locked != 0 && errno == EINTR) locked = flock(fd, LOCK_EX);
  if (locked != 0) return;  // left in place: a later opener decides again
  struct stat mine, named;
  if (fstat(fd, &mine) == 0 && fstatat(dirfd, name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
      mine.st_dev == named.st_dev && mine.st_ino == named.st_ino)
    unlinkat(dirfd, name, 0);
  flock(fd, LOCK_UN);
}

// Whether a well-formed header of this version was left by a creator that is certainly gone.
// Only a creator of this pid namespace can be judged: elsewhere its pid means nothing here.
bool creator_gone(const Header* h) {
  const uint64_t ns = pid_namespace_id();
  return ns != 0 && h->creator_pid_ns == ns && process_gone(h->creator_pid, h->creator_start_time);
}

// What an opener found at the channel's name.
enum class Found {
  kJoined,   // a live channel of this shape: joined
  kRefused,  // not ours, not of this version, or of another shape with a live creator (*why)
  kStale,    // ours and of this version, its creator gone: its name is removed, to retry
  kGone,     // nothing there any more: to retry
};

// The header's checks for a segment of `shape` and `key` (sizes checked by the caller).
bool header_matches(const Header* h, const CommKey& key, const ChannelShape& shape) {
  return h->capacity == shape.capacity && h->op_ranks == shape.op_ranks &&
         h->header_bytes == sizeof(Header) && h->slot_bytes == sizeof(Slot) &&
         h->key_lo == key.lo && h->key_hi == key.hi;
}

// Opens a segment another process created, trusting nothing in it. A file of this user and of
// this version whose creator is gone is removed instead (it never froze: freezing unlinks the
// name), whatever its shape: a later job with the same unique id and another size then routes.
Found open_existing(int dirfd, const std::string& name, const CommKey& key,
                    const ChannelShape& shape, Mapped* out, const char** why) {
  const size_t bytes = segment_bytes(shape);
  int fd = openat(dirfd, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return Found::kGone;
  struct stat st;
  const bool private_file = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                            st.st_uid == geteuid() && (st.st_mode & 0777) == 0600;
  const size_t file_bytes = private_file ? static_cast<size_t>(st.st_size) : 0;
  // A file of another size is read for its header only (whose creator may be gone).
  const size_t map_bytes = file_bytes == bytes ? bytes : sizeof(Header);
  void* map = file_bytes >= sizeof(Header)
                  ? mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
  Found found = Found::kRefused;
  *why = "a foreign channel segment (owner, mode or size differ: ranks disagree on the size?)";
  if (map != MAP_FAILED) {
    const Header* h = header_of(map);
    if (h->magic != kMagic || h->version != kVersion) {
      *why = "a corrupt or foreign channel segment (another zerocta version?)";
    } else if (creator_gone(h)) {
      ZC_INFO("channel %s: removing the file left by process %d, gone before its freeze",
              name.c_str(), static_cast<int>(h->creator_pid));
      unlink_if_names(dirfd, name.c_str(), fd);
      found = Found::kStale;
    } else if (file_bytes == bytes && header_matches(h, key, shape)) {
      found = Found::kJoined;
      *out = Mapped{map, st.st_dev, st.st_ino};
    } else if (file_bytes == bytes) {
      *why = "a corrupt or foreign channel segment (another zerocta version?)";
    }  // else another size, its creator alive: the text above
    if (found != Found::kJoined) munmap(map, map_bytes);
  }
  if (fd >= 0) close(fd);
  return found;
}

// A member whose process is gone (or whose pid now belongs to another process) was left by an
// earlier job that used the same unique id and died during set-up.
bool member_alive(const MemberFacts& m) { return !process_gone(m.pid, m.start_time); }

// Creates the channel's file or joins the one there, removing a stale one first.
Mapped create_or_join(int dirfd, const std::string& name, const CommKey& key,
                      const ChannelShape& shape, const char** why) {
  for (int attempt = 0; attempt < kOpenAttempts; ++attempt) {
    bool exists = false;
    Mapped m = create_linked(dirfd, name, key, shape, &exists, why);
    if (m.map || !exists) return m;
    const Found found = open_existing(dirfd, name, key, shape, &m, why);
    if (found == Found::kJoined || found == Found::kRefused) return m;
  }
  *why = "the channel's name kept changing while joining";
  return {};
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
  const Mapped m = create_or_join(dirfd, name, key, shape, why);
  close(dirfd);
  if (!m.map) return nullptr;

  std::unique_ptr<Channel> c(new Channel);
  c->map_ = m.map;
  c->bytes_ = segment_bytes(shape);
  c->capacity_ = shape.capacity;
  c->op_ranks_ = shape.op_ranks;
  c->dir_ = dir;
  c->name_ = name;
  c->dev_ = m.dev;
  c->ino_ = m.ino;
  Header* h = header_of(m.map);
  for (const MemberFacts& mf : c->members())
    if (!member_alive(mf)) h->broken.fetch_or(kStale);
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
  // Only while the name is still this channel's: a stale one's remover may have replaced it.
  const std::string path = dir_ + "/" + name_;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_)
    unlink_if_names(AT_FDCWD, path.c_str(), fd);
  close(fd);
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
