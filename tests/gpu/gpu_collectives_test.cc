// Correctness of every collective a program reaches through the public nccl* symbols, which
// the shim intercepts when it is preloaded. Each output is checked three ways:
//   (a) against the known inputs (every rank regenerates every rank's input from a seed):
//       exactly for all-gather, broadcast and send/recv and for integer sums, within a
//       rounding bound for floating-point sums;
//   (b) bitwise against the same operation issued through NCCL's pnccl* alias on the same
//       communicator (the shim does not export pnccl*, so that call always reaches NCCL's own
//       path);
//   (c) as an FNV-1a digest appended to $ZCTEST_DIGEST_FILE, so a run with the shim and a run
//       without can be diffed; that covers sums whose value depends on summation order.
// Outputs are poisoned (0xAB) before each operation and guard bytes around them must survive.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "digest.h"
#include "gpu_gtest.h"
#include "mp_harness.h"
#include "rank_util.h"
#include "test_data.h"

namespace zgpu {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGuard = 256;  // poisoned bytes on each side of an output

// Byte sizes of one rank's buffer; count = max(1, bytes / sizeof(type)).
const std::vector<size_t> kSizes = {1, 3, 4096, 4097, 65543, kMiB + 13, 8 * kMiB, 64 * kMiB};
const std::vector<ncclDataType_t> kTypes = {ncclInt8,    ncclInt32,   ncclFloat16, ncclBfloat16,
                                            ncclFloat32, ncclFloat64, ncclUint64};

size_t max_case_bytes() {
  return static_cast<size_t>(env_long("ZCTEST_COLL_MAX_BYTES", static_cast<long>(64 * kMiB)));
}

uint64_t base_seed() { return static_cast<uint64_t>(env_long("ZCTEST_COLL_SEED", 20250917)); }

// The communicator an operation runs on (the world or a child of a split).
struct Comm {
  ncclComm_t comm = nullptr;
  int n = 0;   // ranks in comm
  int me = 0;  // my rank in comm
  std::string name;
};

struct Case {
  size_t size_index;
  ncclDataType_t dt;
  size_t count;  // elements per rank
  size_t cb() const { return count * dtype_size(dt); }
};

// Per-rank resources shared by all cases of one test: a stream, device buffers sized for the
// largest case, digests and the failure count.
class Env {
 public:
  Env(const RankContext& ctx, std::string test)
      : ctx_(ctx), test_(std::move(test)), log_(ctx.rank) {
    ZG_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const size_t cap = static_cast<size_t>(ctx.nranks) * std::max<size_t>(max_case_bytes(), 4096);
    capacity_ = cap;
    ZG_CUDA(cudaMalloc(&send_, cap));
    ZG_CUDA(cudaMalloc(&out_pub_, cap + 2 * kGuard));
    ZG_CUDA(cudaMalloc(&out_ref_, cap + 2 * kGuard));
  }
  ~Env() {
    if (std::uncaught_exceptions() > 0) return;  // possibly hung GPU: leave it to _exit
    cudaFree(send_);
    cudaFree(out_pub_);
    cudaFree(out_ref_);
    cudaStreamDestroy(stream_);
  }
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  const RankContext& ctx() const { return ctx_; }
  cudaStream_t stream() const { return stream_; }
  uint8_t* send() const { return static_cast<uint8_t*>(send_); }
  size_t capacity() const { return capacity_; }

  // Inputs of every rank of `comm` for case `c`: `elems` elements each.
  const std::vector<std::vector<uint8_t>>& inputs(const Comm& comm, const Case& c, size_t elems) {
    inputs_.clear();
    for (int q = 0; q < comm.n; ++q) {
      inputs_.push_back(make_input(c.dt, elems,
                                   seed_of({base_seed(), c.size_index, static_cast<uint64_t>(c.dt),
                                            static_cast<uint64_t>(q), elems})));
    }
    return inputs_;
  }

  void upload(void* dst, const void* src, size_t len) {
    if (len) ZG_CUDA(cudaMemcpyAsync(dst, src, len, cudaMemcpyHostToDevice, stream_));
  }

