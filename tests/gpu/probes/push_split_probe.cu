// Does one GPU write into one peer faster with its push split over several copies at once?
// The route (and NCCL's copy-engine all-gather) writes each peer's chunk with one copy, and those
// copies run at ~390 GB/s on H100/H200, below NVLink's 450 GB/s a direction; a push split in
// parts that run at the same time on several streams (or in one batch whose copies may run in
// any order) would show whether a second copy engine can add to the first into the same peer.
//
// Two processes (fork before CUDA): GPU 0 exports one allocation, GPU 1 imports it (as the
// route imports a peer's buffer) and pushes 256 MiB of its own memory into it:
//   1 copy            one cuMemcpyAsync on one stream (the route's push)
//   K streams         K parts of 256/K MiB, each on a stream of its own, started together
//   batch K, stream   K parts in one cuMemcpyBatchAsync, stream order (NCCL's attributes)
//   batch K, any      the same with CU_MEMCPY_SRC_ACCESS_ORDER_ANY
// then the same into GPU 0's cuMemAlloc memory in the importer's process with peer access
// (cudaMalloc-like memory of a peer in the same process). Prints GB/s, best and median of 7.
// What it showed (4×H200, driver 580, docs/plots/rounds-4xH200/push-split-*.txt): one copy
// 392 GB/s median; 2 and 4 parts on streams of their own 388 and 381; in one batch, either
// order, 393 — the same in both memories. One copy engine's rate is the ceiling of a push.
//   nvcc -O2 -gencode=arch=compute_90,code=sm_90 -o push_split_probe push_split_probe.cu -lcuda
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.h"
#include "probe_fds.h"

namespace {

constexpr size_t kBytes = 256ull << 20;
constexpr int kReps = 7;
constexpr int kMaxParts = 4;

void exporter(int sock) {
  CU(cuCtxSetCurrent(primary_context(0)));
  const CUmemAllocationProp p = prop(0);
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, kBytes, &p, 0));
  int fd;
  CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  send_fds(sock, {fd});
  char done;
  if (read(sock, &done, 1) != 1) perror("read");
}

struct Pusher {
  CUstream s[kMaxParts];
  CUevent start, end[kMaxParts];
  CUdeviceptr src = 0;
};

// One push of kBytes from p.src to dst in `parts` parts, the way `how` says; milliseconds.
float push_ms(Pusher& p, CUdeviceptr dst, int parts, const char* how) {
  const size_t part = kBytes / parts;
  CU(cuCtxSynchronize());
  CU(cuEventRecord(p.start, p.s[0]));
  if (!strcmp(how, "streams")) {
    for (int i = 0; i < parts; ++i) {
      if (i) CU(cuStreamWaitEvent(p.s[i], p.start, 0));
      CU(cuMemcpyAsync(dst + i * part, p.src + i * part, part, p.s[i]));
      CU(cuEventRecord(p.end[i], p.s[i]));
    }
    for (int i = 1; i < parts; ++i) CU(cuStreamWaitEvent(p.s[0], p.end[i], 0));
  } else {
    CUdeviceptr d[kMaxParts], s[kMaxParts];
    size_t n[kMaxParts];
    for (int i = 0; i < parts; ++i) d[i] = dst + i * part, s[i] = p.src + i * part, n[i] = part;
    CUmemcpyAttributes attr{};
    attr.srcAccessOrder = !strcmp(how, "batch-any") ? CU_MEMCPY_SRC_ACCESS_ORDER_ANY
                                                   : CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
    size_t idx = 0;
    CU(cuMemcpyBatchAsync(d, s, n, parts, &attr, &idx, 1, p.s[0]));
  }
  CU(cuEventRecord(p.end[0], p.s[0]));
  CU(cuEventSynchronize(p.end[0]));
  float ms = 0;
  CU(cuEventElapsedTime(&ms, p.start, p.end[0]));
  return ms;
}

void report(Pusher& p, CUdeviceptr dst, const char* where) {
  struct Case {
    int parts;
    const char* how;
  } cases[] = {{1, "streams"},   {2, "streams"},   {4, "streams"}, {2, "batch-stream"},
               {4, "batch-stream"}, {2, "batch-any"}, {4, "batch-any"}};
  for (const Case& c : cases) {
    std::vector<float> ms;
    push_ms(p, dst, c.parts, c.how);  // warm-up
    for (int r = 0; r < kReps; ++r) ms.push_back(push_ms(p, dst, c.parts, c.how));
    std::sort(ms.begin(), ms.end());
    printf("RESULT %-22s %d x %-13s best %6.1f GB/s  median %6.1f GB/s\n", where, c.parts, c.how,
           kBytes / (ms.front() / 1000) / 1e9, kBytes / (ms[ms.size() / 2] / 1000) / 1e9);
  }
}

void importer(int sock) {
  const CUcontext ctx = primary_context(1), other = primary_context(0);
  CU(cuCtxSetCurrent(ctx));
  const int fd = recv_fds(sock, 1)[0];
  CUmemGenericAllocationHandle h;
  CU(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CUdeviceptr imported;
  CU(map_for_device(h, kBytes, 1, &imported));
  Pusher p;
  CU(cuMemAlloc(&p.src, kBytes));
  CU(cuMemsetD8(p.src, 3, kBytes));
  for (int i = 0; i < kMaxParts; ++i) {
    CU(cuStreamCreate(&p.s[i], CU_STREAM_NON_BLOCKING));
    CU(cuEventCreate(&p.end[i], 0));
  }
  CU(cuEventCreate(&p.start, 0));
  report(p, imported, "other process, cuMem");

  // GPU 0's memory allocated in this process, reached with peer access.
  CUdeviceptr local_peer;
  CU(cuCtxSetCurrent(other));
  CU(cuMemAlloc(&local_peer, kBytes));
  CU(cuCtxSetCurrent(ctx));
  CU(cuCtxEnablePeerAccess(other, 0));
  report(p, local_peer, "same process, peer");
  char done = 1;
  if (write(sock, &done, 1) != 1) perror("write");
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);  // children end with _exit
  return run_pair(exporter, importer) ? 0 : 1;
}
