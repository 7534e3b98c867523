// What does the route's first op over new buffers cost per allocation, which driver calls make
// that cost, and which of them could be fewer or run at once?
//
// One process per GPU (fork before CUDA), as the route's ranks: each creates N allocations of
// P bytes (PyTorch's expandable segments: 20 MiB each), fills allocation i with its own byte,
// exports them as POSIX fds (zerocta's export makes this call once per allocation) and sends
// them to every other rank; each rank then imports every peer's fds and maps each peer's
// allocations back to back into one reserved range, as zerocta maps a view. The phases run on
// all ranks at once (a barrier between them), as in a first op where every rank posts and
// imports at the same time. Mapping runs three ways, alternated over the repetitions:
//   per-allocation   cuMemMap + cuMemSetAccess per allocation, cuMemUnmap per allocation
//                    (zerocta's map_back_to_back today)
//   one-access       cuMemMap per allocation, one cuMemSetAccess over the peer's whole range;
//                    cuMemUnmap per allocation
//   one-call         as one-access, and one cuMemUnmap over the whole range
// Every mapping is checked: the first and last byte of each allocation read back through it.
// Exports and imports also run on 4 threads (does the driver serialize them?).
// Prints per rank and phase: microseconds per allocation (median over the repetitions).
// Measured (docs/plots/first-use-4xH200/): the driver's work is per allocation however the calls
// are grouped, every call takes 2-3x longer when 4 processes make them at once than when 2 do,
// and threads make them slower still.
//   nvcc -O2 -o first_use_probe first_use_probe.cu -lcuda
//   first_use_probe [ranks (default: every GPU)] [allocations (205)] [MiB each (20)]
#include <cuda.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "probe_check.h"
#include "probe_fds.h"

namespace {

constexpr int kMaxRanks = 8;
constexpr int kReps = 3;           // of each mapping mode
constexpr size_t kFdsPerMsg = 200;  // SCM_RIGHTS carries at most 253 per message
constexpr int kThreads = 4;  // of the threaded imports and exports

struct Shared {
  pthread_barrier_t barrier;
};

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint8_t fill_byte(int rank, size_t i) { return static_cast<uint8_t>(rank * 37 + i * 7 + 1); }

struct Rank {
  int rank, ranks;
  size_t n, piece;
  Shared* shared;
  std::vector<int> sock;  // sock[peer]: this rank's end of the pair's socket
  CUcontext ctx;

  void sync() { pthread_barrier_wait(&shared->barrier); }

  void report(const char* what, double total_us, size_t per) {
    printf("RESULT rank=%d ranks=%d n=%zu piece=%zuMiB %-34s %9.1f us total %7.2f us each\n", rank,
           ranks, n, piece >> 20, what, total_us, per ? total_us / per : 0.0);
  }

  std::vector<CUmemGenericAllocationHandle> create_and_fill() {
    const CUmemAllocationProp p = prop(rank);
    std::vector<CUmemGenericAllocationHandle> h(n);
    for (size_t i = 0; i < n; ++i) {
      CU(cuMemCreate(&h[i], piece, &p, 0));
      CUdeviceptr va;
      CU(map_for_device(h[i], piece, rank, &va));
      CU(cuMemsetD8(va, fill_byte(rank, i), piece));
      CU(cuCtxSynchronize());
      CU(cuMemUnmap(va, piece));
      CU(cuMemAddressFree(va, piece));
    }
    return h;
  }

