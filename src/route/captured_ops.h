// Routed collectives captured into CUDA graphs (all-gathers, and reduce-scatters over tokens of
// their own, reduce_scatter_plan.h): what a graph keeps alive, and what happens when a graph
// goes.
//
// A captured op is posted and paired like an eager one (op_exchange.h: the same verdict, the
// same pair settlement, no rendezvous — a rank that captures never waits for a peer beyond the
// pair wait), with the captured mode in its post: one rank capturing where another runs the op
// eagerly is a mismatch, an error on every rank. Its plan is the eager plan over a flag block of
// its own (capture_blocks.h), issued on capture streams of the route's own and joined back into
// the application's capture; imports and mappings are made in relaxed capture mode (PyTorch
// captures in global mode). Replays of two ranks' graphs pair in launch order: graphs that share
// a communicator must be replayed in the same order on every rank, one at a time (as NCCL's
// own captured collectives must).
//
// Lifetimes. A graph may outlive its communicator (an abort while a replay waits: the abort
// releases every wait, and the replay still runs its last copies and flag writes), so what its
// nodes address — the channel's registered flags, the peers' imported buffers, a stage — is
// kept until the graph is destroyed:
//   GraphHold   one captured op's references: its flag blocks, pins on the views its copies use,
//               its own stage if it needed one. Owned by a CUDA user object moved into the
//               graph; CUDA destroys it from a thread of its own once the graph and every
//               instantiation of it are gone and their work has finished.
//   CaptureLife per communicator (shared by the route and every hold): the holds alive, and
//               after the teardown what the route handed over instead of freeing (channel,
//               registration, imports). Freed with its last reference.
// The destruction callback makes no CUDA call (CUDA forbids it): it drops references and marks
// orphans with host stores, then hands the hold to a graveyard that the next safe point (a
// routed all-gather or a teardown, on an application thread) empties, which frees the rest.
//
// A graph destroyed without ever being replayed while a peer's graph still holds the same op
// (a capture discarded, or retried, on one rank only) orphans the op's blocks: every wait on
// them is released at once, so the peer's replays never hang, and the peer's host, finding its
// own replay of an orphaned op started, poisons the communicator — an error on every rank, not
// a wrong result passed off as right. The same capture destroyed on every rank is no error.
#pragma once

#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "capture_blocks.h"
#include "channel.h"
#include "op_exchange.h"
#include "peer_memory.h"
#include "rs_scratch.h"
#include "stage_buffer.h"

namespace zc {

struct CommState;
struct GraphHold;

class CaptureLife {
 public:
  // Over the communicator's channel (`channel`: its poison word and op region, where `blocks`
  // lie) on `device`; both null for a communicator that never prepared (no graph can hold it).
  CaptureLife(Channel* channel, CaptureBlocks* blocks, int device)
      : channel_(channel), blocks_(blocks), device_(device) {}
  ~CaptureLife();  // frees what the teardown handed over: call on an application thread
  CaptureLife(const CaptureLife&) = delete;
  CaptureLife& operator=(const CaptureLife&) = delete;

  CaptureBlocks& blocks() { return *blocks_; }
  Channel& channel() { return *channel_; }
  int device() const { return device_; }

  // The route's teardown: what graphs (and the route's own streams, parked_routes.h) may still
  // address, freed with the last reference — the
  // op exchange too, which owns the blocks' bookkeeping (`blocks` points into it): a graph
  // destroyed after its communicator still drops its references there.
  void hand_over(std::unique_ptr<Channel> channel, void* registered, size_t registered_bytes,
                 std::unique_ptr<PeerImports> imports, std::unique_ptr<OpExchange> ops,
                 std::unique_ptr<StageBuffer> stage, std::unique_ptr<RsScratch> rs_scratch);

  // Whether a graph of captured ops still holds one of the communicator's ops.
  bool holds_graphs();
  // Holds alive (their graphs exist).
  void add(GraphHold* h);
  void remove(GraphHold* h);
  // Whether a hold alive has had a replay started on an op that can never pair; `why` says
  // which. Cheap when no block was orphaned since the last call.
  bool broken_replay(uint32_t rank, const char** why);

 private:
  Channel* channel_;
  CaptureBlocks* blocks_;
  int device_;
  std::mutex mu_;
  std::set<GraphHold*> live_;
  uint64_t seen_epoch_ = 0;
  size_t suspects_ = 0;  // live holds that can never pair
  // Handed over at the teardown.
  std::unique_ptr<Channel> channel_owned_;
  std::unique_ptr<OpExchange> ops_owned_;
  void* registered_ = nullptr;
  size_t registered_bytes_ = 0;
  std::unique_ptr<PeerImports> imports_;
  std::unique_ptr<StageBuffer> stage_;  // the route's eager stage (captured ops hold their own)
  std::unique_ptr<RsScratch> rs_scratch_;
};

struct GraphHold {
  std::shared_ptr<CaptureLife> life;
  uint32_t rank = 0;
  uint64_t seq = 0;
  CaptureRef mine;                                     // this rank's block
  std::vector<std::pair<uint32_t, CaptureRef>> peers;  // the peers' blocks it refers to
  std::vector<ViewPin> pins;                           // views its copies use
  std::unique_ptr<StageBuffer> stage;                  // where it needed one of its own
  bool broken = false;   // a peer's block was gone already at capture: it can never pair
  bool suspect = false;  // broken, or one of its blocks orphaned (CaptureLife's, under its lock)
  ~GraphHold();          // frees the stage: on an application thread (the graveyard)
};

// The graph being captured on `stream`: null when the capture is no longer active (an earlier
// operation of the application invalidated it) or cannot be asked about.
CUgraph capturing_graph(CUstream stream);

// Hands `hold` to `graph` (a CUDA user object moved into it). False with *why when CUDA refuses
// (the hold then goes as a graph that never ran).
bool attach_to_graph(std::unique_ptr<GraphHold> hold, CUgraph graph, const char** why);

// The graph of `hold` is gone without CUDA: what attach_to_capture's user object runs.
void graph_gone(GraphHold* hold);

// Frees the holds whose graphs are gone (and the communicators' leftovers they kept): on an
// application thread, outside any group.
void collect_gone_graphs();

}  // namespace zc
