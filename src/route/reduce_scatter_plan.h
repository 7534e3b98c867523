// The reduce-scatter of one rank for one op, as a plan: a list of stream operations, pure
// (addresses are integers) so that the CPU tests run the plans of several simulated ranks
// against each other, as direct_plan.h does for the all-gather.
//
// Rank r's output chunk is the sum of chunk r of every rank's input. Each rank's copy engines
// push chunk p of its input into peer p's scratch (rs_scratch.h: allocated by the library at the
// communicator's creation, mapped by every peer once), and a small kernel (chunk_sum.h) sums
// r's own chunk and what its peers pushed into r's output, reading this GPU's memory only.
// Why pushes into a scratch and not pulls from the peers' inputs: a rank that arrives first
// knows nothing of a later peer's buffers, and would have to wait for it or leave its copies to
// a thread (the all-gather's push issuer); the scratch is known to all from the start, so every
// rank issues its whole op at once, from any memory its own copy engines read.
//
// The op goes in slices, so that the sum of one slice runs while the next is pushed. The
// scratch holds two slices of every peer (kRsBuffers). Slices are numbered across the
// communicator's routed reduce-scatters (`first_slice`, alike on every rank); slice g lands in
// buffer g % 2, and a peer pushes it only once the owner summed slice g - 2 from that buffer.
//
//   user    record kRsStart ...                                              wait kRsEnd
//   push    wait kRsStart; per slice g: [g >= 2: wait freed[p] >= g - 1 for every peer p];
//           copy slice g of my chunk p into p's scratch, buffer g % 2, my slot there, for
//           p = me+1, me+2, ...; write landed[p][me] = g + 1 for every peer;
//           after the last: wait kRsReduced; record kRsEnd
//   reduce  wait kRsStart; per slice g: wait landed[me][p] >= g + 1 for every peer; sum my
//           chunk's slice and my scratch's buffer g % 2 into my output's slice; write
//           freed[me] = g + 1; after the last: record kRsReduced
//
// The sum's order is fixed: my own chunk first (NCCL's pre-multiplied sums fuse it last,
// chunk_sum.cu), then the peers me+1, me+2, ... (mod n): peer me+j's slot in my scratch is j-1.
//
// A pre-multiplied sum made by ncclRedOpCreatePreMulSum multiplies each rank's input by that
// rank's own scalar, which only that rank knows (host-immediate, or device-resident and read
// when the op runs). So each rank pushes its scalar beside its slices: into the head of a
// peer's scratch, one word per buffer and pusher, copied before the first slice of the op that
// goes into that buffer (after the wait that frees it, before the landed write), which is where
// the peer's sums read it. A host-immediate scalar is first written into my own head's word, so
// that the copy engines have memory to copy it from.
//   push    [host scalar: write my scalar word]; per slice g of the op's first two: after the
//           freed waits, copy my scalar into each peer's head, word (g % 2, my slot there)
// Flags are the op exchange's landed and freed words (op_exchange.h); they compare as wrapping
// counters. The streams and events are the all-gather's (direct_plan.h): push is its push
// stream, reduce its pull stream, and kRsEnd its kEvEnd, so that NCCL's order among the
// communicator's ops (comm_order.h) holds for both collectives alike.
//
// A captured op (captured_ops.h) replays what it captured, so it cannot count: its flags are
// tokens (capture_blocks.h), one word per pair of ranks, buffer and direction, whose owner
// passes it back and forth — free (kRsTokenFree, written by the rank whose buffer it is) and
// landed (kRsTokenLanded, written by the rank that pushes into it); each side waits for the
// other's state before it writes its own, so neither write can overtake the other's wait. Its
// slices are numbered from 0 in every replay, into a scratch region of their own (the
// scratch's second half, rs_region_bytes), whose buffers are free when the op starts: the
// previous op that used them ended on this rank's stream before this one started.
//   reduce  wait kRsStart; for each buffer the op uses and each peer: write token_in free;
//           per slice i: wait token_in[p] landed for every peer; sum; [i + 2 < slices: write
//           token_in[p] free for every peer]
//   push    wait kRsStart; write started; per slice i: wait token_out[p] free for every peer;
//           [scalars]; copy; write token_out[p] landed for every peer
// An op that can never pair (`broken`: a peer's graph is gone already) only marks itself
// started: the host that sees that poisons the communicator (captured_ops.h).
#pragma once

#include <cstdint>
#include <vector>

#include "direct_plan.h"

