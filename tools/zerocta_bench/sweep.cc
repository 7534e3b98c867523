// The bandwidth sweep of one NCCL worker process, for each of its ranks (one, or every rank
// with --one-process). First the communicators' cost (init, first op), then per size: fresh
// buffers of that size, the first op on them (timed alone: what new buffers cost), and per
// placement a checked operation on fresh data (poisoned output; all-gather and broadcast
// compared bitwise, reductions against the exact sum), warm-ups, the timed loop, and the
// shim's route counters before/after so every row says which route its calls really took.
// With --graph the checked op and the loop replay a graph that captured the op (its capture is
// the one call the route counters see).
#include "sweep.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "check.h"
#include "cuda_check.h"
#include "kernels.h"
#include "nccl_ranks.h"
#include "nccl_reference.h"
#include "reduce_pattern.h"
#include "shim_stats.h"
#include "timing.h"

namespace zcb {

namespace {

// The broadcast check reads the output as chunk 0 of the all-gather pattern: rank 0's data.
static_assert(kBroadcastRoot == 0, "the broadcast check expects the root's pattern in chunk 0");

// What the sweep keeps per rank of this process, on that rank's device.
struct LocalRank {
  int rank = 0;
  char* a = nullptr;    // the send buffer (the current size's send_bytes)
  char* b = nullptr;    // the receive buffer (the current size's recv_bytes)
  char* ref = nullptr;  // reduce-scatter: NCCL's own result on the same inputs (recv_bytes)
  std::unique_ptr<IterTimer> timer;
  std::unique_ptr<WrongCounter> wrong;
};

struct SweepRanks {
  const Options& o;
  NcclRanks& nr;
  std::vector<LocalRank> local;
  std::vector<cudaStream_t> streams;  // streams[i] on local rank i's device
  // Reduce-scatter with the check: NCCL's own communicators, for the reference result.
  std::unique_ptr<NcclReference> reference;

