// The copy-engine reduce-scatter end to end on ONE GPU: the route's real driver work — the
// scratch made and exported at the join, imported and mapped by the peer processes, flags in
// the registered channel memory waited on and written by real streams, the summing kernel loaded
// and launched, every stream running asynchronously — which the CPU tests' fake driver cannot
// show. NCCL refuses two ranks on one GPU, so the ranks meet through the fake NCCL
// (tests/fake_nccl: rendezvous only; it moves no data) and the library is a test build that lets
// ranks share a GPU (-DZEROCTA_SHARED_GPU_TEST=ON). Every op is on the route; each rank checks
// its output against the sum it makes itself (small integers and scalars of 0.5, 1 and 2: exact
// in any order).
//
//   env FAKE_NCCL_RENDEZVOUS_DIR=DIR FAKE_NCCL_COMM_ID=ID ZEROCTA_REDUCESCATTER=zerocta
//     LD_LIBRARY_PATH=<a directory holding the fake libnccl.so.2 only>
//     LD_PRELOAD=<shared-GPU build>/libzerocta.so zerocta_gpu_rs_one_gpu [NRANKS]
//   (tests/gpu/run_rs_one_gpu.sh does all of it)
//
// Prints a RESULT line per rank and case, and exits non-zero when any rank saw a wrong
// element, an error, or an op that did not take the route. Without a GPU each rank says so and
// the test exits 0.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "zerocta.h"

namespace {

float input(int rank, int op, size_t i) {
  return static_cast<float>((static_cast<size_t>(rank) * 5 + static_cast<size_t>(op) * 3 + i * 7) %
                            13);
}

// The reduction: a sum, an average (2 ranks), or a pre-multiplied sum of each rank's own
// scalar (scalar(): exact in any order), host-immediate or device-resident.
enum class Red { kSum, kAvg, kPreMulHost, kPreMulDevice };
const char* red_name(Red r) {
  return r == Red::kSum          ? "sum"
         : r == Red::kAvg        ? "avg"
         : r == Red::kPreMulHost ? "premul-host"
                                 : "premul-device";
}
float scalar(int rank) { return static_cast<float>(1 << (rank % 3)) * 0.5f; }

struct Case {
  bool bf16;
  Red red;
  bool in_place;
  size_t count;  // elements a rank receives
};

// The reduce-scatters routed so far in this process (the shim's counters).
long long routed() {
  using GetStats = int (*)(zerocta_stats_t*);
  auto get = reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "zerocta_get_stats"));
  zerocta_stats_t s;
  if (get == nullptr || get(&s) != 0) return -1;
  return static_cast<long long>(s.counters[zerocta_op_reducescatter][zerocta_route_ce].calls);
}

