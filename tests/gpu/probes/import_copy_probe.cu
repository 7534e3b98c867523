// How fast can one GPU move data into and out of another process's cuMem memory that it
// imported from POSIX fds (the zero-copy all-gather's cross-process case)?
//
// Two processes (fork before CUDA), GPU 0 exports, GPU 1 imports and issues every copy:
//   pull        GPU 0's chunk -> GPU 1's buffer, one stream
//   push        GPU 1's chunk -> GPU 0's buffer, one stream
//   push+pull   both at once, two streams (what the later rank of a pair issues)
// for GPU 0's memory as one allocation, and as 20 MiB allocations mapped back to back (as
// PyTorch's expandable segments; one copy per piece). Prints GB/s per direction, best of 5.
//   nvcc -O2 -gencode=arch=compute_90,code=sm_90 -o import_copy_probe import_copy_probe.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "probe_check.h"
#include "probe_fds.h"


constexpr size_t kBytes = 256ull << 20;
constexpr size_t kPiece = 20ull << 20;

// Maps each of `handles` (each `piece` bytes) at an address of its own, read-write for `dev`
// (as zerocta maps what it imports).
std::vector<CUdeviceptr> map_each(const std::vector<CUmemGenericAllocationHandle>& handles,
                                  size_t piece, int dev) {
  std::vector<CUdeviceptr> out;
  for (auto h : handles) {
    CUdeviceptr va;
    CU(map_for_device(h, piece, dev, &va));
    out.push_back(va);
  }
  return out;
}

void exporter(int sock, size_t piece) {
  CU(cuCtxSetCurrent(primary_context(0)));
  const CUmemAllocationProp p = prop(0);
  std::vector<CUmemGenericAllocationHandle> h(2 * kBytes / piece);  // send half, recv half
  std::vector<int> fds;
  for (auto& x : h) {
    CU(cuMemCreate(&x, piece, &p, 0));
    int fd;
    CU(cuMemExportToShareableHandle(&fd, x, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    fds.push_back(fd);
  }
  for (CUdeviceptr va : map_each(h, piece, 0)) CU(cuMemsetD8(va, 1, piece));
  for (size_t at = 0; at < fds.size(); at += 200)
    send_fds(sock,
             std::vector<int>(fds.begin() + at, fds.begin() + std::min(fds.size(), at + 200)));
  char done;
  if (read(sock, &done, 1) != 1) perror("read");
}

void importer(int sock, size_t piece, bool peer_access) {
  CU(cuCtxSetCurrent(primary_context(1)));
  // a context on the exporter's GPU in this process, and peer access to it
  if (peer_access) CU(cuCtxEnablePeerAccess(primary_context(0), 0));
  const size_t n = 2 * kBytes / piece;
  std::vector<int> fds;
  for (size_t at = 0; at < n; at += 200) {
    auto part = recv_fds(sock, std::min<size_t>(200, n - at));
    fds.insert(fds.end(), part.begin(), part.end());
  }
  std::vector<CUmemGenericAllocationHandle> h(n);
  for (size_t i = 0; i < n; ++i)
    CU(cuMemImportFromShareableHandle(&h[i],
                                      reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i])),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  const std::vector<CUdeviceptr> peer = map_each(h, piece, 1);  // [send | recv] of GPU 0
  const size_t half = kBytes / piece;
  CUdeviceptr mine;
  CU(cuMemAlloc(&mine, 2 * kBytes));
  CUstream s[2];
  CU(cuStreamCreate(&s[0], CU_STREAM_NON_BLOCKING));
  CU(cuStreamCreate(&s[1], CU_STREAM_NON_BLOCKING));
  CUevent e0, e1;
  CU(cuEventCreate(&e0, 0));
  CU(cuEventCreate(&e1, 0));
  const char* names[] = {"pull", "push", "push+pull", "push+pull, push batched"};
  for (int mode = 0; mode < 4; ++mode) {
    float best = 1e9;
    for (int rep = 0; rep < 6; ++rep) {
      CU(cuCtxSynchronize());
      CU(cuEventRecord(e0, s[0]));
      CU(cuStreamWaitEvent(s[1], e0, 0));
      std::vector<CUdeviceptr> bd, bs;
      std::vector<size_t> bn;
      for (size_t i = 0; i < half; ++i) {
        if (mode != 1) CU(cuMemcpyAsync(mine + kBytes + i * piece, peer[i], piece, s[1]));  // pull
        if (mode == 1 || mode == 2)
          CU(cuMemcpyAsync(peer[half + i], mine + i * piece, piece, s[0]));
        if (mode == 3)
          bd.push_back(peer[half + i]), bs.push_back(mine + i * piece), bn.push_back(piece);
      }
      if (mode == 3) {
        CUmemcpyAttributes attr{};
        attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        attr.flags = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE;
        size_t idx = 0;
        CU(cuMemcpyBatchAsync(bd.data(), bs.data(), bn.data(), bd.size(), &attr, &idx, 1, s[0]));
      }
      CU(cuEventRecord(e1, s[1]));
      CU(cuStreamWaitEvent(s[0], e1, 0));
      CU(cuEventRecord(e1, s[0]));
      CU(cuEventSynchronize(e1));
      float ms;
      CU(cuEventElapsedTime(&ms, e0, e1));
      if (rep > 0 && ms < best) best = ms;
    }
    printf("RESULT piece=%zuMiB peer_access=%d %-24s %.3f ms  %.1f GB/s per direction\n",
           piece >> 20, peer_access ? 1 : 0, names[mode], best, kBytes / (best / 1000) / 1e9);
  }
  char done = 1;
  if (write(sock, &done, 1) != 1) perror("write");
}

// The parent never touches CUDA: each case is a fresh pair of processes.
int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);  // children end with _exit
  for (bool peer_access : {false, true})
    for (size_t piece : {kPiece, kBytes})
      run_pair([&](int sock) { exporter(sock, piece); },
               [&](int sock) { importer(sock, piece, peer_access); });
  return 0;
}
