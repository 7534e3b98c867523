// The per-op exchange of the zero-copy all-gather: how the ranks of a committed communicator
// learn, op by op, where each other's buffers are and who moves which bytes, without any rank's
// application thread ever waiting for a peer to arrive.
//
// It lives in the communicator's channel segment (channel.h), after the membership slots, in
// host memory every member maps (and registers with CUDA, so that streams can wait on and write
// its flags). Indexed by communicator rank.
//
// Glossary
//   seq      the op's number on this communicator, from 1, counted alike on every rank (NCCL
//            requires every rank to issue a communicator's collectives in the same order).
//   slot     seq % kOpRing: where op `seq` is posted; reused kOpRing ops later, once every
//            rank has finished with it (`finished`).
//   post     what a rank publishes for its op: mode, count, datatype, its communicator's call
//            chain before the op (call_chain.h), its buffers (addresses for peers in its
//            process, exported extents for the others), whether they can be reached at all.
//            Complete before the rank arrives.
//   arrival  one word per slot: the set of ranks that arrived at op `seq`. A rank arriving
//            learns the set that arrived before it, atomically. Of every pair, the one that
//            arrived later issues both copies (its own chunk into the earlier's buffer and the
//            earlier's chunk into its own), since it alone knows both buffers; the earlier one
//            only announces its buffers ready and waits until the later one is done with them.
//   verdict  whether op `seq` takes the copy engines or goes to NCCL on every rank. The first
//            rank to reach the slot's verdict word decides it from its own post (route, if its
//            buffers can be reached; else NCCL) with one compare-and-swap, just before it
//            arrives, and every other rank follows: a per-op choice, taken once for all. (The
//            decider may arrive after a rank that followed it: arrival order only settles the
//            pairs, and a rank whose buffers no peer reaches is staged whatever its place.)
//            Captured ops are decided alike; their post also names the poster's flag block
//            (capture_blocks.h), since a graph cannot replay the ring's counting flags.
//   pair     how a pair of ranks moves its two chunks, settled once per op by a compare-and-swap
//            on the pair's word, so both see the same answer: the later rank claims "each
//            pushes" on arrival (the earlier one then writes its own chunk into the later one's
//            buffer: both GPUs' copy engines work); an earlier rank that gave up waiting for
//            the later one claims "later does both" (the later rank then also pulls). Measured
//            on H200 (tests/gpu/probes/import_copy_probe.cu): one GPU's copies to and from
//            another process's cuMem memory run one after the other, so a pair runs at twice
//            the speed when each GPU moves one direction.
//   ready    flag ready[r][slot] = seq (low 32 bits): rank r's buffers are ready for op seq
//            (written by r's stream once the work before the op is done).
//   done     flag done[r][p][slot] = seq: rank p has finished with r's buffers for op seq.
//   pushed   flag pushed[r][slot] = seq: rank r's pushes into the ranks that arrived after it
//            and claimed "each pushes" are done. An eager rank never waits for those claims:
//            the process's push issuer (push_issuer.h) issues the pushes once they come, on a
//            stream of its own, and writes this flag after them; r's push stream waits for it.
//            Flags only grow (seq), so a stream waits "greater or equal" and nobody resets them.
//   landed   flag landed[r][q] = g + 1: rank q's pushes of the reduce-scatters' slice g into
//            r's scratch have landed (reduce_scatter_plan.h). Slices are numbered across the
//            communicator's routed reduce-scatters, alike on every rank (rs_slices()).
//   freed    flag freed[r] = g + 1: rank r has summed slice g; its scratch buffer is free.
//   stage    where a rank whose own buffers its peers cannot reach (cudaMalloc memory across
//            processes, host or managed memory) is reached instead when ranks arrive after it:
//            the first rank's verdict already sent the op to the copy engines, and a later rank
//            must not be sent elsewhere. The rank publishes it right after arriving, before
//            anything that could wait; a later rank that finds the rank's post unreachable
//            waits for it (the rank is inside this op, doing host work only). stage_buffer.h.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "capture_blocks.h"

