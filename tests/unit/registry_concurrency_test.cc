// The shared state that every wrapper touches from the application's threads (and from
// PyTorch's watchdog thread), hammered from many threads. Meant to run under ThreadSanitizer
// (`make tsan`), where a missing lock or a state freed while still in use is reported even
// when the run happens to produce the right numbers:
//   - the communicator registry (comm_add / comm_lookup / comm_remove): lookups racing
//     removals and re-additions of the same handle, a state outliving its removal while a
//     caller still holds it, exactly one winner when several threads remove one handle;
//   - the counters (every kind, including the pool gauge) read by snapshots, JSON and resets
//     while they are being counted;
//   - the wrappers themselves, in this process, against the fake NCCL of tests/fake_nccl:
//     a sanitized libzerocta.so cannot be preloaded into uninstrumented programs, so this is
//     how the code paths of the interposition concurrency test get ThreadSanitizer coverage.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm_state.h"
#include "config.h"
#include "stats.h"
#include "stats_snapshot.h"
#include "writer_preferring_lock.h"
#include "zerocta.h"

namespace {

// Registry keys only: the registry never dereferences a handle. Each test uses its own
// range so that tests sharing a process never see each other's handles.
ncclComm_t handle(uintptr_t range, uintptr_t n) {
  return reinterpret_cast<ncclComm_t>(0x7e5700000000ULL + (range << 32) + n * 64);
}

// Overlap between threads must not depend on luck in scheduling: a thread whose partners
// have not yet observed enough keeps going past its planned rounds, up to a deadline.
using Clock = std::chrono::steady_clock;
bool keep_going(int round, int rounds, const std::atomic<long>& observed, long wanted,
                Clock::time_point deadline) {
  return round < rounds || (observed.load() < wanted && Clock::now() < deadline);
}

// Releases every waiting thread at once, round after round.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int n_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
};

// What a wrapper does with a state it looked up: atomics, both of its mutexes.
void use_state(zc::CommState& st) {
  (void)st.poisoned.load(std::memory_order_relaxed);
  (void)st.has_app_windows.load();
  { std::lock_guard<std::mutex> lock(st.issue_mu); }
  std::lock_guard<std::mutex> lock(st.windows_mu);
  (void)st.app_windows.size();
}

