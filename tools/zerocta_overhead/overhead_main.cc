// zerocta-overhead: nanoseconds the shim adds to one NCCL call on the CPU.
//
// Each call is timed through its public name (ncclX: the shim's wrapper when libzerocta.so is
// preloaded) and through NCCL's own pncclX alias (the same real function; the shim never
// exports pncclX), in one process, interleaved in rounds so frequency drift hits both alike.
// Run it under LD_PRELOAD=libzerocta.so; against the real NCCL (GPU machine) or the fake one
// of tests/fake_nccl (CPU): the difference is the shim's own cost either way.
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

template <typename Fn>
double ns_per_call(Fn fn, long iters) {
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < iters; ++i) fn();
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(iters);
}

struct Row {
  const char* name;
  std::vector<double> shim, direct;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  long iters = argc > 1 ? atol(argv[1]) : 2000000;
  if (iters < 1000) iters = 1000;
  const bool shim = dlsym(RTLD_DEFAULT, "zerocta_version") != nullptr;
  int version = 0;
  pncclGetVersion(&version);
  printf("zerocta-overhead: NCCL %d, zerocta %s, %ld calls per round, 7 rounds (median)\n", version,
         shim ? "preloaded" : "NOT preloaded (both columns are NCCL alone)", iters);
  // A communicator for the comm-taking calls; on a machine without a GPU this needs the fake
  // NCCL (LD_LIBRARY_PATH=build/fake_nccl).
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  if (pncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
    printf(
        "zerocta-overhead: could not create a 1-rank communicator (no GPU? run with the fake "
        "NCCL: LD_LIBRARY_PATH=build/null_nccl)\n");
    return 0;
  }
  int v = 0, count = 0;
  ncclResult_t async = ncclSuccess;
  Row rows[] = {{"ncclGetVersion", {}, {}},
                {"ncclCommCount", {}, {}},
                {"ncclCommGetAsyncError", {}, {}},
                {"ncclAllReduce (count 0)", {}, {}},
                {"ncclAllGather (count 0)", {}, {}}};
  for (int round = 0; round < 7; ++round) {
    rows[0].shim.push_back(ns_per_call([&] { ncclGetVersion(&v); }, iters));
    rows[0].direct.push_back(ns_per_call([&] { pncclGetVersion(&v); }, iters));
    rows[1].shim.push_back(ns_per_call([&] { ncclCommCount(comm, &count); }, iters));
    rows[1].direct.push_back(ns_per_call([&] { pncclCommCount(comm, &count); }, iters));
    rows[2].shim.push_back(ns_per_call([&] { ncclCommGetAsyncError(comm, &async); }, iters));
    rows[2].direct.push_back(ns_per_call([&] { pncclCommGetAsyncError(comm, &async); }, iters));
    rows[3].shim.push_back(ns_per_call(
        [&] { ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, nullptr); }, iters));
    rows[3].direct.push_back(ns_per_call(
        [&] { pncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, nullptr); }, iters));
    rows[4].shim.push_back(
        ns_per_call([&] { ncclAllGather(nullptr, nullptr, 0, ncclFloat, comm, nullptr); }, iters));
    rows[4].direct.push_back(
        ns_per_call([&] { pncclAllGather(nullptr, nullptr, 0, ncclFloat, comm, nullptr); }, iters));
  }
  printf("%-26s %12s %12s %12s\n", "call", "ncclX ns", "pncclX ns", "shim ns");
  double worst = 0;
  for (Row& r : rows) {
    double s = median(r.shim), d = median(r.direct);
    worst = std::max(worst, s - d);
    printf("%-26s %12.1f %12.1f %12.1f\n", r.name, s, d, s - d);
  }
  printf("zerocta-overhead: worst shim cost per call %.1f ns (target < 200 ns)\n", worst);
  ncclCommDestroy(comm);
  return 0;
}
