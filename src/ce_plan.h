// The copy-engine all-gather protocol, as a plan: a list of stream operations per stream.
// Pure (addresses are plain integers), so that the CPU tests can run the plans of several
// simulated ranks against each other and check data, flags and slot reuse; ce_exec.cc
// turns the same plan into CUDA driver calls.
//
// Glossary
//   arena   one rank's symmetric pool: [flags | slots], registered as an NCCL window, so a
//           byte at offset X of my arena is at offset X of every peer's arena.
//   slot    a staging area of `slot_bytes` in the arena; a rank copies a piece of its send
//           chunk into a slot and its peers pull it from there.
//   round   the part of one rank's chunk that goes through one slot (at most slot_bytes).
//   piece   what one ready flag announces. In pull mode the first round of an op is cut into
//           pieces that grow 4x (slot/16, slot/4, ...): its copy-in and the peers' pulls
//           overlap at once, and an op needs only a handful of flags; later rounds are one
//           piece (their copy-in overlaps the previous round's pulls).
//   ready[s][j][r]  flag in MY arena: rank r's piece j of slot s is there for me (r sets it).
//   done[s][p]      flag in MY arena: peer p has finished with my slot s (p sets it), once
//                   per round.
// Measured on H200 (docs/PERFORMANCE.md): every stream operation costs a copy-engine channel
// about 2.5 us, so the plan keeps the operations per byte low; the own chunk has a stream of
// its own so that it never holds up the next op's copy-in.
// Two directions share this structure:
//   pull  the sender copies its piece into its own slot s; receivers read it from there.
//         ready[s][r] (receiver's arena): r's slot s is full; done[s][p] (sender's arena):
//         p has read it.
//   push  the sender writes its piece from its send buffer straight into the receiver's slot
//         s, in the sub-slot of that sender (n-1 per slot, see push_subslot), and the
//         receiver copies it out into its recvbuff.
//         ready[s][r] (receiver's arena): sub-slot r of slot s is full; done[s][p] (sender's
//         arena): p has drained it. There is no copy-in, and the ready flag travels right
//         behind the data on the same stream.
// Streams: kCopyIn copies in (pull) or sends (push); kPull pulls (pull) or drains (push);
// kLocal hands drained sub-slots back (push). Copy engines run one copy at a time: a peer
// flag queued on another stream waits until the copy engine finishes the copy in progress,
// so no latency-critical flag may sit behind a long copy of another stream.
// Flags hold 0 or 1 and are reset by their consumer, so a flag's state after an op is the
// same as before it: the plan needs no sequence numbers and eager ops can be replayed.
// Initial state: ready = 0 (nothing to pull), done = 1 (every slot free).
#pragma once

#include <cstdint>
#include <vector>

namespace zc {

constexpr int kMaxRanks = 64;
constexpr int kMaxPieces = 8;  // ready flags per slot and rank

// A piece's copies to (push) or from (pull) every peer go out as one batch on one stream, as
// in NCCL's CE all-gather: the driver spreads a batch's copies over the copy engines. Measured
// on H200 (docs/PERFORMANCE.md): with one stream per peer instead, zerocta reached 219 / 185
// GB/s busbw on 4 / 8 GPUs (one stream visiting peers in turn: 255 on 4), NCCL's batch 362 / 371.
enum class PlanStream : uint8_t { kUser = 0, kCopyIn = 1, kPull = 2, kLocal = 3, kCount = 4 };
constexpr int kPlanStreams = static_cast<int>(PlanStream::kCount);
// Events: 0 = the user's stream at the op's start; s = the end of stream s (push re-records
// event 3 per drained sub-slot before kLocal's final record).
constexpr int kPlanEvents = kPlanStreams;

enum class PlanOpKind : uint8_t {
  kWaitEq1,  // wait until the local 32-bit flag at dst == 1
  kWrite0,   // write 0 to the local 32-bit flag at dst
  kCopy,     // copy bytes from src to dst (local or peer memory) on a copy engine
  kSignal,   // copy the 32-bit constant 1 at src into the (usually peer) flag at dst
  // Consecutive kCopy ops of one stream may run as one batch: concurrently, in any order,
  // and only together complete (the same for consecutive kSignal ops). So no op of such a
  // run may touch what another op of the run writes; a flag never shares a run with its data.
  kRecord,     // record event `event` on this stream
  kWaitEvent,  // make this stream wait for event `event`
};

struct PlanOp {
  PlanStream stream;
  PlanOpKind kind;
  uint8_t event;
  uint8_t reserved[5];  // explicit, zeroed: plans compare bytewise
  uint64_t dst, src, bytes;
};

// Slots [0, eager_slots) serve eager ops; [eager_slots, nslots) serve ops captured into CUDA
// graphs, so that a replay never races an eager op for the same flag.
struct ArenaLayout {
  uint64_t flags_bytes = 0;  // size of the flag region at the start of the arena
  uint64_t slot_bytes = 0;
  uint64_t first_piece_bytes = 0;  // first piece of an op's first round (pull)
  int nslots = 0;
  int eager_slots = 0;
  // Offsets inside an arena.
  uint64_t ready_offset(int slot, int from_rank, int piece = 0) const;
  uint64_t done_offset(int slot, int from_peer) const;
  uint64_t one_offset() const;     // holds the constant 1 used by kSignal
  uint64_t marker_offset() const;  // written at setup, read by peers to verify peer pointers
  uint64_t slot_offset(int slot) const;
  uint64_t arena_bytes() const;
  // A layout for `pool_bytes` of slots of `chunk_bytes` (nslots = pool/chunk).
  static ArenaLayout make(uint64_t pool_bytes, uint64_t chunk_bytes);
};

struct RankView {
  int rank = 0, nranks = 0;
  uint64_t arena[kMaxRanks] = {};  // every rank's arena base in MY address space (mine too)
};

struct AllGatherArgs {
  uint64_t send = 0, recv = 0;  // user buffers
  uint64_t bytes = 0;           // bytes per rank (sendcount * typesize)
};

enum class CeDirection : uint8_t { kPull, kPush };

// Which slots an op may use: eager ops and captured ops each have their own range.
struct SlotRange {
  int first = 0, count = 0;
};

// Appends the plan for one all-gather. `slot_cursor` counts the slots taken (modulo the range);
// the caller decides where it starts (ce_allgather: at 0 for every op).
void build_allgather_plan(const ArenaLayout& layout, const RankView& view,
                          const AllGatherArgs& args, SlotRange slots, uint64_t* slot_cursor,
                          std::vector<PlanOp>* plan, CeDirection direction = CeDirection::kPull);

// Pieces of a round of `bytes` (pull mode): one, or for an op's first round pieces growing
// 4x from `first` (the last takes the rest). Returns their count (<= kMaxPieces).
int split_round(uint64_t bytes, uint64_t first, bool first_round, uint64_t out[kMaxPieces]);

// Pieces of a push op of `bytes`, largest first: sub-slots of `sub` bytes, then 4x-shrinking
// ones down to a sixteenth, so that the last drain (nothing overlaps it) is short.
int split_push(uint64_t bytes, uint64_t sub, std::vector<uint64_t>* out);

// Bytes of one sender's piece in push mode: a slot split into one sub-slot per peer (0 when
// the slot has fewer bytes than there are peers: build_allgather_plan then pulls).
uint64_t push_piece_bytes(const ArenaLayout& layout, int nranks);

// Push: the sub-slot of `receiver`'s slot that `sender` writes, in [0, nranks-1). A receiver
// never writes its own slot, so it needs no sub-slot for itself.
int push_subslot(int sender, int receiver, int nranks);

}  // namespace zc
