#include "ce_plan.h"

#include <algorithm>

namespace zc {
namespace {

constexpr uint64_t kFlag = 4;  // bytes per flag

void push(std::vector<PlanOp>* plan, PlanStream s, PlanOpKind k, uint64_t dst, uint64_t src = 0,
          uint64_t bytes = 0, uint8_t event = 0) {
  plan->push_back(PlanOp{s, k, event, {}, dst, src, bytes});
}

// Takes a 0/1 token: waits until the local flag is 1, then resets it (its consumer owns it).
void take_token(std::vector<PlanOp>* plan, PlanStream stream, uint64_t flag) {
  push(plan, stream, PlanOpKind::kWaitEq1, flag);
  push(plan, stream, PlanOpKind::kWrite0, flag);
}

// Hands a token to a peer: a 4-byte copy of the constant 1 into the peer's flag.
void give_token(std::vector<PlanOp>* plan, PlanStream stream, uint64_t peer_flag, uint64_t one) {
  push(plan, stream, PlanOpKind::kSignal, peer_flag, one, kFlag);
}

// Start of every plan: both internal streams wait for the user's stream.
void fork_from_user(std::vector<PlanOp>* plan) {
  push(plan, PlanStream::kUser, PlanOpKind::kRecord, 0, 0, 0, 0);
  push(plan, PlanStream::kCopyIn, PlanOpKind::kWaitEvent, 0, 0, 0, 0);
  push(plan, PlanStream::kPull, PlanOpKind::kWaitEvent, 0, 0, 0, 0);
}

// End of every plan: the own chunk (unless the op is in place; it overlaps the peers'
// traffic), then the user's stream waits for both internal streams.
void own_chunk_and_join(const AllGatherArgs& a, int me, std::vector<PlanOp>* plan) {
  const uint64_t own = a.recv + static_cast<uint64_t>(me) * a.bytes;
  if (a.send != own) push(plan, PlanStream::kCopyIn, PlanOpKind::kCopy, own, a.send, a.bytes);
  push(plan, PlanStream::kCopyIn, PlanOpKind::kRecord, 0, 0, 0, 1);
  push(plan, PlanStream::kPull, PlanOpKind::kRecord, 0, 0, 0, 2);
  push(plan, PlanStream::kUser, PlanOpKind::kWaitEvent, 0, 0, 0, 1);
  push(plan, PlanStream::kUser, PlanOpKind::kWaitEvent, 0, 0, 0, 2);
}

}  // namespace

uint64_t ArenaLayout::ready_offset(int slot, int from_rank) const {
  return (static_cast<uint64_t>(slot) * kMaxRanks + from_rank) * kFlag;
}
uint64_t ArenaLayout::done_offset(int slot, int from_peer) const {
  return (static_cast<uint64_t>(nslots + slot) * kMaxRanks + from_peer) * kFlag;
}
uint64_t ArenaLayout::one_offset() const { return 2ull * nslots * kMaxRanks * kFlag; }
uint64_t ArenaLayout::marker_offset() const { return one_offset() + 64; }
uint64_t ArenaLayout::slot_offset(int slot) const {
  return flags_bytes + static_cast<uint64_t>(slot) * slot_bytes;
}
uint64_t ArenaLayout::arena_bytes() const { return flags_bytes + slot_bytes * nslots; }

ArenaLayout ArenaLayout::make(uint64_t pool_bytes, uint64_t chunk_bytes) {
  ArenaLayout l;
  // At least 4 slots: 2 for eager ops and 2 for captured graphs, each pair enough to overlap
  // one piece's copy-in with the previous piece's pulls. A pool too small for 4 chunks gets
  // smaller slots rather than growing past ZEROCTA_POOL_BYTES.
  if (pool_bytes / chunk_bytes >= 4) {
    l.nslots = static_cast<int>(pool_bytes / chunk_bytes);
    l.slot_bytes = chunk_bytes;
  } else {
    l.nslots = 4;
    l.slot_bytes = pool_bytes / 4;
    if (l.slot_bytes >= 4096) l.slot_bytes &= ~uint64_t{4095};
  }
  // A quarter (at least 2) for captured graphs, the rest for eager ops.
  l.eager_slots = l.nslots - std::max(2, l.nslots / 4);
  // Flags, the constant and the marker, rounded to the window alignment so slots are 4 KiB
  // aligned (copy engines run fastest on aligned, large pieces).
  uint64_t need = l.marker_offset() + 64;
  l.flags_bytes = (need + 4095) / 4096 * 4096;
  return l;
}

uint64_t push_piece_bytes(const ArenaLayout& L, int nranks) {
  uint64_t sub = L.slot_bytes / static_cast<uint64_t>(nranks);
  return sub >= 4096 ? sub & ~uint64_t{4095} : sub;
}

namespace {

void build_push_plan(const ArenaLayout& L, const RankView& v, const AllGatherArgs& a,
                     SlotRange slots, uint64_t* slot_cursor, std::vector<PlanOp>* plan) {
  const int me = v.rank, n = v.nranks;
  const uint64_t mine = v.arena[me];
  const uint64_t piece = push_piece_bytes(L, n);
  fork_from_user(plan);
  const uint64_t npieces = (a.bytes + piece - 1) / piece;
  for (uint64_t j = 0; j < npieces; ++j) {
    const int s =
        slots.first + static_cast<int>((*slot_cursor)++ % static_cast<uint64_t>(slots.count));
    const uint64_t off = j * piece;
    const uint64_t pb = std::min(piece, a.bytes - off);
    // Send (stream kCopyIn): into every peer's sub-slot for me, once that peer drained it.
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      take_token(plan, PlanStream::kCopyIn, mine + L.done_offset(s, p));
      push(plan, PlanStream::kCopyIn, PlanOpKind::kCopy,
           v.arena[p] + L.slot_offset(s) + static_cast<uint64_t>(me) * piece, a.send + off, pb);
      give_token(plan, PlanStream::kCopyIn, v.arena[p] + L.ready_offset(s, me),
                 mine + L.one_offset());
    }
    // Drain (stream kPull): each sender's sub-slot into recvbuff, then hand it back.
    for (int k = 1; k < n; ++k) {
      const int r = (me + n - k) % n;
      take_token(plan, PlanStream::kPull, mine + L.ready_offset(s, r));
      push(plan, PlanStream::kPull, PlanOpKind::kCopy, a.recv + r * a.bytes + off,
           mine + L.slot_offset(s) + static_cast<uint64_t>(r) * piece, pb);
      give_token(plan, PlanStream::kPull, v.arena[r] + L.done_offset(s, me), mine + L.one_offset());
    }
  }
  own_chunk_and_join(a, me, plan);
}

}  // namespace

