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

// Wraps the ops a plan appended since `start`: the internal streams they use first wait for
// the user's stream, and the user's stream then waits for the end of each of them. Streams the
// op does not use get nothing (every event operation costs its stream time).
void fork_join(std::vector<PlanOp>* plan, size_t start) {
  bool used[kPlanStreams] = {};
  for (size_t i = start; i < plan->size(); ++i) used[static_cast<int>((*plan)[i].stream)] = true;
  std::vector<PlanOp> fork;
  fork.push_back(PlanOp{PlanStream::kUser, PlanOpKind::kRecord, 0, {}, 0, 0, 0});
  for (int s = 1; s < kPlanStreams; ++s)
    if (used[s])
      fork.push_back(PlanOp{static_cast<PlanStream>(s), PlanOpKind::kWaitEvent, 0, {}, 0, 0, 0});
  plan->insert(plan->begin() + static_cast<long>(start), fork.begin(), fork.end());
  for (int s = 1; s < kPlanStreams; ++s)
    if (used[s])
      push(plan, static_cast<PlanStream>(s), PlanOpKind::kRecord, 0, 0, 0, static_cast<uint8_t>(s));
  for (int s = 1; s < kPlanStreams; ++s)
    if (used[s])
      push(plan, PlanStream::kUser, PlanOpKind::kWaitEvent, 0, 0, 0, static_cast<uint8_t>(s));
}

// The own chunk (unless the op is in place). Local copies share one copy engine, so where it
// goes decides what it delays: pull puts it behind the op's copy-ins, push before its drains.
void own_chunk(const AllGatherArgs& a, int me, PlanStream stream, std::vector<PlanOp>* plan) {
  const uint64_t own = a.recv + static_cast<uint64_t>(me) * a.bytes;
  if (a.send != own) push(plan, stream, PlanOpKind::kCopy, own, a.send, a.bytes);
}

}  // namespace

uint64_t ArenaLayout::ready_offset(int slot, int from_rank, int piece) const {
  return ((static_cast<uint64_t>(slot) * kMaxPieces + piece) * kMaxRanks + from_rank) * kFlag;
}
uint64_t ArenaLayout::done_offset(int slot, int from_peer) const {
  const uint64_t ready_flags = static_cast<uint64_t>(nslots) * kMaxPieces * kMaxRanks;
  return (ready_flags + static_cast<uint64_t>(slot) * kMaxRanks + from_peer) * kFlag;
}
uint64_t ArenaLayout::one_offset() const {
  return static_cast<uint64_t>(nslots) * (kMaxPieces + 1) * kMaxRanks * kFlag;
}
uint64_t ArenaLayout::marker_offset() const { return one_offset() + 64; }
uint64_t ArenaLayout::slot_offset(int slot) const {
  return flags_bytes + static_cast<uint64_t>(slot) * slot_bytes;
}
uint64_t ArenaLayout::arena_bytes() const { return flags_bytes + slot_bytes * nslots; }

// More slots add nothing but flags (2.3 KiB each) and setup time (a memset per slot): an op
// never has more than a few pieces in flight.
constexpr uint64_t kMaxSlots = 64;