  // Runs `op` twice, through the public symbols (real=false) and through pncclXxx (real=true),
  // each into a freshly poisoned output of out_bytes; `prepare(out)` runs before each (after
  // the poisoning), e.g. to place an in-place input. Checks the guards and that both results
  // are bitwise equal, and records the digest. Returns the public result.
  std::vector<uint8_t> run_both(const std::string& label, size_t out_bytes,
                                const std::function<void(uint8_t* out)>& prepare,
                                const std::function<ncclResult_t(uint8_t* out, bool real)>& op,
                                ncclComm_t comm) {
    std::vector<uint8_t> host[2];
    uint8_t* regions[2] = {static_cast<uint8_t*>(out_pub_), static_cast<uint8_t*>(out_ref_)};
    for (int real = 0; real < 2; ++real) {
      ZG_CUDA(cudaMemsetAsync(regions[real], kPoison, out_bytes + 2 * kGuard, stream_));
      uint8_t* out = regions[real] + kGuard;
      prepare(out);
      ncclResult_t res = op(out, real != 0);
      if (res != ncclSuccess) {
        fail(label + (real ? " via pnccl" : " via nccl") + " returned " + ncclGetErrorString(res) +
             "; last error: " + ncclGetLastError(comm));
      }
    }
    // Wait with a deadline first: a copy to pageable memory would block on a hung op for good.
    wait_stream(stream_, label);
    check_comm_async(comm, label);
    for (int real = 0; real < 2; ++real) {
      host[real].resize(out_bytes + 2 * kGuard);
      ZG_CUDA(cudaMemcpyAsync(host[real].data(), regions[real], host[real].size(),
                              cudaMemcpyDeviceToHost, stream_));
    }
    wait_stream(stream_, label + " (copy back)");
    for (int real = 0; real < 2; ++real) {
      const char* path = real ? "pnccl" : "nccl";
      const uint8_t* h = host[real].data();
      size_t bad = first_not(h, kGuard, kPoison);
      if (bad != SIZE_MAX) mismatch(label, path, "guard before output overwritten", bad);
      bad = first_not(h + kGuard + out_bytes, kGuard, kPoison);
      if (bad != SIZE_MAX) mismatch(label, path, "guard after output overwritten", bad);
    }
    std::vector<uint8_t> pub(host[0].begin() + kGuard, host[0].begin() + kGuard + out_bytes);
    const uint8_t* ref = host[1].data() + kGuard;
    const size_t diff = first_difference(pub.data(), ref, out_bytes);
    if (diff != SIZE_MAX) {
      mismatch(label, "nccl vs pnccl",
               "results differ (nccl " + bytes_at(pub.data(), out_bytes, diff) + ", pnccl " +
                   bytes_at(ref, out_bytes, diff) + ")",
               diff);
    }
    log_.add(label, pub.data(), out_bytes);
    return pub;
  }

  void expect_bytes(const std::string& label, const std::vector<uint8_t>& got,
                    const uint8_t* want) {
    const size_t diff = first_difference(got.data(), want, got.size());
    if (diff != SIZE_MAX) {
      mismatch(label, "nccl",
               "differs from the expected bytes (got " + bytes_at(got.data(), got.size(), diff) +
                   ", want " + bytes_at(want, got.size(), diff) + ")",
               diff);
    }
  }

  void expect_sum(const std::string& label, const std::vector<uint8_t>& got, size_t offset_elems,
                  const Case& c) {
    std::vector<const uint8_t*> ptrs;
    for (const auto& in : inputs_) ptrs.push_back(in.data());
    const std::string err = check_sum(got.data(), ptrs, offset_elems, c.count, c.dt);
    if (!err.empty()) mismatch(label, "nccl", "wrong sum: " + err, 0);
  }

  std::string label(const Comm& comm, const char* op, const Case& c) const {
    return "test=" + test_ + " comm=" + comm.name + " n=" + std::to_string(comm.n) + " op=" + op +
           " dt=" + dtype_name(c.dt) + " count=" + std::to_string(c.count);
  }

  void mismatch(const std::string& label, const char* path, const std::string& what,
                size_t offset) {
    if (++failures_ <= 20) {
      report("MISMATCH " + label + " [" + path + "] " + what + " at byte offset " +
             std::to_string(offset));
    }
  }

  // Flushes digests; returns the rank's exit status.
  int finish() {
    log_.flush();
    const std::string stats = shim_allgather_stats_line();
    if (!stats.empty()) printf("[rank %d] zerocta stats: %s\n", ctx_.rank, stats.c_str());
    if (failures_ > 20) report(std::to_string(failures_) + " mismatches in total");
    return failures_ == 0 ? 0 : 1;
  }

