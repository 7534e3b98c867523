#include "peer_reach.h"

#include <unistd.h>

#include <utility>

#include "route_setup.h"

namespace zc {

bool reach(CommState& st, int p, uint64_t seq, const OpPost& post, const OpBuffer& buf,
           uint64_t addr, uint64_t bytes, GraphHold* hold, Span* out, const char** why) {
  if (post.reach == 0) {
    *why = "a rank's buffers cannot be reached by its peers (another allocator on that rank?)";
    return false;
  }
  if (post.pid == static_cast<int32_t>(getpid())) {
    *out = Span{buf.local_addr ? buf.local_addr + (addr - buf.addr) : addr, bytes};
    return true;
  }
  const MemberFacts& m = st.members[static_cast<size_t>(p)];
  CeComm& ce = *st.ce;
  // My copies that touch p's buffers have finished once my push stream tells p so.
  const DoneMark done{
      ce.ops->done_flag(static_cast<uint32_t>(p), static_cast<uint32_t>(st.rank), seq),
      static_cast<uint32_t>(seq)};
  ViewPin pin;
  if (!ce.imports->resolve(*cuda_driver(), buf, m.pid, m.fd_address, addr, bytes, seq, done, out,
                           why, hold ? &pin : nullptr))
    return false;
  if (hold) hold->pins.push_back(std::move(pin));
  return true;
}

bool same_process(const CommState& st, int p) {
  return st.members[static_cast<size_t>(p)].pid == static_cast<int32_t>(getpid());
}

bool peer_failed(const CommState& st) {
  return st.poisoned.load() != ncclSuccess || route_peer_poison(st) != ncclSuccess ||
         (st.ce && st.ce->ops && st.ce->ops->anyone_left());
}

}  // namespace zc
