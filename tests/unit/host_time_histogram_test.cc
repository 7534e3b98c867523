#include "host_time_histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace {

using zc::HostTimeHistogram;

TEST(HostTimeHistogram, BucketsAreExactBelow32AndAnEighthOfAnOctaveAbove) {
  for (int64_t us = 0; us < HostTimeHistogram::kExact; ++us)
    EXPECT_EQ(HostTimeHistogram::middle_of(HostTimeHistogram::bucket_of(us)), us);
  EXPECT_EQ(HostTimeHistogram::bucket_of(-5), 0);
  int previous = HostTimeHistogram::bucket_of(31);
  for (int64_t us = 32; us < (int64_t{1} << 29); us += us / 97 + 1) {
    const int b = HostTimeHistogram::bucket_of(us);
    ASSERT_GE(b, previous) << us;  // monotonic
    ASSERT_LT(b, HostTimeHistogram::kBuckets) << us;
    previous = b;
    // A value lies within 6.25 % of its bucket's middle (buckets 12.5 % of the octave wide).
    const double mid = HostTimeHistogram::middle_of(b);
    EXPECT_LE(std::fabs(mid - static_cast<double>(us)) / static_cast<double>(us), 0.0625) << us;
  }
  EXPECT_EQ(HostTimeHistogram::bucket_of(int64_t{1} << 40), HostTimeHistogram::kBuckets - 1);
}

TEST(HostTimeHistogram, QuantilesFollowTheValuesNotTheMean) {
  HostTimeHistogram h;
  EXPECT_EQ(h.quantile(0.5), 0);
  // 95 steady ops near 40 us and 5 first uses near 5 ms: the mean is ~290 us, the median 40.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> steady(36, 44), first(4500, 5500);
  std::vector<int64_t> all;
  for (int i = 0; i < 95; ++i) all.push_back(steady(rng));
  for (int i = 0; i < 5; ++i) all.push_back(first(rng));
  std::shuffle(all.begin(), all.end(), rng);
  for (int64_t v : all) h.add(v);
  EXPECT_NEAR(h.quantile(0.5), 40, 4);
  EXPECT_NEAR(h.quantile(0.9), 44, 4);
  EXPECT_NEAR(h.quantile(0.99), 5000, 700);
  h.reset();
  EXPECT_EQ(h.quantile(0.5), 0);
}

}  // namespace
