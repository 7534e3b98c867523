#include "local_group_plan.h"

namespace zc {

void local_group_rank_view(const LocalGroupView& g, int me, DirectOpView* v) {
  v->rank = me;
  v->nranks = g.nranks;
  v->chunk = g.chunk;
  v->send = g.ranks[me].send;
  v->recv = g.ranks[me].recv;
  v->stage = 0;
  v->captured = false;
  for (int q = 0; q < g.nranks; ++q) {
    PeerPart& part = v->peers[q];
    part = PeerPart{};
    if (q == me) continue;
    part.push = true;
    part.peer_copies = true;
    const LocalGroupRank& peer = g.ranks[q];
    const uint64_t peer_recv = peer.recv_for_peers ? peer.recv_for_peers : peer.recv;
    part.to = Span{peer_recv + static_cast<uint64_t>(me) * g.chunk, g.chunk};
  }
}

}  // namespace zc
