// zerocta-demo: all-gathers on every local GPU, one process per GPU (fork, no MPI), each size
// run twice on the same communicator: through pncclAllGather (real NCCL, never intercepted)
// and through ncclAllGather (routed by zerocta when it is preloaded). Prints bus bandwidth of
// both, the route zerocta reports, and whether the outputs are bitwise identical. The buffers
// are cuMem memory other processes can map (shareable_memory.h), where zerocta's route reaches
// them; with cudaMalloc buffers every all-gather of this one-process-per-GPU program would go to
// NCCL.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shareable_memory.h"
#include "zerocta.h"

namespace {

// The GPUs this process may use, as the CUDA runtime counts them (CUDA_VISIBLE_DEVICES, MIG and
// cgroups respected). Asked in a forked child: the parent must not initialise CUDA before it
// forks the ranks. *why says what went wrong when the answer is 0 because CUDA failed.
int count_visible_gpus(std::string* why) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return 0;
  }
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    char msg[256];
    // The runtime calls a machine without any driver "insufficient driver": say what it means.
    const char* why = err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice
                          ? "no usable CUDA driver or GPU"
                          : cudaGetErrorString(err);
    const int len = err == cudaSuccess
                        ? snprintf(msg, sizeof msg, "%d", n)
                        : snprintf(msg, sizeof msg, "0 %s (%s)", why, cudaGetErrorName(err));
    if (write(fds[1], msg, static_cast<size_t>(len)) != len) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  std::string answer;
  char buf[256];
  for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) answer.append(buf, got);
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  const size_t space = answer.find(' ');
  if (space != std::string::npos) *why = answer.substr(space + 1);
  return atoi(answer.c_str());
}

#define CK(x)                                                                               \
  do {                                                                                      \
    auto _r = (x);                                                                          \
    if (_r != 0) {                                                                          \
      fprintf(stderr, "rank %d: %s failed (%d) at line %d\n", rank, #x, (int)_r, __LINE__); \
      return 1;                                                                             \
    }                                                                                       \
  } while (0)

// Route names as zerocta_route_name() gives them; the demo never links the shim.
const char* const kRouteNames[zerocta_route_count] = {"passthrough", "ce", "nccl-ce"};

using AgFn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);

double time_ag(AgFn fn, const void* s, void* r, size_t n, ncclComm_t c, cudaStream_t st,
               int iters) {
  for (int i = 0; i < 3; ++i) fn(s, r, n, ncclUint8, c, st);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, st);
  for (int i = 0; i < iters; ++i) fn(s, r, n, ncclUint8, c, st);
  cudaEventRecord(b, st);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms * 1000.0 / iters;
}