// Owners add, look up and remove their own handles round after round while readers look up
// everybody's: a reader gets either nothing or the right, live state.
TEST(RegistryConcurrency, LookupsRaceAddsAndRemoves) {
  constexpr int kOwners = 6, kReaders = 4, kHandles = 32, kRounds = 60, kMinHits = 100;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::atomic<int> owners_left{kOwners};
  std::atomic<long> wrong{0}, hits{0}, misses{0};
  std::vector<std::thread> threads;
  for (int o = 0; o < kOwners; ++o) {
    threads.emplace_back([&, o] {
      for (int round = 0; keep_going(round, kRounds, hits, kMinHits, deadline); ++round) {
        std::vector<std::shared_ptr<zc::CommState>> mine;
        for (int h = 0; h < kHandles; ++h) {
          auto st = zc::comm_add(handle(1, o * kHandles + h));
          if (!st || st->comm != handle(1, o * kHandles + h)) wrong++;
          mine.push_back(st);
        }
        for (int h = 0; h < kHandles; ++h)
          if (zc::comm_lookup(handle(1, o * kHandles + h)) != mine[h]) wrong++;
        for (int h = 0; h < kHandles; ++h)
          if (zc::comm_remove(handle(1, o * kHandles + h)) != mine[h]) wrong++;
        for (int h = 0; h < kHandles; ++h)
          if (zc::comm_lookup(handle(1, o * kHandles + h)) != nullptr) wrong++;
      }
      owners_left--;
    });
  }
  // Readers pause between lookups like a wrapper doing its call: readers looping without a
  // pause starve the writers (see WaitingWriterKeepsNewReadersOut).
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      uint32_t x = 0x9e3779b9u * (r + 1);
      while (owners_left.load() > 0) {
        x = x * 1664525u + 1013904223u;
        const ncclComm_t h = handle(1, (x >> 8) % (kOwners * kHandles));
        if (auto st = zc::comm_lookup(h)) {
          if (st->comm != h) wrong++;
          use_state(*st);  // may be removed from the registry meanwhile: still ours to use
          hits++;
        } else {
          misses++;
        }
        std::this_thread::yield();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(hits.load(), kMinHits) << "the readers hardly overlapped a live handle";
  for (int h = 0; h < kOwners * kHandles; ++h) EXPECT_EQ(zc::comm_lookup(handle(1, h)), nullptr);
}

// Several threads tear down the same communicator at once (e.g. the watchdog's abort and the
// main thread's destroy): exactly one of them gets the state.
TEST(RegistryConcurrency, ExactlyOneRemoverWins) {
  constexpr int kRacers = 6, kRounds = 300;
  Barrier barrier(kRacers + 1);
  std::shared_ptr<zc::CommState> added;
  std::atomic<int> winners{0}, wrong{0};
  std::vector<std::thread> racers;
  for (int r = 0; r < kRacers; ++r) {
    racers.emplace_back([&, r] {
      for (int round = 0; round < kRounds; ++round) {
        barrier.wait();  // `added` is set
        const ncclComm_t h = handle(2, round);
        // Half the racers look the handle up first, as Abort's callers do.
        if (r % 2 == 0)
          if (auto st = zc::comm_lookup(h))
            if (st != added) wrong++;
        if (auto st = zc::comm_remove(h)) {
          winners++;
          if (st != added) wrong++;
        }
        barrier.wait();  // round over
      }
    });
  }
  for (int round = 0; round < kRounds; ++round) {
    added = zc::comm_add(handle(2, round));
    barrier.wait();
    barrier.wait();
    EXPECT_EQ(winners.exchange(0), 1) << "round " << round;
    EXPECT_EQ(zc::comm_lookup(handle(2, round)), nullptr);
    added.reset();
  }
  for (std::thread& t : racers) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// A caller that looked a state up keeps it alive and intact through its removal and through
// a new communicator that NCCL happens to place at the same address; the registry drops its
// reference, so the state dies with the last holder.
TEST(RegistryConcurrency, HeldStateOutlivesRemovalAndHandleReuse) {
  constexpr int kHolders = 4, kRounds = 100;
  Barrier barrier(kHolders + 1);
  std::atomic<int> wrong{0};
  std::vector<std::thread> holders;
  for (int t = 0; t < kHolders; ++t) {
    holders.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        const ncclComm_t h = handle(3, round);
        barrier.wait();  // the state is registered
        auto st = zc::comm_lookup(h);
        if (!st) {
          wrong++;
          barrier.wait();
          barrier.wait();
          continue;
        }
        barrier.wait();  // every holder holds it; the main thread removes and re-adds
        for (int i = 0; i < 50; ++i) {
          use_state(*st);
          std::lock_guard<std::mutex> lock(st->windows_mu);
          st->app_windows.push_back({static_cast<uintptr_t>(t), 1, nullptr});
        }
        st->poisoned.store(ncclRemoteError);
        if (st->comm != h) wrong++;
        st.reset();
        barrier.wait();  // all holders dropped it
      }
    });
  }
  for (int round = 0; round < kRounds; ++round) {
    const ncclComm_t h = handle(3, round);
    std::weak_ptr<zc::CommState> old = zc::comm_add(h);
    barrier.wait();
    barrier.wait();
    auto removed = zc::comm_remove(h);
    EXPECT_EQ(removed, old.lock());
    removed.reset();
    auto reused = zc::comm_add(h);  // same address, new communicator
    EXPECT_NE(reused, old.lock());
    barrier.wait();
    EXPECT_TRUE(old.expired()) << "round " << round << ": the registry kept a removed state";
    EXPECT_EQ(reused->poisoned.load(), ncclSuccess) << "a holder wrote into the new state";
    EXPECT_TRUE(reused->app_windows.empty());
    EXPECT_EQ(zc::comm_remove(h), reused);
  }
  for (std::thread& t : holders) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Communicators that stay registered are found, always as the same state, however much the
