// The bandwidth sweep of one NCCL rank. First the communicator's cost (init, first op), then
// per size and placement: a checked operation on fresh data (poisoned output; all-gather and
// broadcast compared bitwise, reductions against the exact sum), warm-ups, the timed loop, and
// the shim's route counters before/after so every row says which route its calls really took.
#include "sweep.h"

#include <cuda_runtime_api.h>

#include <chrono>

#include "check.h"
#include "cuda_check.h"
#include "kernels.h"
#include "nccl_rank.h"
#include "reduce_pattern.h"
#include "shim_stats.h"
#include "timing.h"

namespace zcb {

namespace {

// The broadcast check reads the output as chunk 0 of the all-gather pattern: rank 0's data.
static_assert(kBroadcastRoot == 0, "the broadcast check expects the root's pattern in chunk 0");

struct SweepRank {
  const Options& o;
  NcclRank& nr;
  int rank;
  int nranks;
  cudaStream_t stream;
  char* a;  // the send buffer (largest send_bytes)
  char* b;  // the receive buffer (largest recv_bytes)

  void op(const CollShape& s, const Placement& p) {
    nr.collective(o.op, p.send, p.recv, s.count, o.dtype.nccl, stream);
  }
};

// Fills the inputs for `seed` over a poisoned output, runs the op once and counts wrong
// output elements on the device.
int64_t checked_op(SweepRank& w, const CollShape& s, const Placement& p, uint64_t seed,
                   WrongCounter* wrong) {
  const Options& o = w.o;
  const int elem = o.dtype.bytes;
  // Poison first: in place, the fill then overwrites this rank's own input.
  ZCB_CUDA(cudaMemsetAsync(p.recv, kPoisonByte, s.recv_bytes, w.stream));
  switch (o.op) {
    case CollOp::kAllGather:
      launch_fill_pattern(p.send, s.send_bytes, elem, seed, w.rank, w.stream);
      ZCB_CUDA(cudaGetLastError());
      w.op(s, p);
      return wrong->count(p.recv, s.send_bytes, w.nranks, elem, seed, -1, w.stream);
    case CollOp::kBroadcast:
      if (w.rank == kBroadcastRoot)
        launch_fill_pattern(p.send, s.send_bytes, elem, seed, kBroadcastRoot, w.stream);
      ZCB_CUDA(cudaGetLastError());
      w.op(s, p);
      return wrong->count(p.recv, s.recv_bytes, 1, elem, seed, -1, w.stream);
    case CollOp::kAllReduce:
    case CollOp::kReduceScatter:
      break;
  }
  const ReducePattern pat = make_reduce_pattern(o.dtype.nccl, w.nranks, seed);
  if (!launch_fill_reduce_input(p.send, s.send_bytes / elem, o.dtype.nccl, pat, w.rank, w.stream))
    fatal("no reduction test data for data type %s", o.dtype.name);
  ZCB_CUDA(cudaGetLastError());
  w.op(s, p);
  // Reduce-scatter: this rank's output is the sum of every rank's input piece `rank`.
  const uint64_t base =
      o.op == CollOp::kReduceScatter ? static_cast<uint64_t>(w.rank) * s.count : 0;
  return wrong->count_sum(p.recv, s.count, base, w.nranks, o.dtype.nccl, pat, w.stream);
}

// Times the communicator's first collective (at the first size, out of place, zeroed
// buffers) and reports it with the init time.
void send_init_times(SweepRank& w, const CollShape& s, Channel* ch) {
  const Placement p = place_buffers(w.o.op, false, w.rank, s, w.a, w.b);
  ZCB_CUDA(cudaMemset(w.a, 0, s.send_bytes));
  ZCB_CUDA(cudaMemset(w.b, 0, s.recv_bytes));
  ZCB_CUDA(cudaDeviceSynchronize());
  ch->agree_max(0);  // start together: a late peer's start-up is not this rank's first op
  const auto start = std::chrono::steady_clock::now();
  w.op(s, p);
  ZCB_CUDA(cudaStreamSynchronize(w.stream));
  InitTimesMsg m{};
  m.rank = w.rank;
  m.init_ms = w.nr.init_ms();
  m.first_op_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  m.first_op_bytes = s.bytes;
  ch->send(kMsgInitTimes, &m, sizeof(m));
}

}  // namespace

SweepBuffers sweep_buffers(const Options& o, int nranks) {
  SweepBuffers b;
  for (uint64_t size : sweep_sizes(o)) {
    const CollShape s = sweep_shape(o, size, nranks);
    if (s.send_bytes > b.max_send) b.max_send = s.send_bytes;
    if (s.recv_bytes > b.max_recv) b.max_recv = s.recv_bytes;
  }
  return b;
}

void run_nccl_sweep(const Options& o, PathId path, int rank, int nranks, Channel* ch) {
  NcclRank nr(path, rank, nranks, ch);
  const zerocta_op_t counter = op_shim_counter(o.op);
  SweepBuffers sb = sweep_buffers(o, nranks);
  if (sb.max_send == 0) {
    send_shim_totals(ch, rank, counter);
    return;
  }
  cudaStream_t stream;
  ZCB_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Allocated once at the largest size (collective on nccl-ce: same order on every rank).
  char* recv = static_cast<char*>(nr.alloc(sb.max_recv));
  char* send = static_cast<char*>(nr.alloc(sb.max_send));
  SweepRank w{o, nr, rank, nranks, stream, send, recv};
  IterTimer timer(o.iters);
  WrongCounter wrong;

  std::vector<uint64_t> sizes = sweep_sizes(o);
  bool first = true;
  for (size_t si = 0; si < sizes.size(); ++si) {
    const CollShape s = sweep_shape(o, sizes[si], nranks);
    if (s.count == 0) continue;
    if (first) send_init_times(w, s, ch);
    first = false;
    RowMsg row{};
    row.rank = rank;
    row.size_index = static_cast<int32_t>(si);
    row.bytes = s.bytes;
    row.count = s.count;
    for (int in_place = 0; in_place < 2; ++in_place) {
      PlaceResult& pr = in_place ? row.ip : row.oop;
      const Placement p = place_buffers(o.op, in_place != 0, rank, s, send, recv);
      const uint64_t seed = pattern_seed(o.seed, static_cast<int>(si), in_place);
      RouteCounts before = shim_routes(counter);
      pr.wrong = -1;
      if (o.check) {
        // Every rank has finished the previous loop before anyone overwrites a buffer: a rank's
        // own op can complete while a peer still reads its buffers, depending on the protocol.
        ch->agree_max(0);
        pr.wrong = checked_op(w, s, p, seed, &wrong);
      }
      for (int i = 0; i < o.warmups; ++i) w.op(s, p);
      timer.record(0, stream);
      for (int i = 0; i < o.iters; ++i) {
        w.op(s, p);
        timer.record(i + 1, stream);
      }
      ZCB_CUDA(cudaStreamSynchronize(stream));
      nr.check_async_error();
      pr.mean_us = timer.mean_us(o.iters);
      pr.median_us = timer.median_us(o.iters);
      RouteCounts d = shim_routes(counter) - before;
      for (int i = 0; i < zerocta_route_count; ++i) pr.route_calls[i] = d.calls[i];
    }
    ch->send(kMsgRow, &row, sizeof(row));
  }
  ZCB_CUDA(cudaStreamDestroy(stream));
  send_shim_totals(ch, rank, counter);
}

}  // namespace zcb
