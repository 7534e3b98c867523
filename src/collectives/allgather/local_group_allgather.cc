#include "local_group_allgather.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "ce_allgather.h"
#include "ce_exec.h"
#include "comm_order.h"
#include "direct_plan.h"
#include "local_aliases.h"
#include "local_group_plan.h"
#include "log.h"
#include "nvtx_ranges.h"
#include "peer_memory.h"
#include "route.h"
#include "route_setup.h"
#include "stats.h"

namespace zc {
namespace {

constexpr size_t kNone = SIZE_MAX;

// One routed all-gather per rank of one communicator, all in this group.
struct LocalSet {
  std::vector<size_t> by_rank;  // each rank's op, as an index into the group's ops
  size_t last = 0;              // where the set is issued: the position of its last op
  size_t instance = 0;          // sets of one communicator instance share it
  // Per rank, where the other GPUs write into its receive buffer when its owner did not grant
  // them access (local_aliases.h); 0: the buffer itself.
  std::vector<uint64_t> recv_for_peers;
};

const GroupedAllGather& ag(const std::vector<PendingOp>& ops, size_t i) {
  return *ops[i].allgather;
}

// The group's routed all-gathers of one communicator instance (one key): each rank's, in
// program order; `first` is the instance's first op, `per_rank` how many each rank has where
// every rank here has as many (else 0), `consistent` whether every op agrees on the size.
struct InstanceOps {
  size_t first = 0;
  std::map<int, std::vector<size_t>> of_rank;
  size_t per_rank = 0;
  bool consistent = true;
};

std::vector<InstanceOps> ops_by_instance(const std::vector<PendingOp>& ops) {
  std::vector<InstanceOps> out;
  std::vector<bool> seen(ops.size(), false);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (seen[i] || !ops[i].allgather || !ag(ops, i).st) continue;
    const CommState& comm = *ag(ops, i).st;
    if (!comm.key.valid()) continue;
    InstanceOps inst;
    inst.first = i;
    for (size_t j = i; j < ops.size(); ++j) {
      if (!ops[j].allgather || !ag(ops, j).st || !(ag(ops, j).st->key == comm.key)) continue;
      seen[j] = true;
      const CommState& st = *ag(ops, j).st;
      inst.consistent = inst.consistent && st.nranks == comm.nranks;
      inst.of_rank[st.rank].push_back(j);
    }
    inst.per_rank = inst.of_rank.begin()->second.size();
    for (const auto& [rank, mine] : inst.of_rank)
      if (mine.size() != inst.per_rank) inst.per_rank = 0;
    out.push_back(std::move(inst));
  }
  return out;
}

// The candidate sets. The routed all-gathers of one communicator instance (one key) in the
// group form sets when every rank has the same number of them: the i-th of each rank's make set
// i, alike in count and datatype. Else (a rank missing, or with more ops than another) all of
// the instance's ops go alone.
std::vector<LocalSet> find_sets(const std::vector<PendingOp>& ops) {
  std::vector<LocalSet> sets;
  for (const InstanceOps& inst : ops_by_instance(ops)) {
    const int n = ag(ops, inst.first).st->nranks;
    // Every rank 0 .. n-1 here, with as many ops each (the map's keys are sorted).
    if (n < 2 || n > kMaxRanks || !inst.consistent || inst.per_rank == 0 ||
        inst.of_rank.size() != static_cast<size_t>(n) || inst.of_rank.begin()->first != 0 ||
        inst.of_rank.rbegin()->first != n - 1)
      continue;
    bool whole = true;
    std::vector<LocalSet> found(inst.per_rank);
    for (size_t k = 0; k < found.size(); ++k) {
      found[k].instance = inst.first;
      found[k].by_rank.resize(static_cast<size_t>(n));
      const GroupedAllGather& first = ag(ops, inst.of_rank.at(0)[k]);
      for (const auto& [r, mine] : inst.of_rank) {
        const size_t at = mine[k];
        const GroupedAllGather& a = ag(ops, at);
        whole = whole && a.count == first.count && a.datatype == first.datatype;
        found[k].by_rank[static_cast<size_t>(r)] = at;
        if (at > found[k].last) found[k].last = at;
      }
    }
    if (whole) sets.insert(sets.end(), found.begin(), found.end());
  }
  return sets;
}

// Whether the set can go as one plan: every rank prepared and unpoisoned, in this process,
// not capturing, its receive buffer reachable by address from the other GPUs — directly, or
// through a second mapping of its cuMem memory open to them (set.recv_for_peers) — and its send
// buffer memory its own GPU copies from.
bool qualifies(const std::vector<PendingOp>& ops, LocalSet* set) {
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->ce_ok) return false;
  std::unique_ptr<OpBuffer> described(new OpBuffer);  // 16 KiB: off the stack
  int devices[kMaxRanks];
  for (size_t r = 0; r < set->by_rank.size(); ++r) devices[r] = ag(ops, set->by_rank[r]).st->device;
  set->recv_for_peers.assign(set->by_rank.size(), 0);
  for (size_t r = 0; r < set->by_rank.size(); ++r) {
    const size_t k = set->by_rank[r];
    const GroupedAllGather& a = ag(ops, k);
    CommState& st = *a.st;
    if (st.route.load(std::memory_order_acquire) != RouteState::kCommitted ||
        route_prepare(st) != ncclSuccess || route_peer_poison(st) != ncclSuccess ||
        st.poisoned.load() != ncclSuccess)
      return false;  // alone, the op reports what is wrong
    // Only sets number the ops of a communicator whose ranks are all here, so the ranks' counts
    // move in step; a rank out of step (a guard) sends the sets to NCCL.
    if (!st.ce->all_local() || st.ce->seq != ag(ops, set->by_rank[0]).st->ce->seq) return false;
    const CUstream stream = reinterpret_cast<CUstream>(a.stream);
    if (stream_is_capturing(stream)) return false;
    ScopedDevice dev(st.device);
    const uint64_t chunk = a.count * nccl_type_size(a.datatype);
    const uint64_t total = chunk * static_cast<uint64_t>(st.nranks);
    if (!dev.ok()) return false;
    const uint64_t recv = reinterpret_cast<uint64_t>(a.recv),
                   send = reinterpret_cast<uint64_t>(a.send);
    MappedBlock own;
    if (!describe_buffer(*cu, recv, total, st.ce->needs, described.get()) &&
        !local_alias(*cu, recv, total, devices, static_cast<int>(set->by_rank.size()),
                     &set->recv_for_peers[r]))
      return false;
    if (!describe_buffer(*cu, send, chunk, st.ce->needs, described.get()) &&
        !mapped_block_at(*cu, send, &own))
      return false;
  }
  return true;
}