namespace zc {

enum class RsStream : uint8_t { kUser = 0, kPush = 1, kReduce = 2, kCount = 3 };
constexpr int kRsStreams = static_cast<int>(RsStream::kCount);
static_assert(static_cast<int>(RsStream::kPush) == static_cast<int>(DirectStream::kPush) &&
                  static_cast<int>(RsStream::kReduce) == static_cast<int>(DirectStream::kPull),
              "the reduce-scatter runs on the all-gather's streams");

// Scratch buffers a slice of every peer: two, so that pushing slice g+1 overlaps summing g.
constexpr int kRsBuffers = 2;
// Ranks a reduce-scatter's sum takes (chunk_sum.h's sources).
constexpr int kRsMaxRanks = 8;
// The head of every scratch, before its slots: the words of the ranks' scalars (above).
constexpr uint64_t kRsHeadBytes = 256;
constexpr uint64_t kRsScalarWordBytes = 8;  // one element of any type the route sums, aligned
constexpr uint64_t kRsScalarSlotsAt = 64;   // my own scalar's word at 0, the pushed ones from here
static_assert(kRsScalarSlotsAt + kRsBuffers * kRsMaxRanks * kRsScalarWordBytes <= kRsHeadBytes,
              "the head holds a word per buffer and peer");
// My scalar's word in `scratch`'s head, and the word where `scratch`'s j-th peer (j from 1)
// pushes its scalar for buffer b.
constexpr uint64_t rs_own_scalar_word(uint64_t scratch) { return scratch; }
constexpr uint64_t rs_scalar_word(uint64_t scratch, int b, int j) {
  return scratch + kRsScalarSlotsAt +
         (static_cast<uint64_t>(b) * kRsMaxRanks + static_cast<uint64_t>(j - 1)) *
             kRsScalarWordBytes;
}
enum RsEvent : uint8_t { kRsStart = kEvStart, kRsReduced = kEvPulled, kRsEnd = kEvEnd };
constexpr int kRsEvents = kDirectEvents;

enum class RsOpKind : uint8_t {
  kWaitGeq,    // wait until the 32-bit flag at dst, as a wrapping counter, is >= value
  kWrite,      // write value to the 32-bit flag at dst
  kCopy,       // copy bytes from src to dst
  kSum,        // dst = the sum of src and the nsrc - 1 slots at aux, aux + stride, ...;
               // scalars != 0: their ranks' scalars at scalars, scalars + kRsScalarWordBytes, ...
  kRecord,     // record event `event` on this stream
  kWaitEvent,  // make this stream wait for event `event`
  kWaitToken,  // wait until the 64-bit word at dst holds `value` in its low half or is released
               // (capture_blocks.h)
};

// A captured op's token states (values a stream writes into a token's low half).
constexpr uint32_t kRsTokenFree = 1;
constexpr uint32_t kRsTokenLanded = 2;

struct RsOp {
  RsStream stream;
  RsOpKind kind;
  uint8_t event;
  uint8_t nsrc;
  uint32_t value;
  uint64_t dst, src, aux, stride, bytes, scalars;
};

// What one rank needs to know to build its plan for one op.
struct RsOpView {
  int rank = 0, nranks = 0;
  uint64_t first_slice = 0;  // the number of the op's first slice
  uint64_t chunk = 0;        // bytes of one rank's output
  uint64_t slice = 0;        // bytes of a slice (the last may be shorter); rs_slice_bytes
  uint64_t send = 0;         // my input: nranks chunks
  uint64_t recv = 0;         // my output chunk (in place: send + rank * chunk)
  uint64_t scratch = 0;      // mine (rs_scratch_bytes at least), as my streams address it
  uint64_t peer_scratch[kMaxRanks] = {};  // peer p's, as my streams address it
  // Flags, as my streams address them: landed_in[p] = landed[me][p], landed_out[p] =
  // landed[p][me], freed[p] = freed[p] (p = me: mine).
  uint64_t landed_in[kMaxRanks] = {};
  uint64_t landed_out[kMaxRanks] = {};
  uint64_t freed[kMaxRanks] = {};
  // A pre-multiplied sum of the ranks' own scalars: where my push stream copies mine from
  // (`scalar_bytes`, one element), 0 for any other op. `write_scalar`: a host-immediate scalar,
  // whose bits `scalar_bits` my push stream writes into my head's word first (scalar_src is
  // then that word).
  uint64_t scalar_src = 0;
  uint32_t scalar_bytes = 0;
  bool write_scalar = false;
  uint32_t scalar_bits = 0;
  // A captured op: its tokens (token_in[p][b]: my buffer b, peer p pushing into it; token_out
  // [p][b]: peer p's buffer b, me pushing), my block's started word, and whether it can never
  // pair. first_slice is 0 and scratch and peer_scratch address the captured region.
  bool captured = false;
  bool broken = false;
  uint64_t started = 0;
  uint64_t token_in[kMaxRanks][kRsBuffers] = {};
  uint64_t token_out[kMaxRanks][kRsBuffers] = {};
};

// A scratch is two regions: the first for ops issued eagerly, the second for captured ops
// (whose tokens cannot tell eager ops' counters when a buffer is free). The bytes of each on a
// communicator of `nranks` ranks whose setting (ZEROCTA_RS_SCRATCH) is `setting` bytes: half
// of it, or less where that holds two slices of the largest size of every peer. A scratch of
// twice that is enough; the captured region starts that far into it.
uint64_t rs_region_bytes(int nranks, uint64_t setting);
// The slice of an op whose output chunk is `chunk` bytes of `elem`-byte elements, on `nranks`
// ranks whose scratch regions are `region_bytes` each: a pure function of what every rank of
// the op knows alike. Whole elements, 256-byte aligned, two of every peer fit the region after
// its head; 0 when not even one aligned slice fits.
uint64_t rs_slice_bytes(uint64_t chunk, uint64_t elem, int nranks, uint64_t region_bytes);
// The slices of such an op.
uint64_t rs_slices(uint64_t chunk, uint64_t slice);
// The scratch region an op of `nranks` ranks with slices of `slice` bytes needs.
uint64_t rs_scratch_bytes(int nranks, uint64_t slice);

// Appends the plan (clears nothing: the caller reuses one vector).
void build_reduce_scatter_plan(const RsOpView& v, std::vector<RsOp>* plan);

}  // namespace zc
