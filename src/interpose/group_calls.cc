#include "group_calls.h"

#include <algorithm>
#include <tuple>

#include "comm_children.h"
#include "comm_create.h"
#include "comm_order.h"
#include "group_state.h"
#include "local_group_allgather.h"

namespace zc {
namespace {

// The deferred ops in the order the ranks issue them: by communicator key, each communicator's
// in program order. NCCL launches a group's communicators in the order of their hashes
// (ncclGroupCommJoin), so an application may name them in any order on each rank; issued in
// program order, a rank whose stream holds A before B and a peer whose stream holds B before A
// wait on each other's flags for ever.
void in_launch_order(std::vector<PendingOp>* ops) {
  std::stable_sort(ops->begin(), ops->end(), [](const PendingOp& a, const PendingOp& b) {
    return std::tie(a.key.hi, a.key.lo) < std::tie(b.key.hi, b.key.lo);
  });
}

}  // namespace

ncclResult_t group_start(const RealNccl& real) {
  group_state().depth++;
  return real.ncclGroupStart();
}

ncclResult_t group_end(const RealNccl& real) {
  GroupState& g = group_state();
  if (g.depth != 1) {  // an inner end (or one without a start): NCCL's business alone
    if (g.depth > 0) g.depth--;
    return real.ncclGroupEnd();
  }
  // Before NCCL's outermost end starts the inits of the group: their joins.
  auto joins = std::move(g.pending_joins);
  g.pending_joins.clear();
  for (auto& [st, plan] : joins) route_join(*st, plan);
  order_before_group_end();  // the grouped ops NCCL launches now, after the routed ones before
  ncclResult_t r = real.ncclGroupEnd();
  g.depth = 0;
  order_after_group_end(r);
  auto after_end = std::move(g.after_end);
  g.after_end.clear();
  for (auto& read : after_end) read();
  children_at_group_end(r);
  auto freezes = std::move(g.pending_freezes);
  auto ops = std::move(g.pending_ops);
  g.pending_freezes.clear();
  g.pending_ops.clear();
  for (auto& st : freezes)
    if (r == ncclSuccess)
      freeze_when_ready(*st, /*on_app_thread=*/true);
    else if (r != ncclInProgress)
      route_teardown(*st);  // NCCL's init failed: nothing of ours ran
  if (ops.empty()) return r;
  // The deferred ops, inside one NCCL group of their own: a thread that drives several
  // communicators must group the calls of those that go to NCCL.
  in_launch_order(&ops);
  real.ncclGroupStart();
  g.running_deferred = true;
  ncclResult_t first = run_group_ops(ops);
  g.running_deferred = false;
  ncclResult_t end = real.ncclGroupEnd();
  if (first == ncclSuccess) first = end;
  if (r == ncclSuccess || (r == ncclInProgress && first != ncclSuccess && first != ncclInProgress))
    r = first;
  return r;
}

}  // namespace zc
