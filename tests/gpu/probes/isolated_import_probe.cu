// Can a process that sees only its own GPU (CUDA_VISIBLE_DEVICES isolation: SLURM --gpu-bind,
// Kubernetes) import a peer process's cuMem allocation on another GPU from its POSIX fd, map it
// for its own GPU and copy to and from it on its copy engines — and how fast?
//
// zerocta passes through today when a peer's GPU is not visible (it cannot ask
// cuDeviceCanAccessPeer without the peer's ordinal); this probe decides whether it could
// route instead. Two processes (fork before CUDA), each with CUDA_VISIBLE_DEVICES set to one
// GPU (case "isolated") or both seeing every GPU (case "visible", the control). Process A
// exports a 256 MiB allocation filled with 0x5A; process B imports it, maps it read-write for
// its own device, pulls it into its own memory and checks every byte, then pushes 0xC3 into
// it, which A checks. Prints one RESULT line per step: ok or the failing call, and GB/s.
//   nvcc -O2 -o isolated_import_probe isolated_import_probe.cu -lcuda
//   (driver API only: g++ -x c++ -I<cuda>/include isolated_import_probe.cu -lcuda works too)
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probe_fds.h"

namespace {

constexpr size_t kBytes = 256ull << 20;

// Prints "RESULT <case> <step> FAILED <call>: <error>" and ends the process on failure.
void check(CUresult r, const char* call, const std::string& where) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  printf("RESULT %s FAILED %s: %s\n", where.c_str(), call, s ? s : "?");
  _exit(1);
}
#define CK(x, where) check((x), #x, (where))

void make_current(const std::string& where) {
  CK(cuInit(0), where);
  CUdevice d;
  CK(cuDeviceGet(&d, 0), where);
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, d), where);
  CK(cuCtxSetCurrent(ctx), where);
}

// Device 0 of this process (its only one when isolated).
CUdeviceptr map_for_me(CUmemGenericAllocationHandle h, const std::string& where) {
  CUdeviceptr va;
  CK(cuMemAddressReserve(&va, kBytes, 0, 0, 0), where);
  CK(cuMemMap(va, kBytes, 0, h, 0), where);
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(va, kBytes, &a, 1), where);
  return va;
}

bool all_bytes(CUdeviceptr p, unsigned char want, const std::string& where) {
  std::vector<unsigned char> host(kBytes);
  CK(cuMemcpyDtoH(host.data(), p, kBytes), where);
  for (unsigned char c : host)
    if (c != want) return false;
  return true;
}

void exporter(int sock, const std::string& name) {
  const std::string where = name + " exporter";
  make_current(where);
  const CUmemAllocationProp p = prop(0);
  CUmemGenericAllocationHandle h;
  CK(cuMemCreate(&h, kBytes, &p, 0), where);
  int fd = -1;
  CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), where);
  const CUdeviceptr va = map_for_me(h, where);
  CK(cuMemsetD8(va, 0x5A, kBytes), where);
  CK(cuCtxSynchronize(), where);
  send_fds(sock, {fd});
  char pushed = 0;
  if (read(sock, &pushed, 1) != 1 || pushed != 1) return;  // the importer failed: it said why
  printf("RESULT %s push-seen-by-owner %s\n", name.c_str(),
         all_bytes(va, 0xC3, where) ? "ok" : "WRONG BYTES");
}

double timed_copy(CUdeviceptr dst, CUdeviceptr src, CUstream s, const std::string& where) {
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    CK(cuMemcpyAsync(dst, src, kBytes, s), where);
    CK(cuStreamSynchronize(s), where);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0 && sec < best) best = sec;
  }
  return kBytes / best / 1e9;
}

void importer(int sock, const std::string& name) {
  const std::string where = name + " importer";
  make_current(where);
  int visible = 0;
  CK(cuDeviceGetCount(&visible), where);
  printf("RESULT %s devices-visible %d\n", name.c_str(), visible);
  const std::vector<int> fds = recv_fds(sock, 1);
  CUmemGenericAllocationHandle h;
  CK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[0])),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
     where + " import");
  close(fds[0]);
  const CUdeviceptr peer = map_for_me(h, where + " map");
  CUdeviceptr mine;
  CK(cuMemAlloc(&mine, kBytes), where);
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), where);
  const double pull = timed_copy(mine, peer, s, where + " pull");
  printf("RESULT %s pull %s %.1f GB/s\n", name.c_str(),
         all_bytes(mine, 0x5A, where) ? "ok" : "WRONG BYTES", pull);
  CK(cuMemsetD8(mine, 0xC3, kBytes), where);
  CK(cuCtxSynchronize(), where);
  const double push = timed_copy(peer, mine, s, where + " push");
  printf("RESULT %s push %.1f GB/s\n", name.c_str(), push);
  char pushed = 1;
  if (write(sock, &pushed, 1) != 1) perror("write");
}

// One case: A on GPU 0, B on GPU 1, each isolated (CUDA_VISIBLE_DEVICES) or not. B's device 0
// is then physical GPU 1; without isolation B makes GPU 1 current by the same ordinal trick.
void run_case(const char* name, const char* a_visible, const char* b_visible) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return;
  const pid_t a = fork();
  if (a == 0) {
    close(sv[1]);
    setenv("CUDA_VISIBLE_DEVICES", a_visible, 1);
    exporter(sv[0], name);
    _exit(0);
  }
  const pid_t b = fork();
  if (b == 0) {
    close(sv[0]);
    setenv("CUDA_VISIBLE_DEVICES", b_visible, 1);
    importer(sv[1], name);
    _exit(0);
  }
  close(sv[0]);
  close(sv[1]);
  waitpid(a, nullptr, 0);
  waitpid(b, nullptr, 0);
}

}  // namespace

// The parent never touches CUDA.
int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);  // children end with _exit
  run_case("visible", "0,1", "1,0");    // the control: both GPUs visible to both
  run_case("isolated", "0", "1");
  return 0;
}
