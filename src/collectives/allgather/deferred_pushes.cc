#include "deferred_pushes.h"

#include <utility>
#include <vector>

#include "ce_exec.h"
#include "log.h"
#include "monotonic_clock.h"
#include "peer_reach.h"
#include "push_issuer.h"
#include "route_setup.h"
#include "stats.h"

namespace zc {
namespace {

class DeferredPushes : public IssuerJob {
 public:
  DeferredPushes(std::shared_ptr<CommState> st, uint64_t seq, uint64_t before, const OpPost& mine,
                 const DirectOpView& view)
      : st_(std::move(st)), seq_(seq), before_(before), mode_(mine.mode), count_(mine.count),
        datatype_(mine.datatype), view_(new DirectOpView(view)), handed_us_(monotonic_us()) {
    for (int p = 0; p < view.nranks; ++p)
      if (p != view.rank && view.peers[p].deferred) left_ |= uint64_t{1} << p;
  }

  Step step() override {
    CeComm* ce = st_->ce.get();
    if (!ce || !ce->ops) return Step::kDone;  // torn down (forget() dropped it first)
    OpExchange& ops = *ce->ops;
    const uint32_t me = static_cast<uint32_t>(st_->rank);
    // A failure released every flag (route_poison, leave): nothing left to issue.
    if (peer_failed(*st_)) {
      ce->posts_read.job_done(ops, me, seq_);
      return Step::kDone;
    }
    for (int q = 0; q < view_->nranks && left_; ++q) {
      const uint64_t bit = uint64_t{1} << q;
      if (!(left_ & bit)) continue;
      // A rank that arrived before me: I settled "each pushes" with it myself.
      const bool earlier = before_ & bit;
      if (!earlier && !ops.pair_settled(me, static_cast<uint32_t>(q), seq_)) continue;
      const bool each = earlier || ops.settle_pair(me, static_cast<uint32_t>(q), seq_,
                                                   PairMode::kLaterDoesBoth) ==
                                       PairMode::kEachPushes;
      if (each && !reach_peer(q)) return Step::kFailed;
      if (each && !earlier) stats_push_deferred(monotonic_us() - handed_us_);
      left_ &= ~bit;
      plan_.clear();
      build_deferred_push(*view_, each ? q : -1, !copied_, left_ == 0, &plan_);
      copied_ |= each;
      CUstream streams[kDirectStreams] = {};
      streams[static_cast<int>(DirectStream::kPush)] = ce->issuer_stream;
      const CUevent events[kDirectEvents] = {};
      if (CUresult r = issue_plan(*cuda_driver(), streams, events, nullptr, plan_, false);
          r != CUDA_SUCCESS) {
        why_ = cuda_error_string(r);
        return Step::kFailed;
      }
    }
    if (left_) return Step::kPending;
    ce->posts_read.job_done(ops, me, seq_);
    return Step::kDone;
  }

  void fail() override {
    LogDeviceScope tag(st_->device);
    ZC_WARN("zero-copy all-gather on rank %d: pushing op %llu into a later rank: %s; the "
            "communicator is poisoned",
            st_->rank, static_cast<unsigned long long>(seq_), why_);
    route_poison(*st_, peer_failed(*st_) ? ncclRemoteError : ncclSystemError);
  }

  const void* owner() const override { return st_.get(); }
  int device() const override { return st_->device; }

 private:
  // Later rank q claimed "each pushes": where my chunk goes in its receive buffer.
  bool reach_peer(int q) {
    static thread_local std::unique_ptr<OpPost> post(new OpPost);  // 32 KiB: off the stack
    CeComm& ce = *st_->ce;
    if (!ce.ops->read_post(static_cast<uint32_t>(q), seq_, post.get())) {
      why_ = "a peer settled a pair without its post";
      return false;
    }
    if (post->mode != mode_ || post->count != count_ || post->datatype != datatype_) {
      why_ = "a later rank issued another op at the same position";
      return false;
    }
    const uint64_t slot = static_cast<uint64_t>(st_->rank) * view_->chunk;
    return reach(*st_, q, seq_, *post, post->recv, post->recv.addr + slot, view_->chunk, nullptr,
                 &view_->peers[q].to, &why_);
  }

  std::shared_ptr<CommState> st_;
  uint64_t seq_;
  uint64_t before_;  // ranks that arrived before me
  OpMode mode_;
  uint64_t count_;
  int32_t datatype_;
  std::unique_ptr<DirectOpView> view_;  // 7 KiB
  int64_t handed_us_;                   // when the call handed it over
  uint64_t left_ = 0;                   // deferred peers not settled yet
  bool copied_ = false;
  const char* why_ = "";
  std::vector<DirectOp> plan_;
};

}  // namespace

bool can_defer_pushes(const CommState& st) {
  return st.ce && st.ce->issuer_stream && push_issuer_available(st.device);
}

void defer_pushes(std::shared_ptr<CommState> st, uint64_t seq, uint64_t before,
                  const OpPost& mine, const DirectOpView& view) {
  push_issuer_submit(
      std::unique_ptr<IssuerJob>(new DeferredPushes(std::move(st), seq, before, mine, view)));
}

}  // namespace zc