void build_allgather_plan(const ArenaLayout& L, const RankView& v, const AllGatherArgs& a,
                          SlotRange slots, uint64_t* slot_cursor, std::vector<PlanOp>* plan,
                          CeDirection direction) {
  // Push splits a slot into one sub-slot per rank; a slot too small for that (never the case
  // with the configurable sizes, but nothing else guarantees it) uses the pull plan.
  if (direction == CeDirection::kPush && push_piece_bytes(L, v.nranks) > 0)
    return build_push_plan(L, v, a, slots, slot_cursor, plan);
  const int me = v.rank, n = v.nranks;
  const uint64_t mine = v.arena[me];
  fork_from_user(plan);

  const uint64_t npieces = (a.bytes + L.slot_bytes - 1) / L.slot_bytes;
  for (uint64_t j = 0; j < npieces; ++j) {
    const int s =
        slots.first + static_cast<int>((*slot_cursor)++ % static_cast<uint64_t>(slots.count));
    const uint64_t off = j * L.slot_bytes;
    const uint64_t pb = std::min(L.slot_bytes, a.bytes - off);
    // Copy-in: take slot s back from every peer, fill it, tell every peer.
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      take_token(plan, PlanStream::kCopyIn, mine + L.done_offset(s, p));
    }
    push(plan, PlanStream::kCopyIn, PlanOpKind::kCopy, mine + L.slot_offset(s), a.send + off, pb);
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      give_token(plan, PlanStream::kCopyIn, v.arena[p] + L.ready_offset(s, me),
                 mine + L.one_offset());
    }
    // Pull: peers in rotated order so that no peer is read by everyone at once.
    for (int k = 1; k < n; ++k) {
      const int p = (me + n - k) % n;
      take_token(plan, PlanStream::kPull, mine + L.ready_offset(s, p));
      push(plan, PlanStream::kPull, PlanOpKind::kCopy, a.recv + p * a.bytes + off,
           v.arena[p] + L.slot_offset(s), pb);
      give_token(plan, PlanStream::kPull, v.arena[p] + L.done_offset(s, me), mine + L.one_offset());
    }
  }
  own_chunk_and_join(a, me, plan);
}

}  // namespace zc