namespace zc {

constexpr uint32_t kOpRing = 16;
// Per buffer: the physical allocations one post can describe. PyTorch's expandable segments
// are 20 MiB allocations, so 512 is a 10 GiB receive buffer (a 405B model's FSDP2 layer is
// about 7.4 GiB in bf16). Posts are copied only as far as they are used (copy_post), so the
// bound costs the channel's shared memory (32 KiB a post), not time.
constexpr uint32_t kMaxExtents = 512;
constexpr uint32_t kOpRanks = 64;  // ranks the exchange can serve

enum class OpMode : uint32_t { kEager = 1, kCaptured = 2 };
// Which collective a post is for: ranks at one seq with different ones drifted apart.
enum class OpCollective : uint32_t { kAllGather = 0, kReduceScatter = 1 };
enum class OpVerdict : uint32_t { kRoute = 1, kNccl = 2 };
enum class PairMode : uint32_t { kEachPushes = 1, kLaterDoesBoth = 2 };

// How a rank's buffers can be reached by its peers.
enum OpReach : uint32_t {
  kReachPointer = 1u << 0,  // by address, from the GPUs of its own process
  kReachExtents = 1u << 1,  // by importing the extents, from other processes
};

// One physical allocation a buffer lies in: its mapping in the poster's address space, and
// the token its exported descriptor is kept under in the poster's fd service.
struct OpExtent {
  uint64_t base = 0, bytes = 0;
  uint64_t block_id = 0;  // CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: never reused in a process
  uint64_t token = 0;
};

struct OpBuffer {
  uint64_t addr = 0, bytes = 0;
  // Where the peers in the owner's process reach it, when not at addr: a second mapping of its
  // cuMem allocations open to their GPUs (local_aliases.h), addr's byte at local_addr.
  uint64_t local_addr = 0;
  uint32_t nextents = 0, reserved = 0;
  OpExtent extents[kMaxExtents];
  // Back to an empty description; the extents past nextents are never read, so they stay.
  void clear() {
    addr = bytes = local_addr = 0;
    nextents = reserved = 0;
  }
};

// A stage as published: one allocation of the op's receive size, laid out like the receive
// buffer (the rank's own chunk at its slot, where later ranks pull it; later ranks push theirs
// into their slots).
struct OpStage {
  uint64_t addr = 0, bytes = 0;
  OpExtent extent;  // the whole allocation, for peers in other processes
};

// A post as a plain value (copied in and out of shared memory).
struct OpPost {
  uint64_t seq = 0;
  OpMode mode = OpMode::kEager;
  uint32_t reach = 0;  // OpReach bits
  uint64_t count = 0;
  int32_t datatype = 0;
  int32_t pid = 0;
  OpCollective collective = OpCollective::kAllGather;
  int32_t redop = 0;  // a reduce-scatter's ncclRedOp_t
  // The communicator's call chain before this op (call_chain.h): posts of one seq whose chains
  // differ come from ranks that drifted apart, whatever their counts.
  uint64_t calls = 0, chain = 0;
  CaptureRef block;  // captured ops: the poster's flag block (capture_blocks.h)
  OpBuffer send, recv;
  // Back to a fresh post without touching the extent arrays (OpPost{} would write all 32 KiB).
  void clear();
};

// Copies the used part of `in`: its fields and each buffer's first nextents extents.
void copy_post(OpPost* out, const OpPost& in);

// The result of arriving at an op.
struct Arrival {
  uint64_t seq = 0;
  uint64_t before = 0;  // ranks that arrived earlier (bit r = rank r)
  OpVerdict verdict = OpVerdict::kNccl;
  // Empty when the posts agree; else why not (a mode, count, datatype or call chain differs:
  // the ranks issue different ops, which must poison the communicator), and the first earlier
  // rank whose post differs (its post is in `earlier`, unless it arrived without one).
  const char* mismatch = "";
  uint32_t mismatch_rank = 0;
};

class OpExchange {
 public:
  // Bytes the region needs for `nranks` ranks (a multiple of the page size).
  static size_t region_bytes(uint32_t nranks);
  // Where the part the GPUs read and write begins (a multiple of the page size): the flags and
  // the captured ops' flag blocks, to the end of the region. Only that part is registered with
  // CUDA; the posts before it are host-only, so their room costs shared memory, never pinned
  // memory.
  static size_t device_offset(uint32_t nranks);
  // Over a zero-filled region of region_bytes(nranks) bytes at `base` (page aligned).
  OpExchange(void* base, uint32_t nranks);

  // Publishes `mine` (mine.seq set) for `rank` and arrives: returns the arrival, with the
  // posts of the ranks that arrived before copied into `earlier` (indexed by rank). Waits only
  // while the ring is full: `seq` - kOpRing not finished by every rank (a rank that ran that
  // far ahead); `give_up` is asked while waiting and ends the wait (returns false).
  template <typename GiveUp>
  bool arrive(uint32_t rank, const OpPost& mine, Arrival* out, OpPost* earlier, GiveUp give_up);

  // The op's verdict: this rank's proposal if it is the first to decide (one compare-and-swap
  // on the slot's word), else the one decided. arrive() decides just before it joins; public so
  // that a test can stop a rank between the two. Never waits: no rank ever waits for another
  // rank's decision, so a rank that dies or stops anywhere in its arrival holds nobody.
  OpVerdict decide(const OpPost& mine);

