// The reduce-scatter of one rank for one op, as a plan: a list of stream operations, pure
// (addresses are integers) so that the CPU tests run the plans of several simulated ranks
// against each other, as direct_plan.h does for the all-gather.
//
// Rank r's output chunk is the sum of chunk r of every rank's input. The copy engines bring the
// peers' chunks r into r's own scratch, pulling them from the peers' input buffers (mapped here
// as the all-gather maps them, peer_memory.h); a small kernel (chunk_sum.h) then sums r's own
// chunk and those copies into r's output, reading this GPU's memory only. The op goes in
// slices, so that the sum of one slice runs while the next is pulled; the scratch holds two
// slices of every peer (kRsBuffers), so a slice's pulls wait only for the sum two slices back.
//
//   user    record kRsStart ...                                                wait kRsEnd
//   pull    wait kRsStart; write ready[me]=seq; wait ready[p]>=seq for every peer p;
//           per slice i (buffer b = i % 2): [i >= 2: wait kRsReduced+b]; copy peer p's
//           slice i of chunk me into scratch[b][p] for p = me+1, me+2, ...; record kRsPulled+b;
//           after the last: write done[p][me]=seq for every peer (I read its input);
//           wait done[me][p]>=seq for every peer (it read mine); wait kRsReduced+last b;
//           record kRsEnd
//   reduce  per slice i: wait kRsPulled+b (after the start, through the pulls); sum my
//           chunk's slice i and scratch[b][...] into my output's slice i; record kRsReduced+b
//           where a wait follows (pulls two slices on; the end, for the last)
//
// The sum's order is fixed: my own chunk first (NCCL's pre-multiplied sums fuse it last,
// chunk_sum.cu), then the peers me+1, me+2, ... (mod n). Flags are the op exchange's ready and
// done words (op_exchange.h), counters set to the op's number as the all-gather's are.
#pragma once

#include <cstdint>
#include <vector>

#include "direct_plan.h"

namespace zc {

enum class RsStream : uint8_t { kUser = 0, kPull = 1, kReduce = 2, kCount = 3 };
constexpr int kRsStreams = static_cast<int>(RsStream::kCount);

// Scratch buffers a slice of every peer: two, so that pulling slice i+1 overlaps summing i.
constexpr int kRsBuffers = 2;
enum RsEvent : uint8_t {
  kRsStart = 0,
  kRsPulled = 1,   // + buffer: the slice in that buffer has been pulled
  kRsReduced = 3,  // + buffer: the slice in that buffer has been summed (the buffer is free)
  kRsEnd = 5,
};
constexpr int kRsEvents = 6;

enum class RsOpKind : uint8_t {
  kWaitGeq,    // wait until the 32-bit flag at dst, as a wrapping counter, is >= value
  kWrite,      // write value to the 32-bit flag at dst
  kCopy,       // copy bytes from src to dst
  kSum,        // dst = the sum of src and the nsrc - 1 slots at aux, aux + stride, ...
  kRecord,     // record event `event` on this stream
  kWaitEvent,  // make this stream wait for event `event`
};

struct RsOp {
  RsStream stream;
  RsOpKind kind;
  uint8_t event;
  uint8_t nsrc;
  uint32_t value;
  uint64_t dst, src, aux, stride, bytes;
};

// What one rank needs to know to build its plan for one op.
struct RsOpView {
  int rank = 0, nranks = 0;
  uint32_t seq = 0;     // low 32 bits of the op's number
  uint64_t chunk = 0;   // bytes of one rank's output
  uint64_t slice = 0;   // bytes of a slice (the last may be shorter); rs_slice_bytes
  uint64_t send = 0;    // my input: nranks chunks
  uint64_t recv = 0;    // my output chunk (in place: send + rank * chunk)
  uint64_t scratch = 0;  // mine: rs_scratch_bytes
  uint64_t peer_send[kMaxRanks] = {};  // peer p's input, as my streams address it
  // Flags, as my streams address them: ready[r] of this op's slot; done_to[p] = done[p][me]
  // (I finished reading p's input); done_from[p] = done[me][p].
  uint64_t ready[kMaxRanks] = {};
  uint64_t done_to[kMaxRanks] = {};
  uint64_t done_from[kMaxRanks] = {};
};

// The slice of an op whose output chunk is `chunk` bytes of `elem`-byte elements: a pure
// function of what every rank of the op knows alike. Whole elements, 256-byte aligned.
uint64_t rs_slice_bytes(uint64_t chunk, uint64_t elem);
// The scratch an op of `nranks` ranks with slices of `slice` bytes needs.
uint64_t rs_scratch_bytes(int nranks, uint64_t slice);

// Appends the plan (clears nothing: the caller reuses one vector).
void build_reduce_scatter_plan(const RsOpView& v, std::vector<RsOp>* plan);

}  // namespace zc
