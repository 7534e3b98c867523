// The zero-copy all-gather of one rank for one op, as a plan: a list of stream operations.
// Pure (addresses are integers), so that the CPU tests run the plans of several simulated ranks
// against each other; ce_exec.cc turns it into CUDA driver calls.
//
// Every byte is one copy between application buffers, on copy engines. Each pair of ranks
// moves its two chunks in one of two ways (op_exchange.h settles which):
//   each pushes       both ranks write their own chunk into the other's receive buffer;
//   later does both   the rank that arrived later writes its chunk into the earlier one's
//                     buffer (a push) and copies the earlier one's chunk into its own (a pull),
//                     on two streams; the earlier one only announces its buffers ready and waits
//                     until the later one is done with them.
// Out of place, a rank copies its own chunk on a third stream (a same-GPU copy); in place
// there is nothing to copy.
// A rank whose buffers its later peers cannot reach is reached through its stage instead
// (stage_buffer.h): it copies its own chunk into the stage's slot first, and each chunk a later
// peer pushed into the stage out into its receive buffer last (same-GPU copies, on the push
// stream, which orders them with the flags).
//
//   user   record kEvStart                                               ... wait kEvEnd
//   (each of my streams below starts with "wait kEvStart")
//   push   wait kEvStart; [staged: copy my chunk into the stage]; [eager, a peer copies with
//          me: write ready[me]=seq, wait ready[me]>=seq]; wait ready[p]>=seq for every peer
//          p I push to, in the order I push to them; my pushes; [wait kEvPulled]; write
//          [deferred: wait pushed[me]>=seq]; write
//          done[p][me]=seq for every p I copied to or from; wait done[me][p]>=seq for every p
//          that copies to or from me; [staged: copy the chunks of the peers that reached me
//          through the stage out of it]; [wait kEvLocal]; record kEvEnd
//   pull   (where I pull) wait kEvStart; wait ready[p]>=seq for every peer p I pull from; my
//          pulls; record kEvPulled (its own flag waits: the pulls start as soon as their peers
//          are ready, with no event hop from the push stream on the way)
//   local  (out of place) wait kEvStart; copy my chunk; record kEvLocal
//   issuer (the push issuer's stream, pushes to later peers deferred) wait ready[me]>=seq; for
//          each such peer p as it claims: wait ready[p]>=seq, copy my chunk into it; then
//          write pushed[me]=seq
//
// The user's stream holds nothing but the two events: no copy, no flag wait, no flag write
// (direct_plan.cc says what the ready write there cost).
//
// A captured op (captured_ops.h) has the same plan over its own flag block (capture_blocks.h):
// a graph replays the values it captured, so its flags are signals, consumed and reset by
// their one waiter rather than counters. The push stream first marks the op started; ready
// is one word per peer and stream that waits on it (ready_push/ready_pull); every wait is
// followed by the reset of its word on the same stream.
#pragma once

#include <cstdint>
#include <vector>

namespace zc {

constexpr int kMaxRanks = 64;  // ranks the route serves

enum class DirectStream : uint8_t { kUser = 0, kPush = 1, kPull = 2, kLocal = 3, kCount = 4 };
constexpr int kDirectStreams = static_cast<int>(DirectStream::kCount);

enum DirectEvent : uint8_t { kEvStart = 0, kEvPulled = 1, kEvLocal = 2, kEvEnd = 3 };
constexpr int kDirectEvents = 4;

enum class DirectOpKind : uint8_t {
  kWaitGeq,    // wait until the 32-bit flag at dst, as a wrapping counter, is >= value
  kWaitSignal,  // wait until the 64-bit word at dst is signalled or released (capture_blocks.h)
  kWrite,      // write value to the 32-bit flag at dst
  kCopy,       // copy bytes from src to dst
  kRecord,     // record event `event` on this stream
  kWaitEvent,  // make this stream wait for event `event`
};

struct DirectOp {
  DirectStream stream;
  DirectOpKind kind;
  uint8_t event;
  uint8_t reserved = 0;
  uint32_t value;
  uint64_t dst, src, bytes;
};

// A peer's buffer range as this rank addresses it (one range, also where its owner laid it across
// several physical allocations: peer_memory.h maps those back to back).
struct Span {
  uint64_t addr = 0, bytes = 0;
};

// What this rank does with one peer in one op.
struct PeerPart {
  bool push = false;         // write my chunk into the peer's receive buffer
  bool pull = false;         // copy the peer's chunk into my receive buffer
  bool peer_copies = false;  // the peer writes into or reads from my buffers: wait its done
  bool staged = false;       // ... through my stage: its chunk is copied out of it after
  // My push to this peer (a later rank that had not claimed when I returned) is issued by the
  // push issuer (push_issuer.h) once it claims: my push stream waits for `pushed` instead, and
  // then tells the peer done like any peer I copied to.
  bool deferred = false;
  // Where the peer's chunk is (pull) and where my chunk goes in its receive buffer (push), in
  // my address space: `chunk` bytes each.
  Span from, to;
};

// What one rank needs to know to build its plan for one op.
struct DirectOpView {
  int rank = 0, nranks = 0;
  uint32_t seq = 0;             // low 32 bits of the op's number
  uint64_t chunk = 0;           // bytes per rank
  uint64_t send = 0, recv = 0;  // my buffers
  uint64_t stage = 0;           // my stage, laid out like recv; 0 when my buffers are reached
  PeerPart peers[kMaxRanks];
  // Flags, as my streams address them.
  uint64_t ready[kMaxRanks] = {};      // eager: ready[r] of this op's slot
  uint64_t done_to[kMaxRanks] = {};    // done[p][me]: I tell peer p I am done with its buffers
  uint64_t done_from[kMaxRanks] = {};  // done[me][p]: peer p tells me
  uint64_t pushed = 0;                 // pushed[me]: where a peer's part is deferred
  // Captured ops: words of the blocks instead (done_to/done_from are words too).
  bool captured = false;
  uint64_t started = 0;                     // my block's
  uint64_t ready_push_out[kMaxRanks] = {};  // my block: my buffers are ready for p's push
  uint64_t ready_pull_out[kMaxRanks] = {};  // ... for p's pull
  uint64_t ready_push_in[kMaxRanks] = {};   // p's block: p's buffers are ready for my push
  uint64_t ready_pull_in[kMaxRanks] = {};   // ... for my pull
};

// Appends the plan (clears nothing: the caller reuses one vector).
void build_direct_plan(const DirectOpView& v, std::vector<DirectOp>* plan);

// The push issuer's part of an eager op (push_issuer.h), on its own stream (kPush in the plan):
// for each deferred peer in the order they claimed, after my own ready (`ready_me`, the first
// time: my send buffer holds the op's input), wait the peer's ready and push my chunk into it;
// after the last, write `pushed`. Appended step by step as peers claim: `first` until a step
// with a copy was appended, `last` with the last peer; `peer` -1 for one that I push nothing to
// (it settled "later does both": it does my part too).
void build_deferred_push(const DirectOpView& v, int peer, bool first, bool last,
                         std::vector<DirectOp>* plan);

}  // namespace zc