// table around them grows, shrinks and rehashes.
TEST(RegistryConcurrency, StableHandlesSurviveChurnAround) {
  constexpr int kStable = 16, kChurners = 4, kReaders = 3, kChurn = 100, kBatch = 64;
  // Enough lookups to interleave with the churn many times (16 per pass). Not more: the lock
  // prefers writers, so under TSan on 2 cores 4 churners leave the readers about 90 lookups
  // a second (928 in 10 s in one CI run).
  constexpr long kMinLookups = 256;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  std::vector<std::shared_ptr<zc::CommState>> stable;
  for (int i = 0; i < kStable; ++i) stable.push_back(zc::comm_add(handle(4, i)));
  std::atomic<int> churners_left{kChurners};
  std::atomic<long> wrong{0}, lookups{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kChurners; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; keep_going(i, kChurn, lookups, kMinLookups, deadline); ++i) {
        // A batch at a time, so the table really grows and shrinks.
        const int first = (i * kChurners + c) * kBatch;
        for (int b = 0; b < kBatch; ++b) zc::comm_add(handle(5, first + b));
        for (int b = 0; b < kBatch; ++b)
          if (!zc::comm_remove(handle(5, first + b))) wrong++;
      }
      churners_left--;
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&] {
      while (churners_left.load() > 0) {
        for (int i = 0; i < kStable; ++i) {
          if (zc::comm_lookup(handle(4, i)) != stable[i]) wrong++;
          lookups++;
        }
        std::this_thread::yield();  // see LookupsRaceAddsAndRemoves
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GE(lookups.load(), kMinLookups);
  for (int i = 0; i < kStable; ++i) EXPECT_EQ(zc::comm_remove(handle(4, i)), stable[i]);
}

// comm_add/comm_remove (every communicator creation and teardown) must not wait for a stream
// of lookups to pause. With glibc's reader-preferring default, 3 threads looking handles up
// back to back on 2 cores held 400 adds and removes up for 58 ms to 1.8 s, run to run; with
// the writer-preferring lock, 6-30 ms. Timing cannot tell them apart on a loaded CI machine
// (a 200 ms limit once read 211 ms), so this checks the property that prevents starvation:
// while a reader holds the lock and a writer waits, a new reader does not get in. A
// reader-preferring lock lets it in every time, and the test fails at its deadline.
TEST(RegistryConcurrency, WaitingWriterKeepsNewReadersOut) {
  zc::WriterPreferringLock lock;
  lock.lock_shared();  // the reader already inside
  std::atomic<bool> writer_in{false};
  std::thread writer([&] {
    lock.lock();
    writer_in.store(true);
    lock.unlock();
  });
  // The writer has queued once a new reader is refused; until then it may not have started.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool new_reader_refused = false;
  while (!new_reader_refused && std::chrono::steady_clock::now() < deadline) {
    if (lock.try_lock_shared()) {
      lock.unlock_shared();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else {
      new_reader_refused = true;
    }
  }
  EXPECT_TRUE(new_reader_refused) << "a new reader got in past a waiting writer for 10 s";
  EXPECT_FALSE(writer_in.load()) << "the writer got in while a reader held the lock";
  lock.unlock_shared();
  writer.join();
  EXPECT_TRUE(writer_in.load());
}

bool never_decreased(const zerocta_stats_t& a, const zerocta_stats_t& b) {
  for (int o = 0; o < zerocta_op_count; ++o)
    for (int r = 0; r < zerocta_route_count; ++r)
      if (b.counters[o][r].calls < a.counters[o][r].calls ||
          b.counters[o][r].bytes < a.counters[o][r].bytes)
        return false;
  return b.comms_created >= a.comms_created && b.comms_zero_policy >= a.comms_zero_policy &&
         b.comms_ce_ready >= a.comms_ce_ready && b.inner_calls >= a.inner_calls;
}

// Every kind of counter, from many threads, while readers take snapshots and build the JSON:
// totals exact, and no snapshot ever sees a counter go backwards.
TEST(StatsConcurrency, AllCountersExactWhileRead) {
  constexpr int kThreads = 6, kIters = 20000;
  zerocta_stats_t before;
  ASSERT_EQ(zerocta_get_stats(&before), 0);
  std::atomic<bool> counting{true};
  std::atomic<long> backwards{0}, reads{0}, bad_json{0};
  std::thread reader([&] {
    zerocta_stats_t prev = before, now;
    do {
      zerocta_get_stats(&now);
      if (!never_decreased(prev, now)) backwards++;
      prev = now;
      const std::string json = zc::stats_json(now, getpid());
      if (json.empty() || json.front() != '{' || json.back() != '\n') bad_json++;
      reads++;
    } while (counting.load());
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kIters; ++i) {
        zc::stats_count(static_cast<zerocta_op_t>((i + t) % zerocta_op_count),
                        static_cast<zerocta_route_t>((i / zerocta_op_count) % zerocta_route_count),
                        static_cast<uint64_t>(i % 7 + 1));
        if (i % 16 == 0) zc::stats_comm_created(i % 32 == 0);
        if (i % 64 == 0) zc::stats_comm_ce_ready();
        if (i % 5 == 0) zc::stats_inner_call();
        zc::stats_pool_bytes_add(4096);
        zc::stats_pool_bytes_add(-4096);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  counting.store(false);
  reader.join();
  zerocta_stats_t after;
  ASSERT_EQ(zerocta_get_stats(&after), 0);

  // The same schedule, counted here without threads.
  uint64_t calls[zerocta_op_count][zerocta_route_count] = {};
  uint64_t bytes[zerocta_op_count][zerocta_route_count] = {};
  uint64_t created = 0, zero = 0, ce = 0, inner = 0;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kIters; ++i) {
      const int o = (i + t) % zerocta_op_count, r = (i / zerocta_op_count) % zerocta_route_count;
      calls[o][r] += 1;
      bytes[o][r] += static_cast<uint64_t>(i % 7 + 1);
      created += i % 16 == 0;
      zero += i % 32 == 0;
      ce += i % 64 == 0;
      inner += i % 5 == 0;
    }
  }
  for (int o = 0; o < zerocta_op_count; ++o) {
    for (int r = 0; r < zerocta_route_count; ++r) {
      EXPECT_EQ(after.counters[o][r].calls - before.counters[o][r].calls, calls[o][r]) << o << r;
      EXPECT_EQ(after.counters[o][r].bytes - before.counters[o][r].bytes, bytes[o][r]) << o << r;
    }
  }
  EXPECT_EQ(after.comms_created - before.comms_created, created);
  EXPECT_EQ(after.comms_zero_policy - before.comms_zero_policy, zero);
  EXPECT_EQ(after.comms_ce_ready - before.comms_ce_ready, ce);
  EXPECT_EQ(after.inner_calls - before.inner_calls, inner);
  EXPECT_EQ(after.pool_bytes, before.pool_bytes) << "every +4096 had its -4096";
  EXPECT_EQ(backwards.load(), 0);
  EXPECT_EQ(bad_json.load(), 0);
  EXPECT_GT(reads.load(), 0);
}

// zerocta_reset_stats while other threads count: it is documented as not atomic across
// counters, but it must be race-free, and what is counted after the last reset is exact.
TEST(StatsConcurrency, ResetWhileCounting) {
  constexpr int kThreads = 4, kIters = 20000;
  std::atomic<bool> counting{true};
  std::thread resetter([&] {
    while (counting.load()) zerocta_reset_stats();
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < kIters; ++i) {
        zc::stats_count(zerocta_op_allreduce, zerocta_route_passthrough, 8);
        zc::stats_comm_created(true);
        zc::stats_inner_call();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  counting.store(false);
  resetter.join();
  zerocta_stats_t s;
  ASSERT_EQ(zerocta_get_stats(&s), 0);
  EXPECT_LE(s.counters[zerocta_op_allreduce][zerocta_route_passthrough].calls,
            static_cast<uint64_t>(kThreads) * kIters);
  zerocta_reset_stats();
  std::vector<std::thread> again;
  for (int t = 0; t < kThreads; ++t)
    again.emplace_back([] {
      for (int i = 0; i < kIters; ++i)
        zc::stats_count(zerocta_op_allreduce, zerocta_route_passthrough, 8);
    });
  for (std::thread& th : again) th.join();
  ASSERT_EQ(zerocta_get_stats(&s), 0);
  EXPECT_EQ(s.counters[zerocta_op_allreduce][zerocta_route_passthrough].calls,
            static_cast<uint64_t>(kThreads) * kIters);
  EXPECT_EQ(s.counters[zerocta_op_allreduce][zerocta_route_passthrough].bytes,
            static_cast<uint64_t>(kThreads) * kIters * 8);
}

// ---- The wrappers in this process, against the fake NCCL ----------------------------------

// The build puts the fakes in <build>/fake_nccl and this binary in <build>/tests/unit.
std::string fake_nccl_dir() {
#ifdef FAKE_NCCL_DIR
  return FAKE_NCCL_DIR;
#else
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  std::string path(exe, static_cast<size_t>(n));
  path = path.substr(0, path.rfind('/'));
  return path + "/../../fake_nccl";
#endif
}

// Loads the fake driver and NCCL globally, so that the wrappers' lookup of "libnccl.so.2"
// (dlopen RTLD_NOLOAD, by soname) finds the fake as it would find the real one.
bool load_fake_nccl(std::string* why) {
  const std::string dir = fake_nccl_dir();
  for (const char* lib : {"libcuda.so.1", "libnccl.so.2"}) {
    const std::string path = dir + "/" + lib;
    if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
      *why = std::string("cannot load ") + path + " (build the fake_nccl target): " + dlerror();
      return false;
    }
  }
  return true;
}

class Live {
 public:
  void add(ncclComm_t c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.insert(c);
  }
  void remove(ncclComm_t c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.erase(c);
  }
  // fn(comm) for each live communicator, under the lock that keeps it from being destroyed.
  template <typename Fn>
  void each(Fn fn) {
    std::lock_guard<std::mutex> lock(mu_);
    for (ncclComm_t c : comms_) fn(c);
  }

 private:
  std::mutex mu_;
  std::set<ncclComm_t> comms_;
};

uint64_t calls_of(const zerocta_stats_t& s, zerocta_op_t op) {
  uint64_t n = 0;
  for (int r = 0; r < zerocta_route_count; ++r) n += s.counters[op][r].calls;
  return n;
}

// A smaller copy of tests/interpose/drivers/drv_concurrency.cc: workers issuing collectives
// and nested groups, a churner creating and tearing down communicators by every path, a
// watchdog polling ncclCommGetAsyncError; counters exact afterwards.
void run_workload() {
  std::string why;
  ASSERT_TRUE(load_fake_nccl(&why)) << why;
  constexpr int kWorkers = 4, kComms = 2, kIters = 100, kChurners = 2, kCycles = 60;
  zerocta_stats_t before;
  ASSERT_EQ(zerocta_get_stats(&before), 0);
  Live live;
  std::atomic<long> failures{0}, polls{0};
  std::atomic<bool> go{false}, stop{false};
  auto ok = [&failures](ncclResult_t r) {
    if (r != ncclSuccess) failures++;
  };
  auto stream = reinterpret_cast<cudaStream_t>(0x5701);
  auto buf = reinterpret_cast<void*>(0xd0000000);
  auto create = [&](bool with_config, bool nonblocking) {
    ncclUniqueId id;
    ok(ncclGetUniqueId(&id));
    ncclComm_t c = nullptr;
    if (with_config) {
      ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
      if (nonblocking) cfg.blocking = 0;
      ok(ncclCommInitRankConfig(&c, 2, id, 0, &cfg));
    } else {
      ok(ncclCommInitRank(&c, 2, id, 0));
    }
    if (c) live.add(c);
    return c;
  };

  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      while (!go.load()) std::this_thread::yield();
      std::vector<ncclComm_t> comms;
      for (int j = 0; j < kComms; ++j) comms.push_back(create(j % 2 == 1, false));
      // All-gathers on the first communicator run in a window the application registered.
      ncclWindow_t win = nullptr;
      ok(ncclCommWindowRegister(comms[0], buf, 4096, &win, NCCL_WIN_COLL_SYMMETRIC));
      for (int i = 0; i < kIters; ++i) {
        for (ncclComm_t c : comms) {
          ok(ncclAllGather(buf, buf, 64, ncclFloat32, c, stream));
          ok(ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, c, stream));
          ok(ncclBroadcast(buf, buf, 64, ncclInt8, 0, c, stream));
        }
        ok(ncclBcast(buf, 16, ncclInt8, 0, comms[i % kComms], stream));
        ok(ncclGroupStart());
        ok(ncclGroupStart());
        for (ncclComm_t c : comms) {
          ok(ncclSend(buf, 8, ncclFloat32, 1, c, stream));
          ok(ncclRecv(buf, 8, ncclFloat32, 1, c, stream));
        }
        ok(ncclGroupEnd());
        ok(ncclGroupEnd());
      }
      // The watchdog must have polled while communicators were alive, whatever the scheduling.
      const auto deadline = Clock::now() + std::chrono::seconds(10);
      while (polls.load() == 0 && Clock::now() < deadline) std::this_thread::yield();
      ok(ncclCommWindowDeregister(comms[0], win));
      for (int j = 0; j < kComms; ++j) {
        live.remove(comms[j]);
        if (w % 2 == 1) ok(ncclCommFinalize(comms[j]));
        ok(ncclCommDestroy(comms[j]));
      }
    });
  }
  for (int ch = 0; ch < kChurners; ++ch) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      ncclComm_t parent = create(false, false);
      for (int k = 0; k < kCycles; ++k) {
        ncclComm_t c = nullptr, second = nullptr;
        switch (k % 6) {
          case 0:
            c = create(true, true);
            break;
          case 1:
            ok(ncclCommSplit(parent, 1 + k, 0, &c, nullptr));
            if (c) live.add(c);
            break;
          case 2:
            ok(ncclGroupStart());
            c = create(true, false);
            ok(ncclGroupEnd());
            break;
          case 3:
            c = create(false, false);
            break;
          case 4: {
            int excluded[1] = {1};
            ok(ncclCommShrink(parent, excluded, 1, &c, nullptr, NCCL_SHRINK_DEFAULT));
            if (c) live.add(c);
            break;
          }
          case 5: {  // two devices of the fake driver, switched to and back by the shim
            ncclComm_t pair[2] = {};
            const int devs[2] = {0, 1};
            ok(ncclCommInitAll(pair, 2, devs));
            c = pair[0];
            second = pair[1];
            if (second) {
              live.add(second);
            } else {
              failures++;
            }
            if (c) live.add(c);
            break;
          }
        }
        if (!c) {
          failures++;
          continue;
        }
        ok(ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, c, stream));
        for (ncclComm_t t : {c, second}) {
          if (!t) continue;
          live.remove(t);
          if (k % 6 == 4) {
            ok(ncclCommRevoke(t, 0));
            ok(ncclCommDestroy(t));
          } else if (k % 3 == 0) {
            ok(ncclCommAbort(t));
          } else {
            ok(ncclCommFinalize(t));
            ok(ncclCommDestroy(t));
          }
        }
      }
      live.remove(parent);
      ok(ncclCommDestroy(parent));
    });
  }
  std::thread watchdog([&] {
    while (!go.load()) std::this_thread::yield();
    while (!stop.load()) {
      live.each([&](ncclComm_t c) {
        ncclResult_t async = ncclInProgress;
        ok(ncclCommGetAsyncError(c, &async));
        // ncclInProgress is no error: a non-blocking comm reports it while another thread
        // runs the shim's pool set-up (PyTorch's watchdog tolerates it the same way).
        if (async != ncclInProgress) ok(async);
        polls++;
      });
      zerocta_stats_t s;
      zerocta_get_stats(&s);
      std::this_thread::yield();
    }
  });
  go.store(true);
  for (std::thread& t : threads) t.join();
  stop.store(true);
  watchdog.join();

  zerocta_stats_t after;
  ASSERT_EQ(zerocta_get_stats(&after), 0);
  const uint64_t wi = static_cast<uint64_t>(kWorkers) * kIters;
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(polls.load(), 0);
  EXPECT_EQ(calls_of(after, zerocta_op_allgather) - calls_of(before, zerocta_op_allgather),
            wi * kComms);
  EXPECT_EQ(calls_of(after, zerocta_op_allreduce) - calls_of(before, zerocta_op_allreduce),
            wi * kComms + kChurners * kCycles);
  EXPECT_EQ(calls_of(after, zerocta_op_broadcast) - calls_of(before, zerocta_op_broadcast),
            wi * kComms + wi);
  EXPECT_EQ(calls_of(after, zerocta_op_send) - calls_of(before, zerocta_op_send), wi * kComms);
  EXPECT_EQ(calls_of(after, zerocta_op_recv) - calls_of(before, zerocta_op_recv), wi * kComms);
  const uint64_t init_alls = kCycles / 6;  // cycles k with k % 6 == 5
  static_assert(kCycles % 6 == 0, "init_alls above");
  EXPECT_EQ(after.comms_created - before.comms_created,
            static_cast<uint64_t>(kWorkers) * kComms + kChurners * (1 + kCycles + init_alls));
  EXPECT_EQ(after.counters[zerocta_op_allgather][zerocta_route_nccl_ce].calls -
                before.counters[zerocta_op_allgather][zerocta_route_nccl_ce].calls,
            wi)
      << "the all-gathers in the registered windows take the nccl-ce route";
}