 private:
  RankContext ctx_;
  std::string test_;
  DigestLog log_;
  cudaStream_t stream_ = nullptr;
  void* send_ = nullptr;
  void* out_pub_ = nullptr;
  void* out_ref_ = nullptr;
  size_t capacity_ = 0;
  std::vector<std::vector<uint8_t>> inputs_;
  int failures_ = 0;
};

// Calls fn for every (size, type) case not above ZCTEST_COLL_MAX_BYTES.
void for_each_case(const std::vector<ncclDataType_t>& types,
                   const std::function<void(const Case&)>& fn) {
  for (size_t si = 0; si < kSizes.size(); ++si) {
    if (kSizes[si] > max_case_bytes()) continue;
    for (ncclDataType_t dt : types) {
      Case c{si, dt, std::max<size_t>(1, kSizes[si] / dtype_size(dt))};
      fn(c);
      heartbeat();
    }
  }
}

void all_gather_case(Env& env, const Comm& comm, const Case& c, bool in_place) {
  const auto& in = env.inputs(comm, c, c.count);
  const size_t cb = c.cb();
  const size_t out_bytes = cb * static_cast<size_t>(comm.n);
  std::vector<uint8_t> want;
  for (const auto& v : in) want.insert(want.end(), v.begin(), v.end());
  if (!in_place) env.upload(env.send(), in[comm.me].data(), cb);
  const std::string label = env.label(comm, in_place ? "allgather_inplace" : "allgather", c);
  auto got = env.run_both(
      label, out_bytes,
      [&](uint8_t* out) {
        if (in_place) env.upload(out + comm.me * cb, in[comm.me].data(), cb);
      },
      [&](uint8_t* out, bool real) {
        const void* src = in_place ? out + comm.me * cb : env.send();
        return real ? pncclAllGather(src, out, c.count, c.dt, comm.comm, env.stream())
                    : ncclAllGather(src, out, c.count, c.dt, comm.comm, env.stream());
      },
      comm.comm);
  env.expect_bytes(label, got, want.data());
}

void all_reduce_case(Env& env, const Comm& comm, const Case& c, bool in_place) {
  const auto& in = env.inputs(comm, c, c.count);
  const size_t cb = c.cb();
  if (!in_place) env.upload(env.send(), in[comm.me].data(), cb);
  const std::string label = env.label(comm, in_place ? "allreduce_inplace" : "allreduce", c);
  auto got = env.run_both(
      label, cb,
      [&](uint8_t* out) {
        if (in_place) env.upload(out, in[comm.me].data(), cb);
      },
      [&](uint8_t* out, bool real) {
        const void* src = in_place ? out : env.send();
        return real ? pncclAllReduce(src, out, c.count, c.dt, ncclSum, comm.comm, env.stream())
                    : ncclAllReduce(src, out, c.count, c.dt, ncclSum, comm.comm, env.stream());
      },
      comm.comm);
  env.expect_sum(label, got, 0, c);
}

void reduce_scatter_case(Env& env, const Comm& comm, const Case& c) {
  const size_t n = static_cast<size_t>(comm.n);
  const auto& in = env.inputs(comm, c, c.count * n);
  env.upload(env.send(), in[comm.me].data(), c.cb() * n);
  const std::string label = env.label(comm, "reducescatter", c);
  auto got = env.run_both(
      label, c.cb(), [](uint8_t*) {},
      [&](uint8_t* out, bool real) {
        return real ? pncclReduceScatter(env.send(), out, c.count, c.dt, ncclSum, comm.comm,
                                         env.stream())
                    : ncclReduceScatter(env.send(), out, c.count, c.dt, ncclSum, comm.comm,
                                        env.stream());
      },
      comm.comm);
  env.expect_sum(label, got, c.count * static_cast<size_t>(comm.me), c);
}

void broadcast_case(Env& env, const Comm& comm, const Case& c, bool deprecated_bcast) {
  const auto& in = env.inputs(comm, c, c.count);
  const int root = static_cast<int>(c.size_index % static_cast<size_t>(comm.n));
  const size_t cb = c.cb();
  if (!deprecated_bcast) env.upload(env.send(), in[comm.me].data(), cb);
  const std::string label = env.label(comm, deprecated_bcast ? "bcast" : "broadcast", c) +
                            " root=" + std::to_string(root);
  auto got = env.run_both(
      label, cb,
      [&](uint8_t* out) {
        if (deprecated_bcast && comm.me == root) env.upload(out, in[root].data(), cb);
      },
      [&](uint8_t* out, bool real) {
        if (deprecated_bcast) {
          return real ? pncclBcast(out, c.count, c.dt, root, comm.comm, env.stream())
                      : ncclBcast(out, c.count, c.dt, root, comm.comm, env.stream());
        }
        return real ? pncclBroadcast(env.send(), out, c.count, c.dt, root, comm.comm, env.stream())
                    : ncclBroadcast(env.send(), out, c.count, c.dt, root, comm.comm, env.stream());
      },
      comm.comm);
  env.expect_bytes(label, got, in[root].data());
}

void send_recv_ring_case(Env& env, const Comm& comm, const Case& c) {
  const auto& in = env.inputs(comm, c, c.count);
  const int next = (comm.me + 1) % comm.n;
  const int prev = (comm.me + comm.n - 1) % comm.n;
  env.upload(env.send(), in[comm.me].data(), c.cb());
  const std::string label = env.label(comm, "sendrecv_ring", c);
  auto got = env.run_both(
      label, c.cb(), [](uint8_t*) {},
      [&](uint8_t* out, bool real) -> ncclResult_t {
        ncclResult_t r1, r2, r3, r4;
        if (real) {
          r1 = pncclGroupStart();
          r2 = pncclSend(env.send(), c.count, c.dt, next, comm.comm, env.stream());
          r3 = pncclRecv(out, c.count, c.dt, prev, comm.comm, env.stream());
          r4 = pncclGroupEnd();
        } else {
          r1 = ncclGroupStart();
          r2 = ncclSend(env.send(), c.count, c.dt, next, comm.comm, env.stream());
          r3 = ncclRecv(out, c.count, c.dt, prev, comm.comm, env.stream());
          r4 = ncclGroupEnd();
        }
        for (ncclResult_t r : {r1, r2, r3}) {
          if (r != ncclSuccess) return r;
        }
        return r4;
      },
      comm.comm);
  env.expect_bytes(label, got, in[prev].data());
}

// All-gather with count 0: both paths must return the same result and write nothing.
void all_gather_zero_count(Env& env, const Comm& comm) {
  uint8_t* out = env.send() + kGuard;
  ZG_CUDA(cudaMemsetAsync(env.send(), kPoison, 4 * kGuard, env.stream()));
  ncclResult_t pub = ncclAllGather(env.send(), out, 0, ncclFloat32, comm.comm, env.stream());
  ncclResult_t real = pncclAllGather(env.send(), out, 0, ncclFloat32, comm.comm, env.stream());
  std::vector<uint8_t> host(4 * kGuard);
  ZG_CUDA(
      cudaMemcpyAsync(host.data(), env.send(), host.size(), cudaMemcpyDeviceToHost, env.stream()));
  wait_stream(env.stream(), "allgather count=0");
  if (pub != real) {
    fail(std::string("allgather count=0: nccl returned ") + ncclGetErrorString(pub) +
         ", pnccl returned " + ncclGetErrorString(real));
  }
  if (first_not(host.data(), host.size(), kPoison) != SIZE_MAX) {
    fail("allgather count=0 wrote to memory");
  }
}

Comm world_comm(const RankContext& ctx, InitKind kind) {
  return Comm{init_comm(ctx, kind), ctx.nranks, ctx.rank,
              std::string("world-") + init_kind_name(kind)};
}

void destroy(Comm& comm) {
  if (comm.comm) ZG_NCCL(ncclCommDestroy(comm.comm));
  comm.comm = nullptr;
}

// Runs `body` in nranks processes, each with its own Env, then merges the digests.
void run_test(int nranks, const std::string& test, const std::function<void(Env&)>& body) {
  digest_begin(nranks);
  RunResult result = run_ranks(
      nranks,
      [&](const RankContext& ctx) {
        Env env(ctx, test);
        body(env);
        return env.finish();
      },
      default_run_options());
  const std::string merge_error = digest_merge(nranks);
  EXPECT_TRUE(result.ok()) << result.summary();
  EXPECT_EQ(merge_error, "");
}

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllGather) {
  const int n = GetParam();
  ZG_REQUIRE_GPUS(n);
  run_test(n, "allgather", [](Env& env) {
    Comm comm = world_comm(env.ctx(), InitKind::kInitRankConfig);
    all_gather_zero_count(env, comm);
    for_each_case(kTypes, [&](const Case& c) {
      all_gather_case(env, comm, c, false);
      all_gather_case(env, comm, c, true);
    });
    destroy(comm);
  });
}

