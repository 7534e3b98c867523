#include "op_exchange.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

namespace zc {

// The region, laid out by rank count:
//   header   arrival[kOpRing], verdict[kOpRing], finished[kOpRanks], left[kOpRanks]
//   posts    [nranks][kOpRing] of {seq word, OpPost}
//   stages   [nranks][kOpRing] of {seq word, OpStage}
//   pairs    [nranks][nranks][kOpRing] of (seq << 2) | PairMode
//   --- page boundary: the GPUs' part (device_offset), the only part registered with CUDA ---
//   flags    ready[nranks][kOpRing], done[nranks][nranks][kOpRing], pushed[nranks][kOpRing],
//            landed[nranks][nranks], freed[nranks] (uint32_t each)
//   blocks   the captured ops' flag blocks (capture_blocks.h)
struct OpExchange::Shared {
  std::atomic<uint64_t> arrival[kOpRing];  // bit r: rank r arrived at the slot's current op
  std::atomic<uint64_t> verdict[kOpRing];  // (seq << 2) | OpVerdict, by the first to decide
  std::atomic<uint64_t> finished[kOpRanks];
  std::atomic<uint64_t> left[kOpRanks];  // (seq << 2) | kLeft | kLeftClean, once rank r aborted
};

namespace {

struct SharedPost {
  std::atomic<uint64_t> seq;  // the op posted here (0: none yet); stored last
  OpPost body;
};

struct SharedStage {
  std::atomic<uint64_t> seq;  // the op it is published for (0: none yet); stored last
  OpStage body;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared words must be lock-free");

constexpr size_t kPage = 4096;

size_t posts_offset() {
  return (sizeof(std::atomic<uint64_t>) * (2 * kOpRing + 2 * kOpRanks) + 63) / 64 * 64;
}

constexpr uint64_t kLeft = 1, kLeftClean = 2;
size_t stages_offset(uint32_t nranks) {
  return posts_offset() + sizeof(SharedPost) * nranks * kOpRing;
}
size_t pairs_offset(uint32_t nranks) {
  return stages_offset(nranks) + sizeof(SharedStage) * nranks * kOpRing;
}
// Page aligned: the GPUs' part starts here (device_offset).
size_t flags_offset(uint32_t nranks) {
  const size_t end =
      pairs_offset(nranks) + sizeof(std::atomic<uint64_t>) * nranks * nranks * kOpRing;
  return (end + kPage - 1) / kPage * kPage;
}
size_t ring_flag_words(uint32_t nranks) { return size_t{nranks} * kOpRing * (2 + nranks); }
size_t flag_words(uint32_t nranks) {
  return ring_flag_words(nranks) + size_t{nranks} * nranks + nranks;
}

uint32_t slot_of(uint64_t seq) { return static_cast<uint32_t>(seq % kOpRing); }

const char* compare_posts(const OpPost& mine, const OpPost& peer) {
  if (peer.seq != mine.seq) return "a peer's post is for another op";
  if (peer.collective != mine.collective)
    return "ranks issued different collectives (an all-gather and a reduce-scatter) at the same "
           "position";
  if (peer.mode != mine.mode)
    return "one rank captured a collective into a CUDA graph where another ran it eagerly";
  if (peer.count != mine.count || peer.datatype != mine.datatype)
    return "ranks issued collectives of different counts or datatypes at the same position";
  if (peer.redop != mine.redop)
    return "ranks issued reduce-scatters with different reduction ops at the same position";
  // Checked last: a drift that also changed the op's mode, count or datatype is named by those.
  if (peer.calls != mine.calls || peer.chain != mine.chain)
    return "the ranks' collective calls on this communicator differ (a rank skipped or added an "
           "op)";
  return "";
}

size_t blocks_offset(uint32_t nranks) {
  return (flags_offset(nranks) + flag_words(nranks) * sizeof(uint32_t) + 63) / 64 * 64;
}

}  // namespace

size_t OpExchange::region_bytes(uint32_t nranks) {
  const size_t bytes = blocks_offset(nranks) + CaptureBlocks::region_bytes(nranks);
  return (bytes + kPage - 1) / kPage * kPage;
}

size_t OpExchange::device_offset(uint32_t nranks) { return flags_offset(nranks); }

OpExchange::OpExchange(void* base, uint32_t nranks)
    : shared_(static_cast<Shared*>(base)),
      nranks_(nranks),
      blocks_(static_cast<char*>(base) + blocks_offset(nranks), nranks) {}

namespace {
SharedPost* post_at(void* base, uint32_t rank, uint64_t seq) {
  return reinterpret_cast<SharedPost*>(static_cast<char*>(base) + posts_offset()) +
         size_t{rank} * kOpRing + slot_of(seq);
}
SharedStage* stage_at(void* base, uint32_t nranks, uint32_t rank, uint64_t seq) {
  return reinterpret_cast<SharedStage*>(static_cast<char*>(base) + stages_offset(nranks)) +
         size_t{rank} * kOpRing + slot_of(seq);
}
}  // namespace

bool OpExchange::ring_free(uint32_t rank, uint64_t seq) const {
  (void)rank;
  if (seq <= kOpRing) return true;
  for (uint32_t r = 0; r < nranks_; ++r)
    if (shared_->finished[r].load(std::memory_order_acquire) < seq - kOpRing) return false;
  return true;
}

void OpPost::clear() {
  seq = 0;
  mode = OpMode::kEager;
  reach = 0;
  count = 0;
  datatype = 0;
  pid = 0;
  collective = OpCollective::kAllGather;
  redop = 0;
  calls = chain = 0;
  block = CaptureRef{};
  send.clear();
  recv.clear();
}

namespace {
void copy_buffer(OpBuffer* out, const OpBuffer& in) {
  // A peer's count is clamped: nothing past the array is ever copied.
  const uint32_t n = std::min(in.nextents, kMaxExtents);
  memcpy(static_cast<void*>(out), &in, offsetof(OpBuffer, extents) + n * sizeof(OpExtent));
  out->nextents = n;
}
}  // namespace

void copy_post(OpPost* out, const OpPost& in) {
  static_assert(std::is_standard_layout_v<OpPost> && std::is_trivially_copyable_v<OpPost>,
                "posts are copied bytewise in and out of shared memory");
  memcpy(static_cast<void*>(out), &in, offsetof(OpPost, send));
  copy_buffer(&out->send, in.send);
  copy_buffer(&out->recv, in.recv);
}

void OpExchange::post(uint32_t rank, const OpPost& mine) {
  SharedPost* p = post_at(shared_, rank, mine.seq);
  copy_post(&p->body, mine);
  p->seq.store(mine.seq, std::memory_order_release);
}

OpVerdict OpExchange::decide(const OpPost& mine) {
  std::atomic<uint64_t>& word = shared_->verdict[slot_of(mine.seq)];
  const OpVerdict proposed = mine.reach != 0 ? OpVerdict::kRoute : OpVerdict::kNccl;
  uint64_t v = word.load(std::memory_order_acquire);
  // A word still holding an older op of this slot is undecided for this one.
  while ((v >> 2) != mine.seq)
    if (word.compare_exchange_weak(v, mine.seq << 2 | static_cast<uint64_t>(proposed),
                                   std::memory_order_acq_rel))
      return proposed;
  return static_cast<OpVerdict>(v & 3);
}

Arrival OpExchange::join(uint32_t rank, const OpPost& mine, OpPost* earlier) {
  const uint32_t slot = slot_of(mine.seq);
  const uint64_t me = uint64_t{1} << rank;
  const uint64_t all = nranks_ >= 64 ? ~uint64_t{0} : (uint64_t{1} << nranks_) - 1;
  Arrival a;
  a.seq = mine.seq;
  a.verdict = decide(mine);
  a.before = shared_->arrival[slot].fetch_or(me, std::memory_order_acq_rel);
  // The last to arrive clears the word for the slot's next op: everyone has read it by now, and
  // nobody posts there again before every rank finished this op (ring_free).
  if ((a.before | me) == all) shared_->arrival[slot].store(0, std::memory_order_release);
  for (uint32_t r = 0; r < nranks_; ++r) {
    if (!(a.before >> r & 1)) continue;
    const SharedPost* p = post_at(shared_, r, mine.seq);
    const char* why = "a peer arrived without its post";
    if (p->seq.load(std::memory_order_acquire) == mine.seq) {
      copy_post(&earlier[r], p->body);
      why = compare_posts(mine, earlier[r]);
    }
    if (*why && !*a.mismatch) {
      a.mismatch = why;
      a.mismatch_rank = r;
    }
  }
  return a;
}

namespace {
std::atomic<uint64_t>* pair_at(void* base, uint32_t nranks, uint32_t e, uint32_t l, uint64_t seq) {
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(base) + pairs_offset(nranks)) +
         (size_t{e} * nranks + l) * kOpRing + slot_of(seq);
}
}  // namespace

PairMode OpExchange::settle_pair(uint32_t earlier, uint32_t later, uint64_t seq, PairMode want) {
  std::atomic<uint64_t>* w = pair_at(shared_, nranks_, earlier, later, seq);
  uint64_t v = w->load(std::memory_order_acquire);
  // A word still holding an older op of this slot is unsettled for this one.
  while ((v >> 2) != seq)
    if (w->compare_exchange_weak(v, seq << 2 | static_cast<uint64_t>(want),
                                 std::memory_order_acq_rel))
      return want;
  return static_cast<PairMode>(v & 3);
}

bool OpExchange::pair_settled(uint32_t earlier, uint32_t later, uint64_t seq) const {
  return (pair_at(shared_, nranks_, earlier, later, seq)->load(std::memory_order_acquire) >> 2) ==
         seq;
}

bool OpExchange::read_post(uint32_t rank, uint64_t seq, OpPost* out) const {
  const SharedPost* p = post_at(shared_, rank, seq);
  if (p->seq.load(std::memory_order_acquire) != seq) return false;
  copy_post(out, p->body);
  return true;
}

void OpExchange::publish_stage(uint32_t rank, uint64_t seq, const OpStage& stage) {
  SharedStage* s = stage_at(shared_, nranks_, rank, seq);
  memcpy(&s->body, &stage, sizeof stage);
  s->seq.store(seq, std::memory_order_release);
}

bool OpExchange::read_stage(uint32_t rank, uint64_t seq, OpStage* out) const {
  const SharedStage* s = stage_at(shared_, nranks_, rank, seq);
  if (s->seq.load(std::memory_order_acquire) != seq) return false;
  memcpy(out, &s->body, sizeof(OpStage));
  return true;
}

void OpExchange::leave(uint32_t rank, uint64_t seq, bool clean) {
  shared_->left[rank].store(seq << 2 | kLeft | (clean ? kLeftClean : 0), std::memory_order_release);
}

bool OpExchange::peer_left(uint32_t me) const {
  const uint64_t my_seq = shared_->finished[me].load(std::memory_order_acquire);
  for (uint32_t r = 0; r < nranks_; ++r) {
    const uint64_t v = shared_->left[r].load(std::memory_order_acquire);
    if (r == me || !(v & kLeft)) continue;
    if (!(v & kLeftClean) || my_seq > v >> 2) return true;
  }
  return false;
}

bool OpExchange::anyone_left() const {
  for (uint32_t r = 0; r < nranks_; ++r)
    if (shared_->left[r].load(std::memory_order_acquire) & kLeft) return true;
  return false;
}

void OpExchange::finish(uint32_t rank, uint64_t seq) {
  shared_->finished[rank].store(seq, std::memory_order_release);
}

void PostsRead::job_coming(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(seq);
}

void PostsRead::op_done(OpExchange& ops, uint32_t me, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  through_ = seq;
  publish(ops, me);
}

void PostsRead::job_done(OpExchange& ops, uint32_t me, uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(std::remove(pending_.begin(), pending_.end(), seq), pending_.end());
  publish(ops, me);
}

void PostsRead::publish(OpExchange& ops, uint32_t me) {
  ops.finish(me, pending_.empty() ? through_ : std::min(through_, pending_.front() - 1));
}

uint32_t* OpExchange::flags_begin() {
  return reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(shared_) + flags_offset(nranks_));
}