TEST(WrappersInProcess, CollectivesChurnAndWatchdog) { run_workload(); }

// The same with ZEROCTA_ALLGATHER=auto: each creation also runs the copy-engine pool set-up
// (which gives up here: the fake driver has no copy-engine API) and each teardown the release.
TEST(WrappersInProcess, CopyEngineSetupPathUnderThreads) {
  setenv("ZEROCTA_ALLGATHER", "auto", 1);
  if (zc::config().allgather != zc::RouteMode::kAuto)
    GTEST_SKIP() << "the configuration was read earlier in this process; run this test alone "
                    "(as ctest does)";
  run_workload();
}

// PyTorch's watchdog aborts a hung communicator from its own thread while the main thread
// may still be issuing on it; NCCL allows ncclCommAbort from another thread for exactly that.
// The wrappers must neither crash nor race: the issuer holds its own reference to the state,
// the abort removes it and poisons it. A call that looked the state up before the abort and
// reads the poison after it returns ncclRemoteError without reaching NCCL (not counted);
// every other call is forwarded and counted. (The fake never dereferences a handle in a
// collective, so calls after the abort are harmless here.)
TEST(WrappersInProcess, AbortFromAnotherThreadWhileIssuing) {
  std::string why;
  ASSERT_TRUE(load_fake_nccl(&why)) << why;
  constexpr int kRounds = 40;
  auto stream = reinterpret_cast<cudaStream_t>(0x5702);
  auto buf = reinterpret_cast<void*>(0xd1000000);
  zerocta_stats_t before;
  ASSERT_EQ(zerocta_get_stats(&before), 0);
  uint64_t forwarded = 0;
  std::atomic<long> unexpected{0};
  for (int round = 0; round < kRounds; ++round) {
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t c = nullptr;
    ASSERT_EQ(ncclCommInitRank(&c, 2, id, 0), ncclSuccess);
    std::atomic<bool> aborted{false};
    std::atomic<uint64_t> calls{0}, ok{0};
    std::thread issuer([&] {
      // Some calls before the abort lands, and a few after it returned.
      for (int after = 0; after < 3;) {
        for (ncclResult_t r : {ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, c, stream),
                               ncclAllGather(buf, buf, 64, ncclFloat32, c, stream)}) {
          if (r == ncclSuccess) {
            ok++;
          } else if (r != ncclRemoteError) {
            unexpected++;
          }
        }
        calls += 2;
        if (aborted.load()) ++after;
      }
    });
    while (calls.load() < 2 * static_cast<uint64_t>(round % 5 + 1)) std::this_thread::yield();
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
    aborted.store(true);
    issuer.join();
    forwarded += ok.load();
  }
  zerocta_stats_t after;
  ASSERT_EQ(zerocta_get_stats(&after), 0);
  EXPECT_EQ(calls_of(after, zerocta_op_allreduce) - calls_of(before, zerocta_op_allreduce) +
                calls_of(after, zerocta_op_allgather) - calls_of(before, zerocta_op_allgather),
            forwarded)
      << "every forwarded call is counted once, before and after the abort";
  EXPECT_EQ(unexpected.load(), 0) << "a call returned neither success nor the abort's poison";
}

}  // namespace
