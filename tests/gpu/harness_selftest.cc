// CPU-only tests of the GPU test machinery: the multi-process harness (ids, failures,
// timeouts, kills), the digest files and the host-side test data. They run everywhere, so the
// parts of the GPU tests that decide pass/fail are themselves tested without a GPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "digest.h"
#include "gpu_kernels.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

RunOptions cpu_options(int total_s = 30) {
  RunOptions o;
  o.use_cuda = false;
  o.total_timeout_s = total_s;
  o.kill_grace_s = 1;
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void sleep_forever() {
  for (;;) pause();
}

TEST(Harness, EveryRankRunsAndGetsRankZerosIds) {
  RunOptions o = cpu_options();
  o.num_ids = 2;
  RunResult r = run_ranks(
      4,
      [](const RankContext& ctx) {
        auto* block = static_cast<char*>(rank_shared_block(ctx.rank));
        const int header[2] = {ctx.rank + 100, ctx.nranks};
        memcpy(block, header, sizeof(header));
        memcpy(block + sizeof(header), ctx.ids.data(), 2 * sizeof(ncclUniqueId));
        return 0;
      },
      o);
  ASSERT_TRUE(r.ok()) << r.summary();
  ASSERT_EQ(r.ranks.size(), 4u);
  const char* first = static_cast<const char*>(rank_shared_block(0)) + 2 * sizeof(int);
  ncclUniqueId zero{};
  EXPECT_NE(memcmp(first, &zero, sizeof(zero)), 0) << "rank 0 sent no id";
  EXPECT_NE(memcmp(first, first + sizeof(ncclUniqueId), sizeof(ncclUniqueId)), 0)
      << "the two ids should differ";
  for (int q = 0; q < 4; ++q) {
    const char* block = static_cast<const char*>(rank_shared_block(q));
    int header[2];
    memcpy(header, block, sizeof(header));
    EXPECT_EQ(header[0], q + 100);
    EXPECT_EQ(header[1], 4);
    EXPECT_EQ(memcmp(block + sizeof(header), first, 2 * sizeof(ncclUniqueId)), 0)
        << "rank " << q << " got different ids";
  }
}

TEST(Harness, FailureCarriesExitCodeAndMessage) {
  RunResult r = run_ranks(
      3,
      [](const RankContext& ctx) {
        if (ctx.rank != 1) return 0;
        report("boom from the test");
        return 3;
      },
      cpu_options());
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(r.ranks[0].ok());
  EXPECT_TRUE(r.ranks[2].ok());
  EXPECT_EQ(r.ranks[1].exit_code, 3);
  const std::string s = r.summary();
  EXPECT_NE(s.find("rank 1: exit code 3"), std::string::npos) << s;
  EXPECT_NE(s.find("[rank 1] boom from the test"), std::string::npos) << s;
  EXPECT_EQ(s.find("rank 0"), std::string::npos) << "successful ranks are not listed: " << s;
}

TEST(Harness, ExceptionFailsTheRank) {
  RunResult r = run_ranks(
      2,
      [](const RankContext& ctx) -> int {
        if (ctx.rank == 0) fail("a RankError text");
        return 0;
      },
      cpu_options());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.ranks[0].exit_code, kRankExceptionExit);
  EXPECT_NE(r.summary().find("a RankError text"), std::string::npos) << r.summary();
}

TEST(Harness, CrashIsReportedAsSignal) {
  RunResult r = run_ranks(
      2,
      [](const RankContext& ctx) {
        if (ctx.rank == 1) raise(SIGABRT);
        return 0;
      },
      cpu_options());
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.ranks[1].exited);
  EXPECT_EQ(r.ranks[1].signal, SIGABRT);
}

TEST(Harness, TotalTimeoutKillsAHang) {
  const auto start = std::chrono::steady_clock::now();
  RunResult r = run_ranks(
      2,
      [](const RankContext&) -> int {
        sleep_forever();
        return 0;
      },
      cpu_options(2));
  EXPECT_FALSE(r.ok());
  EXPECT_LT(seconds_since(start), 10.0);
  for (const auto& o : r.ranks) {
    EXPECT_NE(o.killed_because.find("total timeout"), std::string::npos) << o.killed_because;
    EXPECT_EQ(o.signal, SIGKILL);
  }
}

TEST(Harness, PeersOfAFailedRankAreKilledAfterGrace) {
  const auto start = std::chrono::steady_clock::now();
  RunResult r = run_ranks(
      3,
      [](const RankContext& ctx) -> int {
        if (ctx.rank == 2) return 5;
        sleep_forever();  // as if waiting in a collective for the failed rank
        return 0;
      },
      cpu_options(60));
  EXPECT_FALSE(r.ok());
  EXPECT_LT(seconds_since(start), 20.0);
  EXPECT_EQ(r.ranks[2].exit_code, 5);
  EXPECT_NE(r.ranks[0].killed_because.find("rank 2 failed"), std::string::npos)
      << r.ranks[0].killed_because;
}