ArenaLayout ArenaLayout::make(uint64_t pool_bytes, uint64_t chunk_bytes) {
  ArenaLayout l;
  // At least 4 slots: 2 for eager ops and 2 for captured graphs, each pair enough to overlap
  // one piece's copy-in with the previous piece's pulls. A pool too small for 4 chunks gets
  // smaller slots rather than growing past ZEROCTA_POOL_BYTES.
  if (pool_bytes / chunk_bytes >= 4) {
    // uint64_t until clamped: pool / chunk can exceed INT_MAX (e.g. 128T / 64K).
    l.nslots = static_cast<int>(std::min<uint64_t>(pool_bytes / chunk_bytes, kMaxSlots));
    l.slot_bytes = chunk_bytes;
  } else {
    l.nslots = 4;
    l.slot_bytes = pool_bytes / 4;
    if (l.slot_bytes >= 4096) l.slot_bytes &= ~uint64_t{4095};
  }
  // The first piece of an op: small enough that its copy-in costs little before the first
  // pull starts, 4 KiB-aligned like every later piece offset.
  l.first_piece_bytes = l.slot_bytes / 16;
  if (l.first_piece_bytes >= 4096) l.first_piece_bytes &= ~uint64_t{4095};
  if (l.first_piece_bytes == 0) l.first_piece_bytes = 1;
  // A quarter (at least 2) for captured graphs, the rest for eager ops.
  l.eager_slots = l.nslots - std::max(2, l.nslots / 4);
  // Flags, the constant and the marker, rounded to the window alignment so slots are 4 KiB
  // aligned (copy engines run fastest on aligned, large pieces).
  uint64_t need = l.marker_offset() + 64;
  l.flags_bytes = (need + 4095) / 4096 * 4096;
  return l;
}

int split_round(uint64_t bytes, uint64_t first, bool first_round, uint64_t out[kMaxPieces]) {
  if (!first_round || first == 0 || bytes <= 2 * first) {
    out[0] = bytes;
    return 1;
  }
  int n = 0;
  uint64_t off = 0, piece = first;
  // Each piece is at most 4x the one before it (the last up to 5x): copying it in, at local
  // memory speed, takes less time than pulling the previous one over NVLink, so the pulls
  // never wait for the copy-in once they have started.
  while (off < bytes) {
    const uint64_t rest = bytes - off;
    const uint64_t take = (n == kMaxPieces - 1 || rest < 2 * piece) ? rest : piece;
    out[n++] = take;
    off += take;
    piece *= 4;
  }
  return n;
}

int push_subslot(int sender, int receiver, int nranks) {
  return (sender - receiver - 1 + nranks) % nranks;
}

uint64_t push_piece_bytes(const ArenaLayout& L, int nranks) {
  uint64_t sub = L.slot_bytes / static_cast<uint64_t>(nranks > 1 ? nranks - 1 : 1);
  return sub >= 4096 ? sub & ~uint64_t{4095} : sub;
}

int split_push(uint64_t bytes, uint64_t sub, std::vector<uint64_t>* out) {
  std::vector<uint64_t> rev;  // from the end
  uint64_t t = sub / 16 >= 4096 ? (sub / 16) & ~uint64_t{4095} : sub;
  while (bytes > 0) {
    const uint64_t take = std::min(t, bytes);
    rev.push_back(take);
    bytes -= take;
    t = std::min(t * 4, sub);
  }
  out->assign(rev.rbegin(), rev.rend());
  return static_cast<int>(out->size());
}