TEST_P(Collectives, AllReduce) {
  const int n = GetParam();
  ZG_REQUIRE_GPUS(n);
  run_test(n, "allreduce", [](Env& env) {
    Comm comm = world_comm(env.ctx(), InitKind::kInitRankConfig);
    for_each_case(kTypes, [&](const Case& c) {
      all_reduce_case(env, comm, c, false);
      all_reduce_case(env, comm, c, true);
    });
    destroy(comm);
  });
}

TEST_P(Collectives, ReduceScatter) {
  const int n = GetParam();
  ZG_REQUIRE_GPUS(n);
  run_test(n, "reducescatter", [](Env& env) {
    Comm comm = world_comm(env.ctx(), InitKind::kInitRankConfig);
    for_each_case(kTypes, [&](const Case& c) { reduce_scatter_case(env, comm, c); });
    destroy(comm);
  });
}

TEST_P(Collectives, Broadcast) {
  const int n = GetParam();
  ZG_REQUIRE_GPUS(n);
  run_test(n, "broadcast", [](Env& env) {
    Comm comm = world_comm(env.ctx(), InitKind::kInitRankConfig);
    for_each_case(kTypes, [&](const Case& c) {
      broadcast_case(env, comm, c, false);
      broadcast_case(env, comm, c, true);
    });
    destroy(comm);
  });
}