TEST(Harness, IdleTimeoutCatchesARankWithoutProgress) {
  RunOptions o = cpu_options(60);
  o.idle_timeout_s = 2;
  const auto start = std::chrono::steady_clock::now();
  RunResult r = run_ranks(
      2,
      [](const RankContext& ctx) -> int {
        // Rank 0 keeps beating for a while (so it is not the one blamed), rank 1 stops.
        for (int i = 0; i < 100; ++i) {
          if (ctx.rank == 0) heartbeat();
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        sleep_forever();
        return 0;
      },
      o);
  EXPECT_FALSE(r.ok());
  EXPECT_LT(seconds_since(start), 9.0);
  EXPECT_NE(r.ranks[0].killed_because.find("rank 1 made no progress"), std::string::npos)
      << r.ranks[0].killed_because;
}

TEST(Harness, LongRunWithHeartbeatsIsNotIdle) {
  RunOptions o = cpu_options(30);
  o.idle_timeout_s = 1;
  RunResult r = run_ranks(
      2,
      [](const RankContext&) {
        for (int i = 0; i < 30; ++i) {
          heartbeat();
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return 0;
      },
      o);
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(Harness, BarrierWaitsForTheSlowestRank) {
  RunResult r = run_ranks(
      3,
      [](const RankContext& ctx) {
        using Clock = std::chrono::steady_clock;
        const auto start = Clock::now();
        for (int round = 0; round < 3; ++round) {
          // A different rank is slow in each round.
          const int slow_ms = ctx.rank == round ? 300 : 0;
          std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
          barrier();
          const double waited = std::chrono::duration<double>(Clock::now() - start).count();
          if (waited < 0.25 * (round + 1)) {  // ranks start a few ms apart
            report("left barrier " + std::to_string(round) + " after " + std::to_string(waited) +
                   " s");
            return 1;
          }
        }
        return 0;
      },
      cpu_options());
  EXPECT_TRUE(r.ok()) << r.summary();
}

TEST(Digest, PartsAreMergedInRankOrder) {
  char dir[] = "/tmp/zerocta-digest-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string file = std::string(dir) + "/digests.txt";
  setenv("ZCTEST_DIGEST_FILE", file.c_str(), 1);
  digest_begin(3);
  RunResult r = run_ranks(
      3,
      [](const RankContext& ctx) {
        // Later ranks finish first: the order in the file must not depend on timing.
        std::this_thread::sleep_for(std::chrono::milliseconds(200 * (2 - ctx.rank)));
        DigestLog log(ctx.rank);
        const char data[] = "a";
        log.add("op=x", data, 1);
        log.add("op=y", data, 0);
        log.flush();
        return 0;
      },
      cpu_options());
  ASSERT_TRUE(r.ok()) << r.summary();
  EXPECT_EQ(digest_merge(3), "");
  unsetenv("ZCTEST_DIGEST_FILE");
  std::ifstream in(file);
  std::stringstream content;
  content << in.rdbuf();
  std::string want;
  for (int q = 0; q < 3; ++q) {
    // FNV-1a 64 of "a" and of nothing (the offset basis).
    want += "op=x rank=" + std::to_string(q) + " bytes=1 fnv1a64=af63dc4c8601ec8c\n";
    want += "op=y rank=" + std::to_string(q) + " bytes=0 fnv1a64=cbf29ce484222325\n";
  }
  EXPECT_EQ(content.str(), want);
  for (int q = 0; q < 3; ++q) {
    EXPECT_NE(access((file + ".rank" + std::to_string(q) + ".part").c_str(), F_OK), 0)
        << "part file left behind";
  }
  unlink(file.c_str());
  rmdir(dir);
}

TEST(Digest, MissingRankIsMarked) {
  char dir[] = "/tmp/zerocta-digest-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string file = std::string(dir) + "/digests.txt";
  setenv("ZCTEST_DIGEST_FILE", file.c_str(), 1);
  digest_begin(2);
  EXPECT_NE(digest_merge(2), "");
  unsetenv("ZCTEST_DIGEST_FILE");
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "MISSING digests of rank 0");
  unlink(file.c_str());
  rmdir(dir);
}

TEST(TestData, FloatInputsAreFiniteAndBounded) {
  for (ncclDataType_t dt : {ncclFloat16, ncclBfloat16, ncclFloat32, ncclFloat64}) {
    const size_t count = 4096;
    auto v = make_input(dt, count, 42);
    ASSERT_EQ(v.size(), count * dtype_size(dt));
    int negative = 0;
    for (size_t i = 0; i < count; ++i) {
      const double x = element_as_double(v.data(), dt, i);
      ASSERT_TRUE(std::isfinite(x)) << dtype_name(dt) << " element " << i;
      EXPECT_GE(std::fabs(x), 1.0 / 16) << dtype_name(dt);
      EXPECT_LT(std::fabs(x), 4.0) << dtype_name(dt);
      negative += x < 0;
    }
    EXPECT_GT(negative, 1500) << dtype_name(dt) << ": signs should be mixed";
    EXPECT_LT(negative, 2600) << dtype_name(dt);
  }
}

TEST(TestData, InputsDependOnSeedOnly) {
  EXPECT_EQ(make_input(ncclInt32, 100, 7), make_input(ncclInt32, 100, 7));
  EXPECT_NE(make_input(ncclInt32, 100, 7), make_input(ncclInt32, 100, 8));
  EXPECT_NE(seed_of({1, 2}), seed_of({2, 1}));
}

TEST(TestData, HalfAndBfloat16Decoding) {
  const uint16_t half_one = 0x3c00, half_minus_two = 0xc000, bf16_three = 0x4040;
  EXPECT_EQ(element_as_double(reinterpret_cast<const uint8_t*>(&half_one), ncclFloat16, 0), 1.0);
  EXPECT_EQ(element_as_double(reinterpret_cast<const uint8_t*>(&half_minus_two), ncclFloat16, 0),
            -2.0);
  EXPECT_EQ(element_as_double(reinterpret_cast<const uint8_t*>(&bf16_three), ncclBfloat16, 0), 3.0);
}

TEST(TestData, CheckSumAcceptsRightAndRejectsWrong) {
  // int8 wraps: 100 + 100 = -56.
  const int8_t a[2] = {100, 1}, b[2] = {100, 2}, good[2] = {-56, 3}, bad[2] = {-56, 4};
  std::vector<const uint8_t*> in = {reinterpret_cast<const uint8_t*>(a),
                                    reinterpret_cast<const uint8_t*>(b)};
  EXPECT_EQ(check_sum(reinterpret_cast<const uint8_t*>(good), in, 0, 2, ncclInt8), "");
  EXPECT_NE(check_sum(reinterpret_cast<const uint8_t*>(bad), in, 0, 2, ncclInt8), "");
  // Offset into the inputs (reduce-scatter): element 1 only.
  const int8_t second[1] = {3};
  EXPECT_EQ(check_sum(reinterpret_cast<const uint8_t*>(second), in, 1, 1, ncclInt8), "");

  const float fa[1] = {0.1f}, fb[1] = {0.2f};
  const float fsum[1] = {0.1f + 0.2f}, fwrong[1] = {0.3002f};
  std::vector<const uint8_t*> fin = {reinterpret_cast<const uint8_t*>(fa),
                                     reinterpret_cast<const uint8_t*>(fb)};
  EXPECT_EQ(check_sum(reinterpret_cast<const uint8_t*>(fsum), fin, 0, 1, ncclFloat32), "");
  EXPECT_NE(check_sum(reinterpret_cast<const uint8_t*>(fwrong), fin, 0, 1, ncclFloat32), "");
  const float fnan[1] = {NAN};
  EXPECT_NE(check_sum(reinterpret_cast<const uint8_t*>(fnan), fin, 0, 1, ncclFloat32), "");
}

TEST(TestData, ByteHelpers) {
  const uint8_t x[4] = {1, 2, 3, 4}, y[4] = {1, 2, 9, 4};
  EXPECT_EQ(first_difference(x, x, 4), SIZE_MAX);
  EXPECT_EQ(first_difference(x, y, 4), 2u);
  const uint8_t p[3] = {kPoison, kPoison, 0};
  EXPECT_EQ(first_not(p, 2, kPoison), SIZE_MAX);
  EXPECT_EQ(first_not(p, 3, kPoison), 2u);
  EXPECT_EQ(bytes_at(x, 4, 2), "0x03 0x04");
}

TEST(SoakPattern, DeterministicAndRankDependent) {
  int same_as_other_rank = 0, same_as_other_seed = 0;
  for (uint64_t i = 0; i < 4096; ++i) {
    EXPECT_EQ(pattern_byte(9, 1, i), pattern_byte(9, 1, i));
    same_as_other_rank += pattern_byte(9, 1, i) == pattern_byte(9, 2, i);
    same_as_other_seed += pattern_byte(9, 1, i) == pattern_byte(10, 1, i);
  }
  // Unrelated bytes agree 1 time in 256 (16 expected here).
  EXPECT_LT(same_as_other_rank, 64) << "ranks' patterns should be unrelated";
  EXPECT_LT(same_as_other_seed, 64) << "seeds' patterns should be unrelated";
}

}  // namespace
}  // namespace zgpu
