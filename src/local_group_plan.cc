#include "local_group_plan.h"

namespace zc {

void build_local_group_plan(const LocalGroupView& v, std::vector<LocalGroupStep>* plan) {
  using S = DirectStream;
  auto step = [plan](int rank, S stream, DirectOpKind kind, int event_rank = 0, uint8_t event = 0,
                     uint64_t dst = 0, uint64_t src = 0, uint64_t bytes = 0) {
    LocalGroupStep s;
    s.rank = static_cast<uint8_t>(rank);
    s.event_rank = static_cast<uint8_t>(event_rank);
    s.op.stream = stream;
    s.op.kind = kind;
    s.op.event = event;
    s.op.dst = dst;
    s.op.src = src;
    s.op.bytes = bytes;
    plan->push_back(s);
  };
  const int n = v.nranks;
  auto own_slot = [&](int r) { return v.ranks[r].recv + static_cast<uint64_t>(r) * v.chunk; };
  auto peers_recv = [&](int q) {
    return v.ranks[q].recv_for_peers ? v.ranks[q].recv_for_peers : v.ranks[q].recv;
  };
  auto in_place = [&](int r) { return v.ranks[r].send == own_slot(r); };

  for (int r = 0; r < n; ++r) step(r, S::kUser, DirectOpKind::kRecord, r, kEvStart);
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) step(r, S::kPush, DirectOpKind::kWaitEvent, q, kEvStart);
    // Rank r writes to r-1 first, then r-2, ... (mod n): at each step the writes form a
    // permutation, so no GPU's links take every write at once (direct_plan.cc does the same).
    for (int i = 1; i < n; ++i) {
      const int q = (r + n - i) % n;
      if (v.chunk)
        step(r, S::kPush, DirectOpKind::kCopy, 0, 0,
             peers_recv(q) + static_cast<uint64_t>(r) * v.chunk, v.ranks[r].send, v.chunk);
    }
    step(r, S::kPush, DirectOpKind::kRecord, r, kEvEnd);
    if (in_place(r)) continue;
    step(r, S::kLocal, DirectOpKind::kWaitEvent, r, kEvStart);
    if (v.chunk)
      step(r, S::kLocal, DirectOpKind::kCopy, 0, 0, own_slot(r), v.ranks[r].send, v.chunk);
    step(r, S::kLocal, DirectOpKind::kRecord, r, kEvLocal);
  }
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) step(r, S::kUser, DirectOpKind::kWaitEvent, q, kEvEnd);
    if (!in_place(r)) step(r, S::kUser, DirectOpKind::kWaitEvent, r, kEvLocal);
  }
}

}  // namespace zc
