// The zero-copy all-gather of one rank for one op, as a plan: a list of stream operations.
// Pure (addresses are integers), so that the CPU tests run the plans of several simulated ranks
// against each other; ce_exec.cc turns it into CUDA driver calls.
//
// Every byte is one copy between application buffers, on copy engines. Of each pair of ranks,
// the one that arrived later at the op (op_exchange.h) issues both copies: its own chunk into
// the earlier rank's receive buffer (a push) and the earlier rank's chunk into its own receive
// buffer (a pull), on two streams, since on one stream they would run one after the other. The
// earlier rank issues no copy for that pair: it announces its buffers ready and waits until the
// later one is done with them. Out of place, a rank copies its own chunk on a third stream
// (a same-GPU copy); in place there is nothing to copy.
//
//   user   record kEvStart                                             ... wait kEvEnd
//   push   wait kEvStart; write ready[me]=seq; wait ready[e]>=seq for every earlier e;
//          record kEvReady; push my chunk to every earlier e; wait kEvPulled;
//          write done[e][me]=seq for every earlier e; wait done[me][l]>=seq for every later l;
//          wait kEvLocal; record kEvEnd
//   pull   wait kEvReady; pull every earlier e's chunk; record kEvPulled
//   local  wait kEvStart; copy my chunk (out of place only); record kEvLocal
//
// The user's stream only records and waits on events: no copy and no flag wait sits on it.
#pragma once

#include <cstdint>
#include <vector>

namespace zc {

constexpr int kMaxRanks = 64;  // ranks the route serves

enum class DirectStream : uint8_t { kUser = 0, kPush = 1, kPull = 2, kLocal = 3, kCount = 4 };
constexpr int kDirectStreams = static_cast<int>(DirectStream::kCount);

enum DirectEvent : uint8_t { kEvStart = 0, kEvReady = 1, kEvPulled = 2, kEvLocal = 3, kEvEnd = 4 };
constexpr int kDirectEvents = 5;

enum class DirectOpKind : uint8_t {
  kWaitGeq,    // wait until the 32-bit flag at dst, as a wrapping counter, is >= value
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

// One contiguous piece of a peer's buffer as this rank addresses it: a buffer that lies in
// several physical allocations is mapped piecewise (peer_memory.h).
struct Span {
  uint64_t addr = 0, bytes = 0;
};

// What one rank needs to know to build its plan for one op.
struct DirectOpView {
  int rank = 0, nranks = 0;
  uint32_t seq = 0;        // low 32 bits of the op's number
  uint64_t chunk = 0;      // bytes per rank
  uint64_t send = 0, recv = 0;  // my buffers
  uint64_t before = 0;     // ranks that arrived earlier (bit r)
  // For every earlier rank e: where its chunk is (to pull from) and where my chunk goes in its
  // receive buffer (to push to), in my address space, as spans of `chunk` bytes in total.
  std::vector<Span> pull_from[kMaxRanks], push_to[kMaxRanks];
  // Flags, as my streams address them.
  uint64_t ready[kMaxRanks] = {};      // ready[r] of this op's slot
  uint64_t done_to[kMaxRanks] = {};    // done[e][me]: I signal earlier rank e
  uint64_t done_from[kMaxRanks] = {};  // done[me][l]: later rank l signals me
};

// Appends the plan (clears nothing: the caller reuses one vector).
void build_direct_plan(const DirectOpView& v, std::vector<DirectOp>* plan);

}  // namespace zc