  std::vector<Placement> place(const CollShape& s, bool in_place) const {
    std::vector<Placement> p;
    for (const LocalRank& l : local)
      p.push_back(place_buffers(o.op, in_place, l.rank, s, l.a, l.b));
    return p;
  }
  // The op on every local rank (one group call with several).
  void op(const CollShape& s, const std::vector<Placement>& p) {
    nr.collective(o.op, p, s.count, o.dtype.nccl, streams, o.reduction());
  }
  // Reduce-scatter: NCCL's kernel result of the inputs now in place, into each rank's `ref`
  // (out of place, so that an in-place op's input stays whole), every rank done afterwards.
  void reference_op(const CollShape& s, const std::vector<Placement>& p, Channel* ch) {
    std::vector<const void*> send;
    std::vector<void*> recv;
    for (size_t i = 0; i < local.size(); ++i) {
      send.push_back(p[i].send);
      recv.push_back(local[i].ref);
    }
    reference->reduce_scatter(send, recv, s.count, o.dtype.nccl, o.reduction(), streams);
    synchronize();
    ch->agree_max(0);  // nobody's checked op starts while a peer's reference still runs
  }
  void synchronize() {
    for (size_t i = 0; i < local.size(); ++i) {
      nr.set_device(static_cast<int>(i));
      ZCB_CUDA(cudaStreamSynchronize(streams[i]));
    }
  }
};

// Poisons the output, then writes rank `rank`'s input for `seed` (in place, the fill then
// overwrites this rank's own piece of the poisoned output).
void fill_inputs(const Options& o, int rank, int nranks, const CollShape& s, const Placement& p,
                 uint64_t seed, cudaStream_t stream) {
  const int elem = o.dtype.bytes;
  ZCB_CUDA(cudaMemsetAsync(p.recv, kPoisonByte, s.recv_bytes, stream));
  switch (o.op) {
    case CollOp::kAllGather:
      launch_fill_pattern(p.send, s.send_bytes, elem, seed, rank, stream);
      break;
    case CollOp::kBroadcast:
      if (rank == kBroadcastRoot)
        launch_fill_pattern(p.send, s.send_bytes, elem, seed, kBroadcastRoot, stream);
      break;
    case CollOp::kReduceScatter:
      // Random finite values per rank and size (the reference is NCCL's result, not a formula).
      if (!launch_fill_random(p.send, s.send_bytes / elem, o.dtype.nccl, seed, rank, stream))
        fatal("no reduce-scatter test data for data type %s", o.dtype.name);
      break;
    case CollOp::kAllReduce: {
      const ReducePattern pat = make_reduce_pattern(o.dtype.nccl, nranks, seed);
      if (!launch_fill_reduce_input(p.send, s.send_bytes / elem, o.dtype.nccl, pat, rank, stream))
        fatal("no reduction test data for data type %s", o.dtype.name);
      break;
    }
  }
  ZCB_CUDA(cudaGetLastError());
}

// Counts rank `rank`'s wrong output elements on the device (synchronizes stream). Reduce-scatter:
// those that differ bitwise from `ref` (NCCL's result), and *maxdiff.
int64_t count_wrong(const Options& o, int rank, int nranks, const CollShape& s, const Placement& p,
                    uint64_t seed, const char* ref, double* maxdiff, WrongCounter* wrong,
                    cudaStream_t stream) {
  const int elem = o.dtype.bytes;
  if (o.op == CollOp::kReduceScatter) {
    RsCheck c;
    c.out = p.recv;
    c.count = s.count;
    c.base = static_cast<uint64_t>(rank) * s.count;
    c.nranks = nranks;
    c.type = o.dtype.nccl;
    c.seed = seed;
    c.avg = o.redop == RedOp::kAvg;
    c.premul = redop_is_premul(o.redop);
    c.ref = ref;
    return wrong->count_rs(c, maxdiff, stream);
  }
  switch (o.op) {
    case CollOp::kAllGather:
      return wrong->count(p.recv, s.send_bytes, nranks, elem, seed, -1, stream);
    case CollOp::kBroadcast:
      return wrong->count(p.recv, s.recv_bytes, 1, elem, seed, -1, stream);
    case CollOp::kAllReduce:
    case CollOp::kReduceScatter:
      break;
  }
  const ReducePattern pat = make_reduce_pattern(o.dtype.nccl, nranks, seed);
  // Reduce-scatter: this rank's output is the sum of every rank's input piece `rank`.
  const uint64_t base = o.op == CollOp::kReduceScatter ? static_cast<uint64_t>(rank) * s.count : 0;
  return wrong->count_sum(p.recv, s.count, base, nranks, o.dtype.nccl, pat, stream);
}

double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Gives every local rank fresh, zeroed buffers of size s (in the same order on every rank:
// nccl-ce's registrations are collective), after freeing the previous size's once every rank
// is done with them (a rank's own op can complete while a peer still reads its buffers).
void fresh_buffers(SweepRanks& w, const CollShape& s, Channel* ch) {
  if (w.local.front().a) {
    w.synchronize();
    ch->agree_max(0);
    w.nr.free_buffers();
  }
  const std::vector<char*> recv = w.nr.alloc(s.recv_bytes);
  const std::vector<char*> send = w.nr.alloc(s.send_bytes);
  for (size_t i = 0; i < w.local.size(); ++i) {
    w.nr.set_device(static_cast<int>(i));
    w.local[i].a = send[i];
    w.local[i].b = recv[i];
    if (w.reference) {  // the bench's own memory, not the path's allocator
      ZCB_CUDA(cudaFree(w.local[i].ref));
      w.local[i].ref = nullptr;
      ZCB_CUDA(cudaMalloc(&w.local[i].ref, s.recv_bytes));
    }
    ZCB_CUDA(cudaMemset(send[i], 0, s.send_bytes));
    ZCB_CUDA(cudaMemset(recv[i], 0, s.recv_bytes));
    ZCB_CUDA(cudaDeviceSynchronize());
  }
}

// One op out of place on every local rank, entered together (a late peer's allocation or
// start-up is not this rank's op), timed on steady_clock from the call to the end of the
// streams' synchronize: the call's host work plus the device's until the op completed.
// `route_calls` gets the shim's route of this op (the process's counters).
FirstOpResult timed_op(SweepRanks& w, const CollShape& s, zerocta_op_t counter, Channel* ch) {
  const std::vector<Placement> p = w.place(s, false);
  ch->agree_max(0);
  const RouteCounts before = shim_routes(counter);
  const auto start = std::chrono::steady_clock::now();
  w.op(s, p);
  const auto called = std::chrono::steady_clock::now();
  w.synchronize();
  const auto done = std::chrono::steady_clock::now();
  w.nr.check_async_error();
  FirstOpResult r{};
  r.call_ms = ms_between(start, called);
  r.ms = ms_between(start, done);
  const RouteCounts d = shim_routes(counter) - before;
  for (int i = 0; i < zerocta_route_count; ++i) r.route_calls[i] = d.calls[i];
  return r;
}

// Times the communicators' first collective (at the first size, out of place, zeroed buffers
// of their own, freed afterwards so that the size's row still gets a first op on fresh
// buffers) and reports it with the init time, once per local rank.
void send_init_times(SweepRanks& w, const CollShape& s, zerocta_op_t counter, Channel* ch) {
  fresh_buffers(w, s, ch);
  const FirstOpResult first = timed_op(w, s, counter, ch);
  for (const LocalRank& l : w.local) {
    InitTimesMsg m{};
    m.rank = l.rank;
    m.init_ms = w.nr.init_ms();
    m.first_op_ms = first.ms;
    m.first_op_bytes = s.bytes;
    ch->send(kMsgInitTimes, &m, sizeof(m));
  }
}

// --graph: the op on every local rank captured once (every local stream in capture at once, so
// that a group call over several GPUs is captured whole), then replayed.
class CapturedOp {
 public:
  CapturedOp(SweepRanks& w, const CollShape& s, const std::vector<Placement>& p) : w_(w) {
    for (size_t i = 0; i < w.local.size(); ++i) {
      w.nr.set_device(static_cast<int>(i));
      ZCB_CUDA(cudaStreamBeginCapture(w.streams[i], cudaStreamCaptureModeGlobal));
    }
    w.op(s, p);
    for (size_t i = 0; i < w.local.size(); ++i) {
      w.nr.set_device(static_cast<int>(i));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      ZCB_CUDA(cudaStreamEndCapture(w.streams[i], &graph));
      ZCB_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      graphs_.push_back(graph);
      execs_.push_back(exec);
    }
  }
  ~CapturedOp() {
    w_.synchronize();
    for (size_t i = 0; i < execs_.size(); ++i) {
      w_.nr.set_device(static_cast<int>(i));
      cudaGraphExecDestroy(execs_[i]);
      cudaGraphDestroy(graphs_[i]);
    }
  }
  CapturedOp(const CapturedOp&) = delete;
  CapturedOp& operator=(const CapturedOp&) = delete;
  void replay() {
    for (size_t i = 0; i < execs_.size(); ++i) {
      w_.nr.set_device(static_cast<int>(i));
      ZCB_CUDA(cudaGraphLaunch(execs_[i], w_.streams[i]));
    }
  }

 private:
  SweepRanks& w_;
  std::vector<cudaGraph_t> graphs_;
  std::vector<cudaGraphExec_t> execs_;
};

// One placement of one size on every local rank: check, warm-ups, timed loop. The shim's
// counters are the process's, so the route calls go to the first local rank's result (the
// parent sums them over ranks).
void measure(SweepRanks& w, const CollShape& s, bool in_place, uint64_t seed, zerocta_op_t counter,
             Channel* ch, std::vector<PlaceResult*> out) {
  const Options& o = w.o;
  const std::vector<Placement> p = w.place(s, in_place);
  const RouteCounts before = shim_routes(counter);
  for (PlaceResult* r : out) {
    r->wrong = -1;
    r->maxdiff = -1;
  }
  std::unique_ptr<CapturedOp> graph;
  if (o.graph) {
    ch->agree_max(0);  // a peer may still read these buffers in its previous loop
    graph = std::make_unique<CapturedOp>(w, s, p);
  }
  auto op = [&] { graph ? graph->replay() : w.op(s, p); };
  if (o.check) {
    // Every rank has finished the previous loop before anyone overwrites a buffer: a rank's
    // own op can complete while a peer still reads its buffers, depending on the protocol.
    ch->agree_max(0);
    for (size_t i = 0; i < w.local.size(); ++i) {
      w.nr.set_device(static_cast<int>(i));
      fill_inputs(o, w.local[i].rank, w.nr.nranks(), s, p[i], seed, w.streams[i]);
    }
    if (w.reference) w.reference_op(s, p, ch);
    op();
    for (size_t i = 0; i < w.local.size(); ++i) {
      w.nr.set_device(static_cast<int>(i));
      double maxdiff = -1;
      out[i]->wrong = count_wrong(o, w.local[i].rank, w.nr.nranks(), s, p[i], seed, w.local[i].ref,
                                  &maxdiff, w.local[i].wrong.get(), w.streams[i]);
      out[i]->maxdiff = maxdiff;
    }
  }
  for (int i = 0; i < o.warmups; ++i) op();
  auto record = [&](int event) {
    for (size_t i = 0; i < w.local.size(); ++i) {
      w.nr.set_device(static_cast<int>(i));
      w.local[i].timer->record(event, w.streams[i]);
    }
  };
  record(0);
  for (int it = 0; it < o.iters; ++it) {
    op();
    record(it + 1);
  }
  w.synchronize();
  w.nr.check_async_error();
  for (size_t i = 0; i < w.local.size(); ++i) {
    w.nr.set_device(static_cast<int>(i));
    out[i]->mean_us = w.local[i].timer->mean_us();
    out[i]->median_us = w.local[i].timer->median_us();
    if (o.iter_times)
      print_iter_times(w.local[i].rank, s.bytes, in_place, "sweep", *w.local[i].timer);
  }
  const RouteCounts d = shim_routes(counter) - before;
  for (int r = 0; r < zerocta_route_count; ++r) out[0]->route_calls[r] = d.calls[r];
}

}  // namespace

void run_nccl_sweep(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch) {
  NcclRanks nr(o, path, worker_rank, nranks, ch);
  const zerocta_op_t counter = op_shim_counter(o.op);
  SweepRanks w{o, nr, {}, {}, nullptr};
  for (int i = 0; i < nr.size(); ++i) {
    nr.set_device(i);
    LocalRank l;
    l.rank = nr.rank(i);
    l.timer = std::make_unique<IterTimer>(o.iters, events_every(o, o.iters));  // on its device
    l.wrong = std::make_unique<WrongCounter>();
    w.local.push_back(std::move(l));
    cudaStream_t stream;
    ZCB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    w.streams.push_back(stream);
  }

  std::vector<uint64_t> sizes = sweep_sizes(o);
  bool first = true;
  for (size_t si = 0; si < sizes.size(); ++si) {
    const CollShape s = sweep_shape(o, sizes[si], nranks);
    if (s.count == 0) continue;
    if (first) {
      send_init_times(w, s, counter, ch);
      // After the communicators' own first op, so that neither its time nor the init's holds
      // the reference communicators' creation.
      if (o.op == CollOp::kReduceScatter && o.check) {
        std::vector<int> ranks;
        for (const LocalRank& l : w.local) ranks.push_back(l.rank);
        w.reference =
            std::make_unique<NcclReference>(ranks, nranks, o.reduction(), o.dtype.nccl, ch);
      }
    }
    first = false;
    // Every size on buffers of its own, so that its first op is the first on those buffers.
    fresh_buffers(w, s, ch);
    std::vector<RowMsg> rows(w.local.size());
    const double windows_ms = nr.take_windows_ms();
    FirstOpResult first_op = timed_op(w, s, counter, ch);
    first_op.windows_ms = windows_ms;
    for (size_t i = 0; i < rows.size(); ++i) {
      rows[i].rank = w.local[i].rank;
      rows[i].size_index = static_cast<int32_t>(si);
      rows[i].bytes = s.bytes;
      rows[i].count = s.count;
      rows[i].first = first_op;
      // The shim's counters are the process's: with the first local rank's row.
      if (i > 0)
        std::fill(rows[i].first.route_calls, rows[i].first.route_calls + zerocta_route_count, 0);
    }
    for (int in_place = 0; in_place < 2; ++in_place) {
      std::vector<PlaceResult*> out;
      for (RowMsg& r : rows) out.push_back(in_place ? &r.ip : &r.oop);
      measure(w, s, in_place != 0, pattern_seed(o.seed, static_cast<int>(si), in_place), counter,
              ch, out);
    }
    for (const RowMsg& r : rows) ch->send(kMsgRow, &r, sizeof(r));
  }
  for (size_t i = 0; i < w.streams.size(); ++i) {
    nr.set_device(static_cast<int>(i));
    ZCB_CUDA(cudaStreamDestroy(w.streams[i]));
  }
  for (size_t i = 0; i < w.local.size(); ++i) {
    nr.set_device(static_cast<int>(i));
    cudaFree(w.local[i].ref);
  }
  w.reference.reset();
  w.local.clear();  // events and counters before the communicators (the buffers go with nr)
  send_shim_totals(ch, nr.rank(0), counter);
}

}  // namespace zcb
