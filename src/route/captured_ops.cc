#include "captured_ops.h"

#include "cuda_driver.h"
#include "log.h"
#include "stats.h"

namespace zc {
namespace {

// Holds whose graphs are gone, waiting for an application thread to free them.
std::mutex g_graveyard_mu;
std::vector<GraphHold*>* g_graveyard = new std::vector<GraphHold*>;  // used at exit too

void user_object_gone(void* hold) { graph_gone(static_cast<GraphHold*>(hold)); }

}  // namespace

CaptureLife::~CaptureLife() {
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  ScopedDevice on(device_);
  stage_.reset();
  rs_scratch_.reset();
  imports_.reset();
  if (registered_) {
    cu->cuMemHostUnregister(registered_);
    stats_pool_bytes_add(-static_cast<int64_t>(registered_bytes_));
  }
  ops_owned_.reset();  // over the channel's op region: before the channel
  channel_owned_.reset();
}

void CaptureLife::hand_over(std::unique_ptr<Channel> channel, void* registered,
                            size_t registered_bytes, std::unique_ptr<PeerImports> imports,
                            std::unique_ptr<OpExchange> ops,
                            std::unique_ptr<StageBuffer> stage,
                            std::unique_ptr<RsScratch> rs_scratch) {
  ops_owned_ = std::move(ops);
  stage_ = std::move(stage);
  rs_scratch_ = std::move(rs_scratch);
  channel_owned_ = std::move(channel);
  registered_ = registered;
  registered_bytes_ = registered_bytes;
  imports_ = std::move(imports);
}

bool CaptureLife::holds_graphs() {
  std::lock_guard<std::mutex> lock(mu_);
  return !live_.empty();
}

void CaptureLife::add(GraphHold* h) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.insert(h);
  h->suspect = h->broken;  // a broken op can never pair: suspect from the start
  suspects_ += h->suspect ? 1 : 0;
}

void CaptureLife::remove(GraphHold* h) {
  std::lock_guard<std::mutex> lock(mu_);
  if (live_.erase(h) && h->suspect) --suspects_;
}

bool CaptureLife::broken_replay(uint32_t rank, const char** why) {
  std::lock_guard<std::mutex> lock(mu_);
  // Orphaning is for good (for a block's generation): a hold found orphaned once is a suspect
  // until its graph goes, and only suspects need their started word read.
  if (const uint64_t epoch = blocks_->orphan_epoch(); epoch != seen_epoch_) {
    seen_epoch_ = epoch;
    for (GraphHold* h : live_) {
      bool orphaned = blocks_->orphaned(rank, h->mine);
      for (const auto& [owner, ref] : h->peers) orphaned |= blocks_->orphaned(owner, ref);
      if (orphaned && !h->suspect) {
        h->suspect = true;
        ++suspects_;
      }
    }
  }
  if (suspects_ == 0) return false;
  for (GraphHold* h : live_)
    if (h->suspect && CaptureBlocks::signalled(blocks_->started(rank, h->mine))) {
      *why =
          "a CUDA graph replayed a collective whose peer graph was destroyed without ever "
          "being replayed (a capture discarded or retried on one rank only)";
      return true;
    }
  return false;
}

GraphHold::~GraphHold() {
  if (!stage || !life) return;
  ScopedDevice on(life->device());
  stage.reset();
}

void graph_gone(GraphHold* h) {
  CaptureBlocks& b = h->life->blocks();
  const bool replayed = CaptureBlocks::signalled(b.started(h->rank, h->mine));
  // Never replayed here while a peer still holds the op: the peer's replays cannot pair.
  bool peer_replayed = false;
  auto orphan_if_held = [&](uint32_t owner, CaptureRef ref) {
    if (replayed || b.refs(owner, ref) <= 1) return;
    b.orphan(owner, ref);
    peer_replayed |= owner != h->rank && CaptureBlocks::signalled(b.started(owner, ref));
  };
  orphan_if_held(h->rank, h->mine);
  for (const auto& [owner, ref] : h->peers) orphan_if_held(owner, ref);
  if (peer_replayed) {
    // A peer's replay has started on it already: it could only have been released.
    ZC_WARN(
        "copy-engine route on rank %u: a CUDA graph holding op %llu was destroyed without "
        "ever being replayed while a peer replayed it; the communicator is poisoned",
        h->rank, static_cast<unsigned long long>(h->seq));
    h->life->channel().poison(ncclRemoteError);
    b.release_all();
  }
  b.drop(h->rank, h->mine);
  for (const auto& [owner, ref] : h->peers) b.drop(owner, ref);
  for (ViewPin& p : h->pins) p->fetch_sub(1);
  h->pins.clear();
  h->life->remove(h);
  std::lock_guard<std::mutex> lock(g_graveyard_mu);
  g_graveyard->push_back(h);
}

CUgraph capturing_graph(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  if (cuda_driver()->cuStreamGetCaptureInfo(stream, &status, nullptr, &graph, nullptr, nullptr) !=
      CUDA_SUCCESS)
    return nullptr;
  return status == CU_STREAM_CAPTURE_STATUS_ACTIVE ? graph : nullptr;
}

bool attach_to_graph(std::unique_ptr<GraphHold> hold, CUgraph graph, const char** why) {
  const CudaDriver& cu = *cuda_driver();
  GraphHold* h = hold.release();
  h->life->add(h);
  CUuserObject object = nullptr;
  if (cu.cuUserObjectCreate(&object, h, user_object_gone, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) !=
      CUDA_SUCCESS) {
    graph_gone(h);
    *why = "cannot create a CUDA user object";
    return false;
  }
  if (cu.cuGraphRetainUserObject(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE) != CUDA_SUCCESS) {
    *why = "cannot hand a CUDA user object to the graph";
    return false;  // the object keeps the hold; it is released with the process
  }
  stats_op_captured();
  return true;
}

void collect_gone_graphs() {
  std::vector<GraphHold*> gone;
  {
    std::lock_guard<std::mutex> lock(g_graveyard_mu);
    if (g_graveyard->empty()) return;
    gone.swap(*g_graveyard);
  }
  for (GraphHold* h : gone) delete h;
}

}  // namespace zc