size_t OpExchange::flag_count() const { return flag_words(nranks_); }

void OpExchange::release_all(uint64_t seq) {
  const uint32_t ahead = static_cast<uint32_t>(seq) + (1u << 30);
  const uint32_t slices_ahead = static_cast<uint32_t>(rs_slices_) + (1u << 30);
  uint32_t* flags = flags_begin();
  const size_t ring = ring_flag_words(nranks_);
  for (size_t i = 0; i < flag_count(); ++i)
    __atomic_store_n(flags + i, i < ring ? ahead : slices_ahead, __ATOMIC_RELEASE);
  blocks_.release_all();
}

uint32_t* OpExchange::ready_flag(uint32_t rank, uint64_t seq) {
  return flags_begin() + size_t{rank} * kOpRing + slot_of(seq);
}

uint32_t* OpExchange::done_flag(uint32_t rank, uint32_t peer, uint64_t seq) {
  return flags_begin() + size_t{nranks_} * kOpRing + (size_t{rank} * nranks_ + peer) * kOpRing +
         slot_of(seq);
}

uint32_t* OpExchange::pushed_flag(uint32_t rank, uint64_t seq) {
  return flags_begin() + size_t{nranks_} * kOpRing * (1 + nranks_) + size_t{rank} * kOpRing +
         slot_of(seq);
}

uint32_t* OpExchange::landed_flag(uint32_t owner, uint32_t pusher) {
  return flags_begin() + ring_flag_words(nranks_) + size_t{owner} * nranks_ + pusher;
}

uint32_t* OpExchange::freed_flag(uint32_t owner) {
  return flags_begin() + ring_flag_words(nranks_) + size_t{nranks_} * nranks_ + owner;
}

}  // namespace zc
