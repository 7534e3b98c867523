#include "pair_wait.h"

#include <utility>

#ifndef ZC_PAIR_WAIT_BASE_US
#define ZC_PAIR_WAIT_BASE_US 300
#endif
#ifndef ZC_PAIR_WAIT_BYTES_PER_US
#define ZC_PAIR_WAIT_BYTES_PER_US 400000
#endif

namespace zc {

int64_t PairWait::soft_us(uint64_t chunk) {
  return ZC_PAIR_WAIT_BASE_US + static_cast<int64_t>(chunk / ZC_PAIR_WAIT_BYTES_PER_US);
}

int64_t PairWait::cap_us(uint64_t chunk, int peers) {
  return kCapFactor * soft_us(chunk * static_cast<uint64_t>(peers > 1 ? peers : 1));
}

PairWait::PairWait(int64_t start_us, uint64_t chunk, int peers, bool captured,
                   std::function<bool()> drained)
    : captured_(captured),
      drained_fn_(std::move(drained)),
      soft_end_(start_us + soft_us(chunk)),
      cap_end_(start_us + cap_us(chunk, peers)) {}

bool PairWait::more(int64_t now_us) {
  if (now_us >= cap_end_) return false;
  if (now_us < soft_end_ || captured_) return true;
  if (!drained_ && now_us >= next_query_) {
    next_query_ = now_us + kQueryEveryUs;
    drained_ = drained_fn_();
  }
  return !drained_;
}

}  // namespace zc