// Issues a qualifying set: each rank's direct plan in turn, on its device, every rank under
// its communicator's lock. A failure poisons every rank's communicator: a peer's stream may
// already wait on a flag of this op, which the poison releases.
// After a local set was issued (`res`): each rank's op counted, or its communicator poisoned.
void settle_rank(const GroupedAllGather& a, int n, CUresult res) {
  CommState& st = *a.st;
  if (res != CUDA_SUCCESS) {
    ZC_WARN(
        "zero-copy all-gather on rank %d, issued with every rank of its communicator: %s; "
        "the communicator is poisoned",
        st.rank, cuda_error_string(res));
    route_poison(st, ncclUnhandledCudaError);
    return;
  }
  if (!st.ce->told_local_group) {
    st.ce->told_local_group = true;
    ZC_INFO(
        "zero-copy all-gather on rank %d/%d: this thread issues every rank of the "
        "communicator in one group, so their all-gathers go together, no op exchange (each "
        "GPU pushes its chunk; flags in host memory hand over between the GPUs)",
        st.rank, n);
  }
  stats_count(zerocta_op_allgather, zerocta_route_ce, a.total);
  stats_op_local_group();
}

ncclResult_t issue_set(const std::vector<PendingOp>& ops, const LocalSet& set) {
  const int n = static_cast<int>(set.by_rank.size());
  const CudaDriver& cu = *cuda_driver();
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(set.by_rank.size());
  LocalGroupView view;
  view.nranks = n;
  uint64_t bytes = 0;
  auto op_of = [&](int r) -> const GroupedAllGather& {
    return ag(ops, set.by_rank[static_cast<size_t>(r)]);
  };
  for (int r = 0; r < n; ++r) {
    const GroupedAllGather& a = op_of(r);
    locks.emplace_back(a.st->issue_mu);
    view.chunk = a.count * nccl_type_size(a.datatype);
    view.ranks[r] = {reinterpret_cast<uint64_t>(a.send), reinterpret_cast<uint64_t>(a.recv),
                     set.recv_for_peers[static_cast<size_t>(r)]};
    bytes += a.total;
  }
  const uint64_t seq = op_of(0).st->ce->seq + 1;  // alike on every rank (qualifies)
  CUresult res = CUDA_SUCCESS;
  {
    NvtxRange range(zerocta_op_allgather, zerocta_route_ce, bytes);
    for (int r = 0; r < n && res == CUDA_SUCCESS; ++r) {
      const GroupedAllGather& a = op_of(r);
      CommState& st = *a.st;
      CeComm& ce = *st.ce;
      ce.seq = seq;
      local_group_rank_view(view, r, &ce.view);
      set_ring_flags(ce, r, n, seq, &ce.view);
      ce.plan.clear();
      build_direct_plan(ce.view, &ce.plan);
      const CUstream user = reinterpret_cast<CUstream>(a.stream);
      ScopedDevice dev(st.device);
      if (!dev.ok()) res = CUDA_ERROR_INVALID_CONTEXT;
      if (res == CUDA_SUCCESS) res = order_routed_op(st, ce.streams);
      if (res == CUDA_SUCCESS) res = issue_plan(cu, ce.streams, ce.events, user, ce.plan, true);
      if (res == CUDA_SUCCESS) routed_op_issued(st);
    }
  }
  // The copies into a second mapping have finished once every writer's push stream passed its
  // done waits, which every writer's own end follows.
  for (int q = 0; q < n && res == CUDA_SUCCESS; ++q)
    for (int r = 0; r < n && set.recv_for_peers[static_cast<size_t>(q)]; ++r)
      if (r != q &&
          !local_alias_used(cu, set.recv_for_peers[static_cast<size_t>(q)], op_of(r).st->device,
                            op_of(r).st->ce->streams[static_cast<int>(DirectStream::kPush)]))
        res = CUDA_ERROR_UNKNOWN;
  for (int r = 0; r < n; ++r) settle_rank(op_of(r), n, res);
  return res == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}