int run_rank(int rank, int nranks, ncclUniqueId id, const std::vector<size_t>& sizes, int iters) {
  CK(cudaSetDevice(rank));
  ncclComm_t comm;
  CK(ncclCommInitRank(&comm, nranks, id, rank));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  size_t maxb = sizes.back();
  void *send, *recv_ref, *recv;
  const char* why = "";
  send = shareable_alloc(maxb / nranks + 1, &why);
  recv = shareable_alloc(maxb + nranks, &why);
  if (!send || !recv) {
    fprintf(stderr, "rank %d: %s\n", rank, why);
    return 1;
  }
  CK(cudaMalloc(&recv_ref, maxb + nranks));
  auto* get_stats =
      reinterpret_cast<int (*)(zerocta_stats_t*)>(dlsym(RTLD_DEFAULT, "zerocta_get_stats"));
  int bad = 0;
  if (rank == 0)
    printf("%12s %10s | %10s %10s | %10s %10s | %8s %s\n", "total bytes", "per rank", "nccl us",
           "busbw", "routed us", "busbw", "speedup", "check/route");
  for (size_t total : sizes) {
    size_t per = total / nranks;
    std::vector<unsigned char> h(per);
    std::mt19937_64 rng(1234 + rank * 7919 + total);
    for (auto& b : h) b = static_cast<unsigned char>(rng());
    CK(cudaMemcpy(send, h.data(), per, cudaMemcpyHostToDevice));
    CK(cudaMemset(recv_ref, 0xAB, per * nranks));
    CK(cudaMemset(recv, 0xCD, per * nranks));
    zerocta_stats_t before{}, after{};
    if (get_stats) get_stats(&before);
    CK(pncclAllGather(send, recv_ref, per, ncclUint8, comm, st));
    CK(ncclAllGather(send, recv, per, ncclUint8, comm, st));
    CK(cudaStreamSynchronize(st));
    if (get_stats) get_stats(&after);
    std::vector<unsigned char> a(per * nranks), b(per * nranks);
    CK(cudaMemcpy(a.data(), recv_ref, a.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), recv, b.size(), cudaMemcpyDeviceToHost));
    bool same = memcmp(a.data(), b.data(), a.size()) == 0;
    if (!same) bad++;
    const char* route = "no-shim";
    if (get_stats) {
      route = "passthrough";
      for (int r = 0; r < zerocta_route_count; ++r)
        if (after.counters[zerocta_op_allgather][r].calls >
            before.counters[zerocta_op_allgather][r].calls)
          route = kRouteNames[r];
    }
    int it = total >= (256u << 20) ? iters / 2 + 1 : iters;
    double tn = time_ag(pncclAllGather, send, recv_ref, per, comm, st, it);
    double tz = time_ag(ncclAllGather, send, recv, per, comm, st, it);
    double f = double(nranks - 1) / nranks;
    if (rank == 0)
      printf("%12zu %10zu | %10.1f %10.1f | %10.1f %10.1f | %7.2fx %s/%s\n", per * nranks, per, tn,
             per * nranks / tn / 1e3 * f, tz, per * nranks / tz / 1e3 * f, tn / tz,
             same ? "OK" : "MISMATCH", route);
    fflush(stdout);
  }
  CK(cudaStreamSynchronize(st));
  shareable_free(send);
  shareable_free(recv);
  cudaFree(recv_ref);
  CK(ncclCommDestroy(comm));
  return bad ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--help") == 0) {
    printf(
        "usage: zerocta-demo [nranks] [iters]\n  Run under LD_PRELOAD=libzerocta.so to compare.\n"
        "  Uses the GPUs the CUDA runtime sees (CUDA_VISIBLE_DEVICES), one rank per GPU.\n");
    return 0;
  }
  std::string why;
  const int ngpu = count_visible_gpus(&why);
  // Said first, so that even a machine without GPUs shows whether the preload took.
  const bool preloaded = dlsym(RTLD_DEFAULT, "zerocta_version") != nullptr;
  if (ngpu < 2) {
    printf(
        "zerocta-demo: zerocta %s; %d GPU(s) found%s%s%s; an all-gather comparison needs at "
        "least 2. Nothing to do.\n",
        preloaded ? "preloaded" : "not preloaded", ngpu, why.empty() ? "" : " (CUDA: ", why.c_str(),
        why.empty() ? "" : ")");
    return 0;
  }
  // One pipe per rank below.
  constexpr int kMaxRanks = 64;
  int nranks = argc > 1 ? atoi(argv[1]) : ngpu;
  int iters = argc > 2 ? atoi(argv[2]) : 20;
  if (nranks < 2 || nranks > ngpu) nranks = ngpu;
  if (nranks > kMaxRanks) nranks = kMaxRanks;
  if (iters < 1) iters = 1;
  std::vector<size_t> sizes;
  for (size_t s = 1 << 20; s <= (size_t(1) << 30); s *= 4) sizes.push_back(s);
  printf("zerocta-demo: %d ranks, one per GPU; zerocta %s\n", nranks,
         preloaded ? "preloaded" : "NOT preloaded (NCCL only)");
  fflush(stdout);
  // Every pipe exists before the first fork: rank 0 writes to all of them.
  int pipes[kMaxRanks][2];
  for (int r = 0; r < nranks; ++r)
    if (pipe(pipes[r]) != 0) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      alarm(240);  // a hang ends the rank (SIGALRM) instead of holding the GPUs
      ncclUniqueId id;
      if (r == 0) {
        ncclGetUniqueId(&id);
        for (int p = 1; p < nranks; ++p)
          if (write(pipes[p][1], &id, sizeof id) != sizeof id) _exit(3);
      } else {
        if (read(pipes[r][0], &id, sizeof id) != sizeof id) _exit(3);
      }
      // exit, not _exit: atexit handlers run, so ZEROCTA_STATS=1 reports each rank's routes
      // (stdout was flushed before the fork, so nothing of the parent's is written twice).
      exit(run_rank(r, nranks, id, sizes, iters));
    }
    pids.push_back(pid);
  }
  int fails = 0;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fails++;
  }
  printf("zerocta-demo: %s\n", fails ? "FAILED" : "OK");
  return fails ? 1 : 0;
}