namespace {

// Push: each rank writes its pieces straight from sendbuff into the peers' slots (stream
// kCopyIn, on the copy engine that carries NVLink traffic), the ready flag right behind the
// data on the same stream, so it arrives as soon as the data. Receivers drain their slots
// into recvbuff with local copies (kPull) and hand each sub-slot back from a third stream
// (kLocal): a flag written to a peer has to queue on that same copy engine, and on kPull it
// would hold up the next drain for as long as a whole piece takes to send.
void build_push_plan(const ArenaLayout& L, const RankView& v, const AllGatherArgs& a,
                     SlotRange slots, uint64_t* slot_cursor, std::vector<PlanOp>* plan) {
  const int me = v.rank, n = v.nranks;
  const uint64_t mine = v.arena[me];
  const uint64_t sub = push_piece_bytes(L, n);
  const size_t start = plan->size();
  own_chunk(a, me, PlanStream::kPull, plan);  // the drain stream idles until a piece lands
  std::vector<uint64_t> pieces;
  split_push(a.bytes, sub, &pieces);
  uint64_t off = 0;
  for (uint64_t pb : pieces) {
    const int s =
        slots.first + static_cast<int>((*slot_cursor)++ % static_cast<uint64_t>(slots.count));
    // Take the sub-slots back from every peer, then send all of them as one batch, then the
    // ready flags as another (stream order puts each flag behind its data).
    for (int k = 1; k < n; ++k)
      take_token(plan, PlanStream::kCopyIn, mine + L.done_offset(s, (me + k) % n));
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      push(plan, PlanStream::kCopyIn, PlanOpKind::kCopy,
           v.arena[p] + L.slot_offset(s) + push_subslot(me, p, n) * sub, a.send + off, pb);
    }
    for (int k = 1; k < n; ++k)
      give_token(plan, PlanStream::kCopyIn, v.arena[(me + k) % n] + L.ready_offset(s, me),
                 mine + L.one_offset());
    for (int k = 1; k < n; ++k) {
      const int r = (me + n - k) % n;
      take_token(plan, PlanStream::kPull, mine + L.ready_offset(s, r));
      push(plan, PlanStream::kPull, PlanOpKind::kCopy, a.recv + r * a.bytes + off,
           mine + L.slot_offset(s) + push_subslot(r, me, n) * sub, pb);
      // Event 3 is re-recorded per sub-slot: each wait applies to the record just before it.
      push(plan, PlanStream::kPull, PlanOpKind::kRecord, 0, 0, 0, 3);
      push(plan, PlanStream::kLocal, PlanOpKind::kWaitEvent, 0, 0, 0, 3);
      give_token(plan, PlanStream::kLocal, v.arena[r] + L.done_offset(s, me),
                 mine + L.one_offset());
    }
    off += pb;
  }
  fork_join(plan, start);
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
  const size_t start = plan->size();

  const uint64_t nrounds = (a.bytes + L.slot_bytes - 1) / L.slot_bytes;
  for (uint64_t j = 0; j < nrounds; ++j) {
    const int s =
        slots.first + static_cast<int>((*slot_cursor)++ % static_cast<uint64_t>(slots.count));
    const uint64_t off = j * L.slot_bytes;
    uint64_t pieces[kMaxPieces];
    const int np =
        split_round(std::min(L.slot_bytes, a.bytes - off), L.first_piece_bytes, j == 0, pieces);
    // Copy-in: take slot s back from every peer, then fill it piece by piece, telling every
    // peer about each piece.
    for (int k = 1; k < n; ++k)
      take_token(plan, PlanStream::kCopyIn, mine + L.done_offset(s, (me + k) % n));
    uint64_t at = 0;
    for (int q = 0; q < np; ++q) {
      push(plan, PlanStream::kCopyIn, PlanOpKind::kCopy, mine + L.slot_offset(s) + at,
           a.send + off + at, pieces[q]);
      for (int k = 1; k < n; ++k) {
        const int p = (me + k) % n;
        give_token(plan, PlanStream::kCopyIn, v.arena[p] + L.ready_offset(s, me, q),
                   mine + L.one_offset());
      }
      at += pieces[q];
    }
    // Pull: piece by piece, once every peer announced it, one batch of copies from all peers
    // (rotated order); the slots go back to their owners once per round.
    at = 0;
    for (int q = 0; q < np; ++q) {
      for (int k = 1; k < n; ++k)
        take_token(plan, PlanStream::kPull, mine + L.ready_offset(s, (me + n - k) % n, q));
      for (int k = 1; k < n; ++k) {
        const int p = (me + n - k) % n;
        push(plan, PlanStream::kPull, PlanOpKind::kCopy, a.recv + p * a.bytes + off + at,
             v.arena[p] + L.slot_offset(s) + at, pieces[q]);
      }
      at += pieces[q];
    }
    for (int k = 1; k < n; ++k) {
      const int p = (me + n - k) % n;
      give_token(plan, PlanStream::kPull, v.arena[p] + L.done_offset(s, me), mine + L.one_offset());
    }
  }
  own_chunk(a, me, PlanStream::kCopyIn, plan);  // after every copy-in of the op
  fork_join(plan, start);
}

}  // namespace zc