// The i-th routed all-gather of each of this thread's ranks of one communicator whose other
// ranks are in other processes: they go through the op exchange, but posted and claimed all
// before any of them waits for a peer (ce_allgather.h RoutedAllGather).
struct ExchangeSet {
  std::vector<size_t> ops;  // indices into the group's ops, in rank order
  size_t last = 0;          // where the set is issued: the position of its last op
};

// The exchange sets: an instance's ops in the group form sets when at least two of its ranks
// are here, each with as many, none captured, every one on the route with peers elsewhere.
// Else its ops go alone, as the application called them.
std::vector<ExchangeSet> find_exchange_sets(const std::vector<PendingOp>& ops) {
  std::vector<ExchangeSet> sets;
  for (const InstanceOps& inst : ops_by_instance(ops)) {
    // One rank here (a process per GPU, the common case): nothing to gather, no driver query.
    if (inst.of_rank.size() < 2 || inst.per_rank == 0) continue;
    bool fit = true;
    for (const auto& [rank, mine] : inst.of_rank)
      for (size_t j : mine) {
        CommState& st = *ag(ops, j).st;
        fit = fit && st.route.load(std::memory_order_acquire) == RouteState::kCommitted &&
              route_prepare(st) == ncclSuccess && st.ce && !st.ce->all_local() &&
              !stream_is_capturing(reinterpret_cast<CUstream>(ag(ops, j).stream));
      }
    if (!fit) continue;
    for (size_t k = 0; k < inst.per_rank; ++k) {
      ExchangeSet set;
      for (const auto& [rank, mine] : inst.of_rank) {
        set.ops.push_back(mine[k]);
        set.last = std::max(set.last, mine[k]);
      }
      sets.push_back(std::move(set));
    }
  }
  return sets;
}

