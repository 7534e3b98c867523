// A communicator's call chain: the collectives NCCL accepted on it so far, in call order, as a
// count and a 64-bit rolling hash that every rank computes alike. NCCL requires every rank to
// issue a communicator's collectives in the same order with the same sizes, so two ranks whose
// chains differ at a routed all-gather have drifted apart (one skipped or added an op): the
// exchange's posts carry the chain (op_exchange.h), and a difference poisons the communicator
// instead of pairing two different all-gathers that happen to have the same size.
//
// Folded: every collective but ncclSend and ncclRecv (their order inside a group may differ
// between ranks), over what every rank passes alike — which collective, the count and datatype
// of a reducing one and its built-in reduction (a custom reduction's handle is the rank's own,
// so only "custom" is folded), the bytes of one that reduces nothing (NCCL moves those as bytes,
// whatever datatype names them), the root of a rooted one. Never buffers, streams or whether
// the op is in place.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>

#include "route.h"

namespace zc {

// The collectives a chain tells apart. ncclBcast is folded as a broadcast: it is NCCL's in-place
// ncclBroadcast, and ranks may mix the two.
enum class ChainedCall : uint32_t {
  kNone = 0,  // not folded (send, receive)
  kAllGather,
  kAllReduce,
  kReduceScatter,
  kReduce,
  kBroadcast,
  kAlltoAll,
  kGather,
  kScatter,
};

constexpr int kNoRoot = -1;       // an op without a root
constexpr int kNoReduction = -1;  // an op that reduces nothing

// One accepted call, as folded.
struct ChainLink {
  ChainedCall call = ChainedCall::kNone;
  uint64_t count = 0;
  int datatype = 0;
  int root = kNoRoot;
  int op = kNoReduction;
};

// A chain's value between two calls.
struct ChainPoint {
  uint64_t calls = 0;  // links folded so far
  uint64_t hash = 0;
};

// Codes of a reduction beside the built-in ones (below ncclNumOps), in one byte.
constexpr uint64_t kNoReductionCode = 0xfe;
constexpr uint64_t kCustomReductionCode = 0xff;
// A reduction as every rank names it, for the call chain and the exchange's posts: built-in ones
// by value, every custom one alike (NCCL numbers a communicator's own ops apart on each rank,
// ncclUserRedOpMangle, by the communicator's address).
constexpr uint64_t agreed_reduction(int op) {
  return op < 0                              ? kNoReductionCode
         : op < static_cast<int>(ncclNumOps) ? static_cast<uint64_t>(op)
                                             : kCustomReductionCode;
}

namespace chain_detail {
// Any nonzero start: a chain of no calls must not hash to 0, the value of a zeroed post.
constexpr uint64_t kSeed = 0x9e3779b97f4a7c15ull;
// MurmurHash3's 64-bit finalizer: a bijection whose every output bit depends on every input bit;
// mixed after each word, the state depends on the words' order too.
constexpr uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

// NCCL's datatypes (ncclNumTypes of them) fit one byte; collective, datatype and reduction one
// byte each and the root 32 bits make one word.
inline uint64_t next(uint64_t hash, const ChainLink& l) {
  const bool bytes = l.op == kNoReduction;
  const uint64_t size = bytes ? l.count * nccl_type_size(l.datatype) : l.count;
  const uint64_t type = bytes ? 0 : static_cast<uint64_t>(l.datatype & 0xff);
  const uint64_t what = static_cast<uint64_t>(l.call) | (type << 8) |
                        (agreed_reduction(l.op) << 16) |
                        (static_cast<uint64_t>(static_cast<uint32_t>(l.root)) << 32);
  return mix(mix(hash ^ size) ^ what);
}
}  // namespace chain_detail

// The chain of one communicator. Only the thread issuing on the communicator folds (NCCL forbids
// issuing on one communicator from two threads at once); relaxed atomics keep a misuse from
// being a data race, at the price of plain loads and stores.
class CallChain {
 public:
  ChainPoint now() const {
    return {calls_.load(std::memory_order_relaxed), hash_.load(std::memory_order_relaxed)};
  }
  // Folds `link` (nothing for ChainedCall::kNone) and returns the point before it.
  ChainPoint fold(const ChainLink& link) {
    const ChainPoint before = now();
    if (link.call == ChainedCall::kNone) return before;
    hash_.store(chain_detail::next(before.hash, link), std::memory_order_relaxed);
    calls_.store(before.calls + 1, std::memory_order_relaxed);
    return before;
  }
  // Back to an earlier point: the calls since were never launched (a simulated group's end).
  void rewind(ChainPoint to) {
    hash_.store(to.hash, std::memory_order_relaxed);
    calls_.store(to.calls, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> hash_{chain_detail::kSeed};
};

}  // namespace zc
