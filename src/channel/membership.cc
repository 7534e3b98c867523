#include "membership.h"

#include <algorithm>
#include <cstring>

namespace zc {


Agreement agree(std::vector<MemberFacts> joined, int nranks, uint32_t channel_broken,
                int local_gpus) {
  Agreement a;
  auto no = [&a](const char* why, bool warn) {
    a.why = why;
    a.warn = warn;
    a.ranks.clear();
    return a;
  };
  if (channel_broken)
    return no("the channel segment was stale or claimed twice (a rank killed during set-up?)",
              true);
  if (nranks < 2) return no("a communicator of one rank", false);
  if (static_cast<int>(joined.size()) < nranks) {
    if (local_gpus > static_cast<int>(joined.size()))
      return no(
          "a rank on this host did not join (it runs without zerocta, with "
          "ZEROCTA_ENABLE=0 or another ZEROCTA_ALLGATHER); without zerocta its CTA policy "
          "differs too, and NCCL's own copy-engine path on window buffers (symmetric memory) "
          "would then be taken on some ranks only: a hang",
          true);
    return no("the communicator spans hosts (or its other ranks see other GPUs)", false);
  }
  if (static_cast<int>(joined.size()) > nranks)
    return no("more members than ranks joined the channel", true);
  std::sort(joined.begin(), joined.end(), [](const MemberFacts& x, const MemberFacts& y) {
    return x.order_key != y.order_key ? x.order_key < y.order_key : x.join_index < y.join_index;
  });
  const MemberFacts& first = joined[0];
  for (const MemberFacts& m : joined) {
    if (m.fingerprint != first.fingerprint)
      return no("ranks run with different ZEROCTA_* settings (fingerprint differs)", true);
    if (m.nccl_version != first.nccl_version) return no("ranks run different NCCL versions", true);
    if (m.uid != first.uid) return no("ranks run as different users", true);
  }
  for (const MemberFacts& m : joined) {
    if (m.problems & kProblemDevice) return no("a rank had no current CUDA device", true);
    if (m.problems & kProblemFlags)
      return no("a rank could not register the channel's flags with CUDA", true);
    if (m.problems & kProblemOneConnection)
      return no(
          "a rank runs with CUDA_DEVICE_MAX_CONNECTIONS=1 (a flag wait would block its "
          "only hardware queue)",
          false);
    if (m.problems & kProblemPeerInvisible)
      return no(
          "a peer's GPU is not visible in this process (CUDA_VISIBLE_DEVICES isolates the "
          "ranks?) and NVML does not say that NVLink links it to this one",
          false);
    if (m.problems & kProblemP2p) return no("a peer's GPU is not reachable by direct P2P", true);
    if (m.problems & kProblemFdService)
      return no("a rank could not reach a peer's fd service (another network namespace?)", true);
  }
  for (size_t i = 0; i < joined.size() && !kRanksMayShareGpu; ++i)
    for (size_t j = i + 1; j < joined.size(); ++j)
      if (memcmp(joined[i].uuid, joined[j].uuid, sizeof joined[i].uuid) == 0)
        return no("two ranks share one GPU", true);
  a.commit = true;
  a.ranks = std::move(joined);
  return a;
}

}  // namespace zc
