// Host times of the route's ops as counts per bucket, so that the report gives medians and
// tails: a mean hides what matters here — the first op over new buffers exports and imports
// their allocations (tens of microseconds each), a steady op only issues, and one slow op in a
// hundred (a peer late by a millisecond) moves the mean of the pair wait more than the rest.
//
// Lock-free and allocation-free (relaxed atomics, constant-initialised), as the other counters.
#pragma once

#include <atomic>
#include <cstdint>

namespace zc {

class HostTimeHistogram {
 public:
  // Below kExact microseconds each value has a bucket of its own; above, each power of two is
  // split in kPerOctave buckets (12.5 % wide), up to 2^kOctaves us (~18 min).
  static constexpr int kExact = 32;
  static constexpr int kPerOctave = 8;
  static constexpr int kOctaves = 30;
  static constexpr int kBuckets = kExact + (kOctaves - 5) * kPerOctave;

  // Pure: the bucket of `us` (negative counts as 0, beyond the last as the last).
  static int bucket_of(int64_t us) {
    if (us < kExact) return us < 0 ? 0 : static_cast<int>(us);
    int octave = 63 - __builtin_clzll(static_cast<uint64_t>(us));  // >= 5
    if (octave >= kOctaves) return kBuckets - 1;
    const int sub = static_cast<int>((static_cast<uint64_t>(us) >> (octave - 3)) & 7);
    return kExact + (octave - 5) * kPerOctave + sub;
  }
  // Pure: the middle of bucket `b`, in microseconds.
  static double middle_of(int b) {
    if (b < kExact) return b;
    const int octave = 5 + (b - kExact) / kPerOctave;
    const int sub = (b - kExact) % kPerOctave;
    const double width = static_cast<double>(uint64_t{1} << (octave - 3));
    return static_cast<double>(uint64_t{1} << octave) + (sub + 0.5) * width;
  }

  void add(int64_t us) { counts_[bucket_of(us)].fetch_add(1, std::memory_order_relaxed); }

  // The value below which a share `q` (0..1) of the added ones lie, to the bucket's middle;
  // 0 with nothing added.
  double quantile(double q) const {
    const uint64_t total = count();
    if (total == 0) return 0;
    const double want = q * static_cast<double>(total);
    uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += counts_[b].load(std::memory_order_relaxed);
      if (static_cast<double>(seen) >= want && seen > 0) return middle_of(b);
    }
    return middle_of(kBuckets - 1);
  }

  uint64_t count() const {
    uint64_t total = 0;
    for (const auto& c : counts_) total += c.load(std::memory_order_relaxed);
    return total;
  }

  void reset() {
    for (auto& c : counts_) c.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> counts_[kBuckets] = {};
};

}  // namespace zc
