// Synthetic worker for --fake-gpus (see worker.h). The numbers follow a simple bandwidth model
// per path and op, and simple start-up and first-op models; everything else (unique-id
// forwarding, barriers, shim detection, init times, route counters, policy counters, faults)
// goes through the same protocol as the real workers. ZCB_FAKE_NO_POLICY=<path> makes the shim
// report communicators without the zero-CTA policy; ZCB_FAKE_FIRST_FALLBACK=<path> sends the
// first size's first op to NCCL.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "channel.h"
#include "shim_stats.h"
#include "worker.h"

namespace zcb {

namespace {

bool fault(const char* var, PathId path) {
  const char* v = getenv(var);
  return v && strcmp(v, path_name(path)) == 0;
}

// Peak algbw (GB/s) of the model, per path.
double model_peak(PathId p) {
  switch (p) {
    case PathId::kNcclKernel:
      return 520;
    case PathId::kNcclPolicy:
      return 515;
    case PathId::kZeroctaPolicy:
      return 514;
    case PathId::kNcclCe:
      return 640;
    case PathId::kZerocta:
      return 660;
    case PathId::kZeroctaAuto:
      return 650;
    case PathId::kSumKernel:
      return 900;
    default:
      return 780;
  }
}

double model_time_us(PathId p, uint64_t bytes, int in_place, int rank) {
  const double half = 8.0 * (1 << 20);  // size at which the model reaches half its peak
  const double algbw = model_peak(p) * (in_place ? 1.05 : 1.0) * bytes / (bytes + half);
  return bytes / (algbw * 1e3) * (1.0 + 0.01 * rank);
}

// The same model for any op: an all-gather's time at the same bus traffic.
double model_op_time_us(PathId p, CollOp op, uint64_t bytes, int nranks, int in_place, int rank) {
  return model_time_us(p, bytes, in_place, rank) * bus_factor(op, nranks) /
         bus_factor(CollOp::kAllGather, nranks);
}

// Start-up model (ms): NCCL's init, a little more with a config, the shim's pool when its
// copy-engine route is on; the first op pays NCCL's lazy connection set-up.
void model_init(PathId p, int rank, InitTimesMsg* m) {
  m->init_ms = 300.0 + 7.0 * rank;
  if (path_sets_zero_policy(p)) m->init_ms += 4.0;
  if (path_uses_shim(p)) m->init_ms += 2.0;
  if (p == PathId::kZerocta || p == PathId::kZeroctaAuto) m->init_ms += 186.0;
  m->first_op_ms = 40.0 + rank + (p == PathId::kZerocta ? 5.0 : 0.0);
}

// The first op on a size's fresh buffers (ms): a little host work, the op itself, and on
// zerocta's ce route the import of the peers' allocations (a fixed cost plus one per GiB).
FirstOpResult model_first_op(PathId p, bool ce_route, double op_us, uint64_t bytes, int rank) {
  FirstOpResult f{};
  f.call_ms = 0.02 + 0.001 * rank;
  if (ce_route) f.call_ms += 1.5 + 4.0 * static_cast<double>(bytes) / (1ull << 30);
  if (p == PathId::kNcclCe) {
    f.call_ms += 0.1;                                                      // first use
    f.windows_ms = 2.0 + 8.0 * static_cast<double>(bytes) / (1ull << 30);  // registration
  }
  f.ms = f.call_ms + op_us / 1000.0;
  return f;
}

void send_hello(Channel* ch, int rank, PathId path) {
  HelloMsg h{};
  h.rank = rank;
  h.device = rank;
  h.pid = static_cast<int32_t>(getpid());
  h.nccl_version = path_is_single_process(path) ? 0 : 22809;
  ShimProbe shim = probe_shim();
  h.shim_loaded = shim.loaded;
  h.shim_version = shim.version;
  snprintf(h.gpu_name, sizeof(h.gpu_name), "Fake GPU (no CUDA)");
  snprintf(h.bus_id, sizeof(h.bus_id), "0000:%02x:00.0", rank + 1);
  ch->send(kMsgHello, &h, sizeof(h));
  if (path_uses_shim(path) && !shim.loaded) fatal("libzerocta.so is not loaded in this rank");
  if (!path_uses_shim(path) && shim.loaded) fatal("libzerocta.so is loaded but must not be");
}

void exchange_id(Channel* ch, int rank, PathId path) {
  UniqueIdMsg m;
  for (size_t i = 0; i < sizeof(m.bytes); ++i)
    m.bytes[i] = static_cast<char>(i * 7 + static_cast<int>(path));
  if (rank == 0) {
    ch->send(kMsgUniqueId, &m, sizeof(m));
    return;
  }
  UniqueIdMsg got;
  if (!ch->receive(kMsgUniqueIdFwd, &got, sizeof(got)) || memcmp(&got, &m, sizeof(m)) != 0)
    fatal("unique id not forwarded intact");
}

// The shim's routing: only all-gathers and reduce-scatters of zerocta (and zerocta-auto from
// 16 MiB) take "ce".
bool takes_ce(PathId path, CollOp op, uint64_t bytes) {
  return path_routes_op(path, op) &&
         (path == PathId::kZerocta || (path == PathId::kZeroctaAuto && bytes >= (16u << 20)));
}

// The check's largest difference from the float64 reference (reduce-scatters): about an ulp of
// the sum for the type (half that for the mean and the pre-multiplied sums, whose scalars
// average 1/2); -1 where there is none.
double model_maxdiff(const Options& o, int nranks, bool checked) {
  if (o.op != CollOp::kReduceScatter || !checked) return -1;
  const double ulp = o.dtype.nccl == ncclBfloat16  ? 7.8125e-3
                     : o.dtype.nccl == ncclFloat16 ? 9.765625e-4
                                                   : 1.1920929e-7;
  return ulp * nranks * (o.redop == RedOp::kSum ? 1.0 : 0.5);
}

void fill_routes(PathId path, CollOp op, uint64_t bytes, uint64_t calls, bool fallback,
                 uint64_t* r) {
  if (!path_uses_shim(path)) return;
  if (takes_ce(path, op, bytes)) {
    r[zerocta_route_ce] = calls - (fallback ? 1 : 0);
    r[zerocta_route_passthrough] = fallback ? 1 : 0;
  } else {
    r[zerocta_route_passthrough] = calls;
  }
}

// Synthetic contention numbers for the ranks of this process, every placement: the GEMM
// slows down most under nccl-kernel and least under bare-ce, each repeat and rank jitters a
// little so that medians and spreads differ from plain means.
void fake_contention(const Options& o, PathId path, const std::vector<int>& ranks, int nranks,
                     Channel* ch) {
  // ZCB_FAKE_CRASH=<path> in a contention run: that path's second run dies.
  if (fault("ZCB_FAKE_CRASH", path) && o.worker_repeat == 1) abort();
  const uint64_t bytes = o.contention_total_bytes(nranks);
  const double slow = path == PathId::kNcclKernel ? 0.30 : path == PathId::kBareCe ? 0.01 : 0.08;
  for (bool in_place : contention_placements(o.contention_placement)) {
    std::vector<ContentionMsg> msgs;
    uint64_t want = 0;
    for (int r : ranks) {
      const double jitter = 1.0 + 0.01 * ((std::max(o.worker_repeat, 0) * 3 + r) % 4);
      ContentionMsg m{};
      m.rank = r;
      m.in_place = in_place ? 1 : 0;
      m.gemm_iters = o.gemm_iters;
      m.ag_bytes = bytes;
      m.gemm_alone_ms = 2.0 * o.gemm_m * o.gemm_n * static_cast<double>(o.gemm_k) / 780e9 * jitter;
      m.ag_alone_ms = model_time_us(path, bytes, in_place ? 1 : 0, r) / 1000.0 * jitter;
      m.gemm_overlap_ms = m.gemm_alone_ms * (1 + slow);
      m.ag_overlap_ms = m.ag_alone_ms * (path == PathId::kBareCe ? 1.02 : 1.1);
      m.covered = 1;
      want = std::max(want, static_cast<uint64_t>(
                                2.0 * o.gemm_iters * m.gemm_alone_ms / m.ag_alone_ms + 2 + r));
      msgs.push_back(m);
    }
    const int n_ag = o.contention_mode == ContentionMode::kFixed
                         ? o.contention_ops
                         : static_cast<int>(ch->agree_max(want));
    for (ContentionMsg& m : msgs) {
      m.ag_ops = n_ag;
      m.ag_in_window = n_ag / 2;
      m.makespan_ms = 1.02 * std::max(o.gemm_iters * m.gemm_overlap_ms, n_ag * m.ag_overlap_ms);
    }
    // The shim's counters are the process's: with the first rank's message.
    fill_routes(path, o.contention_op(), bytes, 2 * static_cast<uint64_t>(n_ag) + 3, false,
                msgs.front().route_calls);
    for (const ContentionMsg& m : msgs) ch->send(kMsgContention, &m, sizeof(m));
  }
}

// Synthetic sweep rows of the ranks of this NCCL process (one, or every rank).
void fake_sweep(const Options& o, PathId path, const std::vector<int>& ranks, int nranks,
                Channel* ch) {
  ch->agree_max(0);  // the barrier before ncclCommInitRank
  std::vector<uint64_t> sizes = sweep_sizes(o);
  bool first = true;
  const uint64_t local = ranks.size();
  uint64_t totals[zerocta_route_count] = {};  // the shim's whole-run counters
  for (size_t si = 0; si < sizes.size(); ++si) {
    const CollShape s = sweep_shape(o, sizes[si], nranks);
    if (s.count == 0) continue;
    if (first) {
      fill_routes(path, o.op, s.bytes, local, false, totals);
      ch->agree_max(0);  // the barrier before the first op
      for (int rank : ranks) {
        InitTimesMsg it{};
        it.rank = rank;
        it.first_op_bytes = s.bytes;
        model_init(path, rank, &it);
        ch->send(kMsgInitTimes, &it, sizeof(it));
      }
    }
    first = false;
    const uint64_t calls = (o.check ? 1 : 0) + o.warmups + o.iters;
    for (int rank : ranks) {
      RowMsg row{};
      row.rank = rank;
      row.size_index = static_cast<int32_t>(si);
      row.count = s.count;
      row.bytes = s.bytes;
      row.first =
          model_first_op(path, takes_ce(path, o.op, s.bytes),
                         model_op_time_us(path, o.op, s.bytes, nranks, 0, rank), s.bytes, rank);
      if (rank == ranks.front()) {
        fill_routes(path, o.op, s.bytes, local, si == 0 && fault("ZCB_FAKE_FIRST_FALLBACK", path),
                    row.first.route_calls);
        for (int i = 0; i < zerocta_route_count; ++i) totals[i] += row.first.route_calls[i];
      }
      for (int ip = 0; ip < 2; ++ip) {
        PlaceResult& pr = ip ? row.ip : row.oop;
        pr.mean_us = model_op_time_us(path, o.op, row.bytes, nranks, ip, rank);
        pr.median_us = pr.mean_us * 0.99;
        pr.wrong = !o.check ? -1 : (fault("ZCB_FAKE_WRONG", path) && rank == 1 && si == 0) ? 3 : 0;
        pr.maxdiff = model_maxdiff(o, nranks, o.check);
        // The process's counters go with its first rank's row, as in the real worker.
        if (rank == ranks.front())
          fill_routes(path, o.op, row.bytes, calls * local, fault("ZCB_FAKE_FALLBACK", path),
                      pr.route_calls);
        for (int i = 0; i < zerocta_route_count; ++i) totals[i] += pr.route_calls[i];
      }
      ch->send(kMsgRow, &row, sizeof(row));
    }
    if (si == 0 && ranks.back() == nranks - 1) {
      if (fault("ZCB_FAKE_HANG", path)) pause();  // until the parent's timeout kills us
      if (fault("ZCB_FAKE_CRASH", path)) abort();
    }
  }
  ch->agree_max(static_cast<uint64_t>(ranks.front()));  // exercise the barrier once per path
  if (path_uses_shim(path)) {
    ShimTotalsMsg t{};
    t.rank = ranks.front();
    t.comms_created = local;
    t.comms_zero_policy = fault("ZCB_FAKE_NO_POLICY", path) ? 0 : local;
    for (int i = 0; i < zerocta_route_count; ++i) t.op_calls[i] = totals[i];
    ch->send(kMsgShimTotals, &t, sizeof(t));
  }
}

// The ceiling's rows: one process for every GPU, no NCCL.
void fake_ceiling_sweep(const Options& o, PathId path, int nranks, Channel* ch) {
  std::vector<uint64_t> sizes = sweep_sizes(o);
  for (int g = 0; g < nranks; ++g) {
    for (size_t si = 0; si < sizes.size(); ++si) {
      RowMsg row{};
      row.rank = g;
      row.size_index = static_cast<int32_t>(si);
      row.count = per_rank_count(sizes[si], nranks, o.dtype.bytes);
      row.bytes = row.count * o.dtype.bytes * nranks;
      if (row.count == 0) continue;
      row.oop.mean_us = model_time_us(path, row.bytes, 0, g);
      row.oop.median_us = row.oop.mean_us;
      row.first = model_first_op(path, false, row.oop.mean_us, row.bytes, g);
      row.oop.wrong = o.check ? 0 : -1;
      row.oop.maxdiff = path == PathId::kBareCe ? -1 : model_maxdiff(o, nranks, o.check);
      row.ip = row.oop;
      if (o.check && fault("ZCB_FAKE_WRONG", path) && g == 1 && si == 0) row.oop.wrong = 3;
      ch->send(kMsgRow, &row, sizeof(row));
    }
  }
  if (fault("ZCB_FAKE_HANG", path)) pause();
}

}  // namespace

void run_fake_worker(const Options& o, PathId path, int worker_rank, int nranks, Channel* ch) {
  // The ranks this process speaks for: every one for the peer paths and --one-process.
  std::vector<int> ranks;
  for (int r = 0; r < nranks; ++r)
    if (worker_rank < 0 || r == worker_rank) ranks.push_back(r);
  for (int r : ranks) send_hello(ch, r, path);
  if (path_runs_nccl(path) && worker_rank >= 0) exchange_id(ch, worker_rank, path);
  if (o.worker_mode == "contention")
    fake_contention(o, path, ranks, nranks, ch);
  else if (path_runs_nccl(path))
    fake_sweep(o, path, ranks, nranks, ch);
  else
    fake_ceiling_sweep(o, path, nranks, ch);
}

}  // namespace zcb
