// A communicator's out-of-band channel: a small POSIX shared-memory segment in which the
// ranks that run zerocta on this host meet (membership.h says why that is enough to agree).
//
// The segment lives in a directory (ZEROCTA_CHANNEL_DIR, default /dev/shm) under "zerocta-<key
// hex>"; the key is a keyed hash of the communicator's identity (comm_key.h), never its raw bytes.
// It is created complete under a private name (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) and linked
// into place, so nobody ever sees it half made; an opener checks with fstat that it is a regular
// file of this user, mode 0600, of the expected size, and every word read from it is checked.
// The name is unlinked once membership is frozen; the mapping stays for the poison word.
// The header names its creator (pid, start time, pid namespace). A file of this user and this
// version whose creator is gone was never frozen and never will be: the next opener removes it,
// whatever its shape, and creates a fresh one. Every removal of a name (that one, and the
// freeze's) holds the named file's flock and checks under it that the name still names that
// file, so openers racing over one stale file end in one fresh channel. Another user's file, or
// one whose creator lives or cannot be judged (another pid namespace), stays: pass-through.
//
// Layout: a header (magic, version, capacity, key, creator, the `broken` and `poison` words), then
// `capacity` slots of {state word, MemberFacts}, then, page aligned, the region of the per-op
// exchange (op_exchange.h) for `op_ranks` ranks: the most that could ever route here (1.1 MiB
// for 2 ranks, 6 MiB for 8, all allocated at creation; of that the GPUs' part, 132 KiB and
// 2 MiB, is pinned once registered; so a child of a large parent must not reserve room for all
// of the parent's ranks). A slot is claimed by a
// compare-and-swap of its state (empty -> writing), filled, then published (-> joined, release
// order); a joined slot never changes again.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm_key.h"
#include "membership.h"

namespace zc {

// A channel's size, the same on every rank (a rank that computes another cannot open it).
struct ChannelShape {
  uint32_t capacity = 0;  // slots: the communicator's size, or the parent's for a child
  uint32_t op_ranks = 0;  // room in the op exchange: <= capacity and <= kOpRanks
};

class Channel {
 public:
  // Opens (creating it if this rank is first) the channel of `key`, of `shape`. nullptr with
  // *why when this rank cannot take part; its peers then see a missing member. A file whose
  // creator is gone is replaced; a live one holding a member whose process is gone is marked
  // broken for every member (all of them pass through).
  static std::unique_ptr<Channel> open(const std::string& dir, const CommKey& key,
                                       const ChannelShape& shape, const char** why);
  // Claims slot `mine.join_index` and publishes `mine` there. A slot claimed already marks the
  // channel broken for every member instead.
  void publish(const MemberFacts& mine);
  // Adds MemberProblem bits to a published slot: what a rank found checking the members it saw
  // after publishing (members() reports them with the facts). Must precede the rank's init.
  void add_problems(uint32_t join_index, uint32_t problems);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Every joined slot now (bounds-checked copies).
  std::vector<MemberFacts> members() const;
  uint32_t broken() const;
  // Removes the segment's name while it names this segment (membership is frozen: nobody else
  // may join). Idempotent.
  void unlink_name();
  // The communicator's poison word: the first error a member hit after commit; peers read it.
  void poison(int code);
  int poisoned() const;
  const std::string& name() const { return name_; }
  // The per-op exchange's region (page aligned, zero-filled at creation) and the ranks it serves.
  void* op_region() const;
  size_t op_region_bytes() const;
  uint32_t op_region_ranks() const;

 private:
  Channel() = default;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  uint32_t capacity_ = 0, op_ranks_ = 0;
  std::string dir_, name_;
  dev_t dev_ = 0;  // the file, to tell it from another linked at its name since
  ino_t ino_ = 0;
  bool linked_ = true;
};

// The number of zerocta channel entries in `dir` (tests and leak checks).
int channel_entries(const std::string& dir);

}  // namespace zc
