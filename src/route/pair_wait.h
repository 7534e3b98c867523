// How long the earlier rank of a pair waits, on the application's thread, for the later one (in
// another process) to claim "each pushes" before it leaves both copies to it (op_exchange.h).
//
// Waiting costs the device nothing while the op's stream is still busy with the work before
// the op: the copies could not start earlier anyway. So an eager op waits as long as its
// stream has not drained, up to the cap: kCapFactor times the soft wait of the op's whole
// transfer, its chunk to every peer (a peer that never comes, e.g. one blocked on this rank in
// another communicator, must not hold it longer). A later rank whose host runs ahead of its GPU
// is held in the driver's calls for up to an op's device time before it can claim, and a fall
// back lengthens its next op: with the cap at 4 soft waits of one chunk (3.9 ms at 1 GiB on 4
// ranks, ops of 2.1 ms) the ranks fell into runs of a dozen ops at 4-7 ms each, 14-19 pairs of
// ~140 per rank falling back; with the cap over the whole op, 1-3 pairs and no slow run
// (4xH200, zerocta-bench at 1 GiB in place, every op timed; docs/plots/busy-cap-4xH200). With
// 2 ranks the two caps are one. Once the stream
// has drained, only until the soft wait: a base for ranks that issue in step, plus the op's own
// transfer time at ~400 GB/s, which is what the fallback would add on the device (one GPU
// carrying both directions across processes runs them at half speed). A captured op waits up
// to the cap: its pairing is replayed by every launch of its graph.
//
// Measured with FSDP2 (run_fsdp2.sh comm, 2xH100, 805 MB chunks), step time against the plain
// run, with the soft wait alone: a flat 50 us, 1.018 (nearly every pair fell back); 300 us +
// half the transfer time, 0.971 (17 % fell back); 1 ms + twice it, 0.966 (2 %). On 4xH200
// (zerocta-bench, 256 MiB, ops back to back) the soft wait alone let the ranks whose hosts ran
// ahead fall back against the slowest one, whose GPU then carried more and stayed the slowest:
// 1.4 ms an op against 0.57 (docs/PERFORMANCE.md, "Three and four GPUs").
// (The soft wait's two constants can be set at build time, -DZC_PAIR_WAIT_BASE_US=... and
// -DZC_PAIR_WAIT_BYTES_PER_US=..., to measure others against them; they are no setting.)
#pragma once

#include <cstdint>
#include <functional>

namespace zc {

class PairWait {
 public:
  static constexpr int64_t kCapFactor = 4;
  // How often the stream is asked whether it drained (a driver call) once the soft wait is over.
  static constexpr int64_t kQueryEveryUs = 50;

  // The soft wait of an op that moves `chunk` bytes per rank.
  static int64_t soft_us(uint64_t chunk);
  // The longest wait of such an op with `peers` peers.
  static int64_t cap_us(uint64_t chunk, int peers);

  // A wait that starts at `start_us` (monotonic) for an op of `peers` peers. `drained`: whether
  // the op's stream has no work left before the op; never called for a captured op.
  PairWait(int64_t start_us, uint64_t chunk, int peers, bool captured,
           std::function<bool()> drained);

  // Whether to go on waiting at `now_us`.
  bool more(int64_t now_us);

 private:
  bool captured_;
  std::function<bool()> drained_fn_;
  int64_t soft_end_, cap_end_, next_query_ = 0;
  bool drained_ = false;
};

}  // namespace zc