int run_rank(int rank, int nranks, const ncclUniqueId& id) {
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    printf("RESULT rank %d: no CUDA context on GPU 0 FAILED\n", rank);
    return 2;
  }
  ncclComm_t comm = nullptr;
  if (const ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank); r != ncclSuccess) {
    printf("RESULT rank %d: ncclCommInitRank %d FAILED\n", rank, static_cast<int>(r));
    return 3;
  }
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<Case> cases;
  for (bool bf16 : {false, true})
    for (Red red : {Red::kSum, Red::kAvg, Red::kPreMulHost, Red::kPreMulDevice})
      for (bool in_place : {false, true})
        for (size_t count : {size_t{1}, size_t{1000}, size_t{262147}, size_t{24} << 20})
          if (red != Red::kAvg || nranks == 2) cases.push_back({bf16, red, in_place, count});
  void* device_scalar = nullptr;
  cudaMalloc(&device_scalar, 4);
  int failures = 0, op = 0;
  for (const Case& c : cases) {
    const size_t elem = c.bf16 ? 2 : 4, chunk = c.count * elem;
    const size_t total = chunk * static_cast<size_t>(nranks);
    std::vector<uint8_t> host(total), got(chunk);
    auto store = [&](uint8_t* at, float v) {
      uint32_t bits;
      memcpy(&bits, &v, 4);
      if (c.bf16) {
        const uint16_t top = static_cast<uint16_t>(bits >> 16);  // exact: small integers
        memcpy(at, &top, 2);
      } else {
        memcpy(at, &bits, 4);
      }
    };
    auto load = [&](const uint8_t* at) {
      uint32_t bits = 0;
      if (c.bf16) {
        uint16_t top;
        memcpy(&top, at, 2);
        bits = static_cast<uint32_t>(top) << 16;
      } else {
        memcpy(&bits, at, 4);
      }
      float v;
      memcpy(&v, &bits, 4);
      return v;
    };
    // Three ops a case on the same buffers, fresh inputs each: slices numbered across ops.
    uint8_t *send = nullptr, *recv = nullptr;
    cudaMalloc(&send, total);
    if (!c.in_place) cudaMalloc(&recv, chunk);
    uint8_t* out = c.in_place ? send + static_cast<size_t>(rank) * chunk : recv;
    long long wrong = 0;
    ncclResult_t rc = ncclSuccess;
    const long long before = routed();
    for (int rep = 0; rep < 3; ++rep, ++op) {
      for (size_t i = 0; i < c.count * static_cast<size_t>(nranks); ++i)
        store(host.data() + i * elem, input(rank, op, i));
      cudaMemcpyAsync(send, host.data(), total, cudaMemcpyHostToDevice, stream);
      if (!c.in_place) cudaMemsetAsync(recv, 0xff, chunk, stream);
      const bool premul = c.red == Red::kPreMulHost || c.red == Red::kPreMulDevice;
      ncclRedOp_t redop = c.red == Red::kAvg ? ncclAvg : ncclSum;
      if (premul) {  // made before the call, destroyed right after it, as PyTorch does
        uint8_t bits[4];
        store(bits, scalar(rank));
        const bool dev = c.red == Red::kPreMulDevice;
        if (dev) cudaMemcpyAsync(device_scalar, bits, elem, cudaMemcpyHostToDevice, stream);
        const ncclResult_t made =
            ncclRedOpCreatePreMulSum(&redop, dev ? device_scalar : static_cast<void*>(bits),
                                     c.bf16 ? ncclBfloat16 : ncclFloat,
                                     dev ? ncclScalarDevice : ncclScalarHostImmediate, comm);
        if (rc == ncclSuccess) rc = made;
      }
      const ncclResult_t r = ncclReduceScatter(
          send, out, c.count, c.bf16 ? ncclBfloat16 : ncclFloat, redop, comm, stream);
      if (rc == ncclSuccess) rc = r;
      if (premul && rc == ncclSuccess) rc = ncclRedOpDestroy(redop, comm);
      cudaMemcpyAsync(got.data(), out, chunk, cudaMemcpyDeviceToHost, stream);
      if (cudaStreamSynchronize(stream) != cudaSuccess) rc = ncclUnhandledCudaError;
      for (size_t i = 0; i < c.count; ++i) {
        float want = 0;
        for (int p = 0; p < nranks; ++p)
          want += input(p, op, static_cast<size_t>(rank) * c.count + i) *
                  (c.red == Red::kPreMulHost || c.red == Red::kPreMulDevice ? scalar(p) : 1.0f);
        if (c.red == Red::kAvg) want *= 0.5f;
        wrong += load(got.data() + i * elem) != want;
      }
    }
    const long long took_route = routed() - before;
    const bool ok = rc == ncclSuccess && wrong == 0 && took_route == 3;
    failures += !ok;
    printf("RESULT rank %d %s %s %s count %zu: rc %d wrong %lld routed %lld/3 %s\n", rank,
           c.bf16 ? "bf16" : "fp32", red_name(c.red), c.in_place ? "in-place" : "out-of-place",
           c.count, static_cast<int>(rc), wrong, took_route, ok ? "ok" : "FAILED");
    fflush(stdout);
    cudaFree(send);
    if (recv) cudaFree(recv);
  }
  cudaStreamDestroy(stream);
  cudaFree(device_scalar);
  if (ncclCommDestroy(comm) != ncclSuccess) ++failures;
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int nranks = argc > 1 ? atoi(argv[1]) : 2;
  // No CUDA call here: a process that forks after CUDA started gives children that cannot use it.
  std::vector<pid_t> kids;
  for (int r = 0; r < nranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int gpus = 0;
      if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
        printf("RESULT rank %d: no GPU: skipped\n", r);
        fflush(stdout);
        _exit(0);
      }
      ncclUniqueId id;  // FAKE_NCCL_COMM_ID makes the ranks' ids alike
      const ncclResult_t got = ncclGetUniqueId(&id);
      if (got != ncclSuccess) printf("RESULT rank %d: ncclGetUniqueId %d FAILED\n", r, got);
      const int code = got == ncclSuccess ? run_rank(r, nranks, id) : 4;
      fflush(stdout);
      exit(code);  // not _exit: the library's exit report (ZEROCTA_STATS=1) runs at exit
    }
    kids.push_back(pid);
  }
  int worst = 0;
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0) worst = code;
  }
  printf("RESULT all ranks: %s\n", worst == 0 ? "ok" : "FAILED");
  return worst;
}