TEST_P(Collectives, SendRecvRing) {
  const int n = GetParam();
  ZG_REQUIRE_GPUS(n);
  run_test(n, "sendrecv", [](Env& env) {
    Comm comm = world_comm(env.ctx(), InitKind::kInitRankConfig);
    for_each_case(kTypes, [&](const Case& c) { send_recv_ring_case(env, comm, c); });
    destroy(comm);
  });
}

// A communicator made by ncclCommInitRank, which carries no config at all: the shim must
// still apply its policy, and results must not change. Torn down with Finalize + Destroy, as
// PyTorch does.
TEST_P(Collectives, InitRankWithoutConfig) {
  const int n = GetParam();
  ZG_REQUIRE_GPUS(n);
  run_test(n, "initrank", [](Env& env) {
    Comm comm = world_comm(env.ctx(), InitKind::kInitRank);
    const std::vector<ncclDataType_t> types = {ncclInt8, ncclBfloat16, ncclFloat32};
    for_each_case(types, [&](const Case& c) {
      all_gather_case(env, comm, c, false);
      all_gather_case(env, comm, c, true);
      all_reduce_case(env, comm, c, false);
    });
    ZG_NCCL(ncclCommFinalize(comm.comm));
    destroy(comm);
  });
}

// ncclCommSplit with a NULL config (inherits the parent's). On 4 ranks: world ranks {0, 2}
// form color 0, rank 1 alone is color 1, rank 3 passes NCCL_SPLIT_NOCOLOR and must get a NULL
// communicator. On 2 ranks both ranks form one color. Keys reverse the order, so child ranks
// are checked too.
TEST_P(Collectives, Split) {
  const int n = GetParam();
  ZG_REQUIRE_GPUS(n);
  run_test(n, "split", [n](Env& env) {
    const int me = env.ctx().rank;
    Comm world = world_comm(env.ctx(), InitKind::kInitRankConfig);
    std::vector<int> colors(static_cast<size_t>(n), 0);
    if (n == 4) colors = {0, 1, 0, NCCL_SPLIT_NOCOLOR};
    const int key = n - me;
    Comm child;
    ZG_NCCL(ncclCommSplit(world.comm, colors[me], key, &child.comm, nullptr));
    if (colors[me] == NCCL_SPLIT_NOCOLOR) {
      if (child.comm != nullptr) fail("NCCL_SPLIT_NOCOLOR returned a communicator");
    } else {
      if (child.comm == nullptr) fail("ncclCommSplit returned a NULL communicator");
      // Members of my color sorted by key (descending world rank here) give the child ranks.
      std::vector<int> members;
      for (int q = n - 1; q >= 0; --q) {
        if (colors[q] == colors[me]) members.push_back(q);
      }
      const int want_rank =
          static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
      ZG_NCCL(ncclCommCount(child.comm, &child.n));
      ZG_NCCL(ncclCommUserRank(child.comm, &child.me));
      if (child.n != static_cast<int>(members.size()) || child.me != want_rank) {
        fail("split child has rank " + std::to_string(child.me) + " of " + std::to_string(child.n) +
             ", want " + std::to_string(want_rank) + " of " + std::to_string(members.size()));
      }
      child.name = "split-color" + std::to_string(colors[me]);
      const std::vector<ncclDataType_t> types = {ncclInt32, ncclFloat32};
      for_each_case(types, [&](const Case& c) {
        all_gather_case(env, child, c, false);
        all_reduce_case(env, child, c, false);
      });
      destroy(child);
    }
    // The world communicator still works after the split and the child's destruction. The
    // host barrier keeps the rank without a child from starting (and timing out on) the
    // world op while the others are still busy with theirs.
    barrier();
    for_each_case({ncclFloat32}, [&](const Case& c) {
      if (c.size_index % 3 == 0) all_gather_case(env, world, c, false);
    });
    destroy(world);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "n" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace zgpu