  static void export_range(CUcontext ctx, const CUmemGenericAllocationHandle* h, size_t begin,
                           size_t end, int* fds) {
    CU(cuCtxSetCurrent(ctx));
    for (size_t i = begin; i < end; ++i)
      CU(cuMemExportToShareableHandle(&fds[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  }

  // The export call zerocta's export_block makes per allocation, on `threads` threads.
  std::vector<int> export_all(const std::vector<CUmemGenericAllocationHandle>& h, int threads) {
    std::vector<int> fds(n);
    std::vector<std::thread> pool;
    const size_t share = (n + threads - 1) / threads;
    for (int t = 0; t < threads; ++t) {
      const size_t b = std::min(n, t * share), e = std::min(n, b + share);
      pool.emplace_back(export_range, ctx, h.data(), b, e, fds.data());
    }
    for (auto& t : pool) t.join();
    return fds;
  }

  // Every rank sends its fds to every peer, then receives each peer's (a socket pair's buffer
  // holds them all: one byte a message).
  std::vector<std::vector<int>> exchange(const std::vector<int>& mine) {
    for (int p = 0; p < ranks; ++p) {
      if (p == rank) continue;
      for (size_t at = 0; at < n; at += kFdsPerMsg)
        send_fds(sock[p], std::vector<int>(mine.begin() + at,
                                           mine.begin() + std::min(n, at + kFdsPerMsg)));
    }
    std::vector<std::vector<int>> got(ranks);
    for (int p = 0; p < ranks; ++p) {
      if (p == rank) continue;
      for (size_t at = 0; at < n; at += kFdsPerMsg) {
        auto part = recv_fds(sock[p], std::min(kFdsPerMsg, n - at));
        got[p].insert(got[p].end(), part.begin(), part.end());
      }
    }
    return got;
  }

  static void import_range(CUcontext ctx, const std::vector<int>& fds, size_t begin, size_t end,
                           CUmemGenericAllocationHandle* out) {
    CU(cuCtxSetCurrent(ctx));
    for (size_t i = begin; i < end; ++i)
      CU(cuMemImportFromShareableHandle(&out[i],
                                        reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i])),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  }

  // Imports every peer's fds on `threads` threads; returns the handles per peer.
  std::vector<std::vector<CUmemGenericAllocationHandle>> import_all(
      const std::vector<std::vector<int>>& fds, int threads) {
    std::vector<std::vector<CUmemGenericAllocationHandle>> h(ranks);
    std::vector<int> flat;
    for (int p = 0; p < ranks; ++p) flat.insert(flat.end(), fds[p].begin(), fds[p].end());
    std::vector<CUmemGenericAllocationHandle> out(flat.size());
    std::vector<std::thread> pool;
    const size_t share = (flat.size() + threads - 1) / threads;
    for (int t = 0; t < threads; ++t) {
      const size_t b = std::min(flat.size(), t * share), e = std::min(flat.size(), b + share);
      pool.emplace_back(import_range, ctx, std::cref(flat), b, e, out.data());
    }
    for (auto& t : pool) t.join();
    size_t at = 0;
    for (int p = 0; p < ranks; ++p) {
      if (p == rank) continue;
      h[p].assign(out.begin() + at, out.begin() + at + n);
      at += n;
    }
    return h;
  }

  void release_all(std::vector<std::vector<CUmemGenericAllocationHandle>>& h) {
    for (auto& v : h)
      for (auto x : v) CU(cuMemRelease(x));
  }

  CUmemAccessDesc own_access() const {
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = rank;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return a;
  }

  // Reads the first and last byte of each allocation of `peer` through the view at `va`.
  void check_view(CUdeviceptr va, int peer) {
    for (size_t i = 0; i < n; ++i)
      for (size_t off : {size_t{0}, piece - 1}) {
        uint8_t b = 0;
        CU(cuMemcpyDtoH(&b, va + i * piece + off, 1));
        if (b != fill_byte(peer, i)) {
          printf("RESULT rank=%d MISMATCH peer=%d allocation=%zu offset=%zu: %u, expected %u\n",
                 rank, peer, i, off, b, fill_byte(peer, i));
          exit(1);
        }
      }
  }

  enum Mode { kPerAllocation, kOneAccess, kOneCall };

  // Maps, checks and unmaps every peer's allocations in `mode`; adds each phase's host time.
  void map_cycle(const std::vector<std::vector<CUmemGenericAllocationHandle>>& h, Mode mode,
                 double* map_us, double* access_us, double* unmap_us) {
    const CUmemAccessDesc access = own_access();
    const size_t total = n * piece;
    std::vector<CUdeviceptr> va(ranks, 0);
    sync();
    for (int p = 0; p < ranks; ++p) {
      if (p == rank) continue;
      CU(cuMemAddressReserve(&va[p], total, 0, 0, 0));
      for (size_t i = 0; i < n; ++i) {
        double t = now_us();
        CU(cuMemMap(va[p] + i * piece, piece, 0, h[p][i], 0));
        *map_us += now_us() - t;
        if (mode == kPerAllocation) {
          t = now_us();
          CU(cuMemSetAccess(va[p] + i * piece, piece, &access, 1));
          *access_us += now_us() - t;
        }
      }
      if (mode != kPerAllocation) {
        const double t = now_us();
        CU(cuMemSetAccess(va[p], total, &access, 1));
        *access_us += now_us() - t;
      }
    }
    sync();
    for (int p = 0; p < ranks; ++p)
      if (p != rank) check_view(va[p], p);
    sync();
    for (int p = 0; p < ranks; ++p) {
      if (p == rank) continue;
      const double t = now_us();
      if (mode == kOneCall) {
        CU(cuMemUnmap(va[p], total));
      } else {
        for (size_t i = 0; i < n; ++i) CU(cuMemUnmap(va[p] + i * piece, piece));
      }
      *unmap_us += now_us() - t;
      CU(cuMemAddressFree(va[p], total));
    }
  }

  void run() {
    ctx = primary_context(rank);
    CU(cuCtxSetCurrent(ctx));
    const size_t peers_n = n * static_cast<size_t>(ranks - 1);
    std::vector<CUmemGenericAllocationHandle> mine = create_and_fill();
    sync();
    double t = now_us();
    std::vector<int> fds = export_all(mine, kThreads);
    report("export, 4 threads", now_us() - t, n);
    for (int fd : fds) close(fd);
    sync();
    t = now_us();
    fds = export_all(mine, 1);
    report("export, 1 thread", now_us() - t, n);
    sync();
    auto got = exchange(fds);
    for (int fd : fds) close(fd);
    sync();
    std::vector<std::vector<CUmemGenericAllocationHandle>> h;
    for (int threads : {1, kThreads, 1}) {
      if (!h.empty()) {
        sync();
        t = now_us();
        release_all(h);
        report("release (imports)", now_us() - t, peers_n);
      }
      sync();
      t = now_us();
      h = import_all(got, threads);
      report(threads == 1 ? "import, 1 thread" : "import, 4 threads", now_us() - t, peers_n);
    }
    for (auto& v : got)
      for (int fd : v) close(fd);
    const char* names[] = {"per-allocation", "one-access", "one-call"};
    std::vector<double> map[3], access[3], unmap[3];
    for (int rep = 0; rep < kReps; ++rep)
      for (Mode m : {kPerAllocation, kOneAccess, kOneCall}) {
        double a = 0, b = 0, c = 0;
        map_cycle(h, m, &a, &b, &c);
        map[m].push_back(a);
        access[m].push_back(b);
        unmap[m].push_back(c);
      }
    for (Mode m : {kPerAllocation, kOneAccess, kOneCall}) {
      const std::string name = names[m];
      report((name + ": cuMemMap").c_str(), median_of(map[m]), peers_n);
      report((name + ": cuMemSetAccess").c_str(), median_of(access[m]), peers_n);
      report((name + ": cuMemUnmap").c_str(), median_of(unmap[m]), peers_n);
      report((name + ": map+access+unmap").c_str(),
             median_of(map[m]) + median_of(access[m]) + median_of(unmap[m]), peers_n);
    }
    sync();
    release_all(h);
    for (auto x : mine) CU(cuMemRelease(x));
    sync();
  }
};

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);  // children end with _exit
  int ranks = argc > 1 ? atoi(argv[1]) : 0;
  const size_t n = argc > 2 ? strtoull(argv[2], nullptr, 10) : 205;
  const size_t piece = (argc > 3 ? strtoull(argv[3], nullptr, 10) : 20) << 20;
  if (ranks <= 0) ranks = count_gpus_in_child();  // the parent makes no CUDA call
  if (ranks < 2) {
    printf("first_use_probe: needs 2 GPUs, found %d\n", ranks);
    return 0;
  }
  ranks = std::min(ranks, kMaxRanks);
  auto* shared = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&shared->barrier, &attr, static_cast<unsigned>(ranks));
  // sock[a][b]: a's end of the socket pair between a and b.
  std::vector<std::vector<int>> sock(ranks, std::vector<int>(ranks, -1));
  for (int a = 0; a < ranks; ++a)
    for (int b = a + 1; b < ranks; ++b) {
      int sv[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
      sock[a][b] = sv[0];
      sock[b][a] = sv[1];
    }
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      Rank me{r, ranks, n, piece, shared, sock[r], nullptr};
      me.run();
      _exit(0);
    }
    pids.push_back(pid);
  }
  bool ok = true;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  printf("first_use_probe: %s\n", ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