  // `rank` aborted (or revoked) the communicator after posting op `seq`. `clean`: its streams
  // had run everything of those ops, so every wait a peer has on it passed for real (the release
  // that follows an abort lets the others pass too, without its copies).
  void leave(uint32_t rank, uint64_t seq, bool clean);
  // Whether a peer left so that the ops `me` arrived at cannot all be right: it left with work
  // of its own still queued, or before it posted one of them. A peer that left cleanly after
  // every op of this rank is no error for it: NCCL's abort is local too, and this rank's other
  // ops (those NCCL runs) complete as they would without the route.
  bool peer_left(uint32_t me) const;
  // Whether any rank left: no later op can pair.
  bool anyone_left() const;

  // This rank has finished reading the posts of op `seq` (its slot may be reused).
  void finish(uint32_t rank, uint64_t seq);

  // The pair (earlier, later) of op `seq`: claims `want` unless the pair is settled already,
  // and returns the settled mode. Never waits.
  PairMode settle_pair(uint32_t earlier, uint32_t later, uint64_t seq, PairMode want);
  // Whether the pair is settled for op `seq` (an earlier rank polls this while it waits).
  bool pair_settled(uint32_t earlier, uint32_t later, uint64_t seq) const;
  // The post of `rank` for op `seq` (it must have arrived), copied into *out.
  bool read_post(uint32_t rank, uint64_t seq, OpPost* out) const;
  // `rank`'s stage for op `seq`: published once by the rank, read by later ranks (false while
  // it is not there yet).
  void publish_stage(uint32_t rank, uint64_t seq, const OpStage& stage);
  bool read_stage(uint32_t rank, uint64_t seq, OpStage* out) const;

  // Flag addresses in the region (host addresses; the caller maps them for its streams).
  uint32_t* ready_flag(uint32_t rank, uint64_t seq);
  uint32_t* done_flag(uint32_t rank, uint32_t peer, uint64_t seq);
  uint32_t* pushed_flag(uint32_t rank, uint64_t seq);
  uint32_t* landed_flag(uint32_t owner, uint32_t pusher);
  uint32_t* freed_flag(uint32_t owner);
  // The reduce-scatters' slices this rank has routed so far (the next one's number), and their
  // advance by an op's `n` slices, which returns the op's first. Counted by each rank alike:
  // every rank routes the same ops (their verdict is shared) with the same slices (a pure
  // function of the op, reduce_scatter_plan.h).
  uint64_t rs_slices() const { return rs_slices_; }
  uint64_t take_rs_slices(uint64_t n) {
    const uint64_t first = rs_slices_;
    rs_slices_ += n;
    return first;
  }
  // Every flag, for release: [flags_begin, flags_begin + flag_count).
  uint32_t* flags_begin();
  size_t flag_count() const;
  // Releases every wait of every rank on this exchange with plain host stores, no CUDA call:
  // each flag moved far ahead of `seq` (flags compare as wrapping counters, and no rank runs
  // more than kOpRing ops ahead of another), the reduce-scatters' far ahead of rs_slices()
  // (no rank is more than one op's slices ahead of another), and the captured ops' blocks
  // released for good.
  void release_all(uint64_t seq);

  // The flag blocks of captured ops, after the rest of the region.
  CaptureBlocks& blocks() { return blocks_; }

  uint32_t nranks() const { return nranks_; }

 private:
  struct Shared;
  bool ring_free(uint32_t rank, uint64_t seq) const;
  void post(uint32_t rank, const OpPost& mine);
  Arrival join(uint32_t rank, const OpPost& mine, OpPost* earlier);
  Shared* shared_;
  uint32_t nranks_;
  CaptureBlocks blocks_;
  uint64_t rs_slices_ = 0;
};

// One rank's OpExchange::finish in op order, where a job of the push issuer (push_issuer.h)
// still reads a later rank's post of an op after the application's thread moved on: the rank
// says it finished op n only once nothing reads the posts of op n or any before it (a peer may
// reuse the slot of every op up to what this rank says).
class PostsRead {
 public:
  // A job will read the posts of op `seq` (said before the job is handed over).
  void job_coming(uint64_t seq);
  // The application's thread is done with op `seq`.
  void op_done(OpExchange& ops, uint32_t me, uint64_t seq);
  // The job of op `seq` is done with them.
  void job_done(OpExchange& ops, uint32_t me, uint64_t seq);

 private:
  void publish(OpExchange& ops, uint32_t me);
  std::mutex mu_;
  uint64_t through_ = 0;           // the last op the application's thread was done with
  std::vector<uint64_t> pending_;  // ops whose job still reads posts, in op order
};

template <typename GiveUp>
bool OpExchange::arrive(uint32_t rank, const OpPost& mine, Arrival* out, OpPost* earlier,
                        GiveUp give_up) {
  for (uint32_t spins = 0; !ring_free(rank, mine.seq); ++spins)
    if (give_up(spins)) return false;
  post(rank, mine);
  *out = join(rank, mine, earlier);
  return true;
}

}  // namespace zc