// Issues an exchange set: every op's post and claims first, then every op's waits and copies.
// An op that fails poisons its communicator (ce_allgather.h); the others go on, and their
// peers see the poison.
ncclResult_t issue_exchange_set(const std::vector<PendingOp>& ops, const ExchangeSet& set) {
  std::vector<std::unique_ptr<RoutedAllGather>> routed(set.ops.size());
  ncclResult_t first = ncclSuccess;
  auto note = [&first](ncclResult_t r) {
    if (first == ncclSuccess) first = r;
  };
  uint64_t bytes = 0;
  for (size_t k : set.ops) bytes += ag(ops, k).total;
  NvtxRange range(zerocta_op_allgather, zerocta_route_ce, bytes);
  for (size_t i = 0; i < set.ops.size(); ++i) {
    const GroupedAllGather& a = ag(ops, set.ops[i]);
    if (a.st->ce && !a.st->ce->told_exchange_set) {
      a.st->ce->told_exchange_set = true;
      ZC_INFO(
          "zero-copy all-gather on rank %d/%d: this thread issues %zu ranks of the communicator "
          "in one group; their all-gathers are posted and claimed together, before any of them "
          "waits for a rank of another process",
          a.st->rank, a.st->nranks, set.ops.size());
    }
    routed[i].reset(new RoutedAllGather(*a.st, a.send, a.recv, a.count, a.datatype,
                                        a.count * nccl_type_size(a.datatype),
                                        reinterpret_cast<CUstream>(a.stream), false, a.chain));
    ncclResult_t r;
    if (routed[i]->begin(&r)) continue;
    const bool to_nccl = routed[i]->to_nccl();
    routed[i].reset();  // its communicator's issue lock goes before NCCL gets the op
    note(to_nccl ? a.forward() : r);
  }
  for (size_t i = 0; i < set.ops.size(); ++i) {
    if (!routed[i]) continue;
    const ncclResult_t r = routed[i]->complete();
    routed[i].reset();  // this rank's op is over: its communicator's lock goes
    if (r == ncclSuccess)
      stats_count(zerocta_op_allgather, zerocta_route_ce, ag(ops, set.ops[i]).total);
    note(r);
  }
  return first;
}

}  // namespace

ncclResult_t run_group_ops(std::vector<PendingOp>& ops) {
  std::vector<LocalSet> sets = find_sets(ops);
  if (!sets.empty() && cuda_driver()) tidy_local_aliases(*cuda_driver());
  // An instance's ops go as sets only if every one of its sets qualifies: else one rank's ops
  // could change order on its stream, some going alone and some with their set.
  std::vector<bool> refused(ops.size(), false);  // by instance (the index of its first op)
  for (LocalSet& set : sets)
    if (!refused[set.instance] && !qualifies(ops, &set)) refused[set.instance] = true;
  std::vector<size_t> set_of(ops.size(), kNone), exchange_set_of(ops.size(), kNone);
  for (size_t s = 0; s < sets.size(); ++s)
    if (!refused[sets[s].instance])
      for (size_t k : sets[s].by_rank) set_of[k] = s;
  const std::vector<ExchangeSet> exchange_sets = find_exchange_sets(ops);
  for (size_t s = 0; s < exchange_sets.size(); ++s)
    for (size_t k : exchange_sets[s].ops) exchange_set_of[k] = s;
  ncclResult_t first = ncclSuccess;
  for (size_t i = 0; i < ops.size(); ++i) {
    ncclResult_t r = ncclSuccess;
    if (set_of[i] != kNone) {
      if (sets[set_of[i]].last == i) r = issue_set(ops, sets[set_of[i]]);
    } else if (exchange_set_of[i] != kNone) {
      if (exchange_sets[exchange_set_of[i]].last == i)
        r = issue_exchange_set(ops, exchange_sets[exchange_set_of[i]]);
    } else {
      r = ops[i].run();
    }
    if (first == ncclSuccess) first = r;
  }
  return first;
}

}  // namespace zc
