// Can the later rank of a pair drive the earlier rank's copy engine from its own process?
// The idea: where a pair settles "later does both" across processes, the later rank's GPU
// carries both directions and they take turns (import_copy_probe: 196 GB/s per direction).
// If the later rank's process holds a context on the earlier rank's GPU, it can issue the
// earlier chunk's copy there, as a push from that GPU's engine; both engines then work as in
// "each pushes", and the earlier rank never waits for the later one on its host.
//
// Two processes (fork before CUDA): A owns GPU 0 and exports its buffer (POSIX fd); B owns
// GPU 1, imports A's buffer (mapped for both GPUs), maps its own buffer a second time for both
// GPUs (as a self-import would), and retains GPU 0's primary context. B times, 256 MiB per
// direction (median and best of 7, GB/s per direction):
//   1  B's GPU pushes its chunk into A's buffer                (s1)
//   2  A's GPU pushes A's chunk into B's buffer, issued by B   (s0, B's context on GPU 0)
//   3  both at once                                            (what the proposal issues)
//   4  B's GPU pushes and pulls                                (today's "later does both")
// then 2 and 3 again while A keeps every SM of GPU 0 busy with a 20 ms spin: whether B's
// context's copies on GPU 0 run beside A's kernel, and what they cost A's kernel (A prints its
// spin's time with and without them). A prints GPU 0's free memory before and after B's
// context exists there: what a context on another GPU costs that GPU.
//
// Measured (2xH100): 386 GB/s per direction for 3 against 198 for 4; beside the spin at full
// speed, the spin +0.6 %; 262 MiB for a context of B's own (FOREIGN_CTX=trimmed), 526 for a
// primary one. The route built on it lost to the route without it (docs/PERFORMANCE.md, "Tried
// and rejected": the later process driving the earlier GPU's engine).
//   nvcc -O2 -o foreign_engine_probe tests/gpu/probes/foreign_engine_probe.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_check.h"
#include "probe_fds.h"

constexpr size_t kBytes = 256ull << 20;  // per direction; each buffer holds [send | recv]
constexpr int kReps = 7;
constexpr long long kSpinNs = 20'000'000;

// Holds every SM for `ns` nanoseconds of the GPU's global timer.
__global__ void spin(long long ns) {
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

void say(int sock, char c) {
  if (write(sock, &c, 1) != 1) perror("write");
}
char hear(int sock) {
  char c = 0;
  if (read(sock, &c, 1) != 1) perror("read");
  return c;
}

void grant(CUdeviceptr va, size_t bytes, std::initializer_list<int> devs) {
  std::vector<CUmemAccessDesc> a;
  for (int d : devs) {
    CUmemAccessDesc x{};
    x.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    x.location.id = d;
    x.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    a.push_back(x);
  }
  CU(cuMemSetAccess(va, bytes, a.data(), a.size()));
}

CUdeviceptr map_handle(CUmemGenericAllocationHandle h, size_t bytes,
                       std::initializer_list<int> devs) {
  CUdeviceptr va;
  CU(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  CU(cuMemMap(va, bytes, 0, h, 0));
  grant(va, bytes, devs);
  return va;
}

CUcontext primary(int ordinal) {
  CUdevice d;
  CU(cuDeviceGet(&d, ordinal));
  CUcontext c;
  CU(cuDevicePrimaryCtxRetain(&c, d));
  return c;
}

size_t free_mib() {
  size_t f, t;
  CU(cuMemGetInfo(&f, &t));
  return f >> 20;
}

void owner_a(int sock) {
  CU(cuInit(0));
  CU(cuCtxSetCurrent(primary(0)));
  const size_t before = free_mib();
  const CUmemAllocationProp p = prop(0);
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, 2 * kBytes, &p, 0));
  const CUdeviceptr buf = map_handle(h, 2 * kBytes, {0});
  CU(cuMemsetD8(buf, 1, 2 * kBytes));
  CU(cuCtxSynchronize());
  const size_t with_buffer = free_mib();
  int fd;
  CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  send_fds(sock, {fd});
  close(fd);
  hear(sock);  // B's context on GPU 0 exists, with a stream and an event
  const size_t with_context = free_mib();
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (char c = hear(sock); c == 'S' || c == 'Q'; c = hear(sock)) {
    CK(cudaEventRecord(e0, s));
    spin<<<sms * 2, 1024, 0, s>>>(kSpinNs);
    CK(cudaEventRecord(e1, s));
    say(sock, 'R');  // spinning (or about to): B may copy
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("RESULT A's 20 ms spin on every SM of GPU 0, %s: %.3f ms\n",
           c == 'S' ? "while B's context copies on GPU 0" : "B idle", ms);
    say(sock, 'K');
  }
  const size_t after = free_mib();
  printf("RESULT GPU 0 free MiB: before A's buffer %zu, with it %zu, with B's context %zu "
         "(B's context costs GPU 0 %zd MiB), after B's copies %zu\n",
         before, with_buffer, with_context, (ssize_t)with_buffer - (ssize_t)with_context, after);
  say(sock, 'E');
  hear(sock);
}

struct Timer {
  CUstream s0, s1;
  CUevent start, end, end0;
};

// Runs `issue` kReps+1 times between events on s1 (s0 joins both ends); GB/s per direction.
template <class F>
void time_it(const Timer& t, const char* name, F issue) {
  std::vector<double> ms;
  for (int rep = 0; rep <= kReps; ++rep) {
    CU(cuEventRecord(t.start, t.s1));
    CU(cuStreamWaitEvent(t.s0, t.start, 0));
    issue();
    CU(cuEventRecord(t.end0, t.s0));
    CU(cuStreamWaitEvent(t.s1, t.end0, 0));
    CU(cuEventRecord(t.end, t.s1));
    CU(cuEventSynchronize(t.end));
    float x;
    CU(cuEventElapsedTime(&x, t.start, t.end));
    if (rep > 0) ms.push_back(x);
  }
  const double best = *std::min_element(ms.begin(), ms.end());
  const double med = median_of(ms);
  printf("RESULT %-58s median %.3f ms %.1f GB/s, best %.1f GB/s per direction\n", name, med,
         kBytes / (med / 1e3) / 1e9, kBytes / (best / 1e3) / 1e9);
}

// B's context on GPU 0: its primary context, or with FOREIGN_CTX=trimmed a context of its own
// whose stack, printf and heap limits are the least the driver takes (no kernel ever runs in it).
CUcontext foreign_context(int ordinal) {
  const char* how = getenv("FOREIGN_CTX");
  if (!how || strcmp(how, "trimmed") != 0) return primary(ordinal);
  CUdevice d;
  CU(cuDeviceGet(&d, ordinal));
  CUcontext c;
  CUctxCreateParams params{};
  CU(cuCtxCreate(&c, &params, 0, d));
  CU(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0));
  CU(cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 0));
  CU(cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0));
  return c;
}

void later_b(int sock) {
  CU(cuInit(0));
  CUcontext c1 = primary(1);
  CU(cuCtxSetCurrent(c1));
  const CUmemAllocationProp p = prop(1);
  CUmemGenericAllocationHandle own;
  CU(cuMemCreate(&own, 2 * kBytes, &p, 0));
  const CUdeviceptr mine = map_handle(own, 2 * kBytes, {1});
  CU(cuMemsetD8(mine, 2, 2 * kBytes));
  // The second mapping of B's own memory that A's GPU may write (the product's self-import).
  const CUdeviceptr mine_for_both = map_handle(own, 2 * kBytes, {0, 1});
  const int fd = recv_fds(sock, 1)[0];
  CUmemGenericAllocationHandle imported;
  CU(cuMemImportFromShareableHandle(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  const CUdeviceptr a_buf = map_handle(imported, 2 * kBytes, {0, 1});
  Timer t;
  CU(cuStreamCreate(&t.s1, CU_STREAM_NON_BLOCKING));
  CU(cuEventCreate(&t.start, 0));
  CU(cuEventCreate(&t.end, 0));
  CUcontext c0 = foreign_context(0);
  CU(cuCtxSetCurrent(c0));
  CU(cuStreamCreate(&t.s0, CU_STREAM_NON_BLOCKING));
  CU(cuEventCreate(&t.end0, CU_EVENT_DISABLE_TIMING));
  CU(cuCtxSetCurrent(c1));
  say(sock, 'C');

  auto push_b = [&] { CU(cuMemcpyAsync(a_buf + kBytes, mine, kBytes, t.s1)); };
  auto push_a = [&] { CU(cuMemcpyAsync(mine_for_both + kBytes, a_buf, kBytes, t.s0)); };
  CUstream pull_stream;
  CU(cuStreamCreate(&pull_stream, CU_STREAM_NON_BLOCKING));
  time_it(t, "1 GPU 1 pushes (s1)", push_b);
  time_it(t, "2 GPU 0 pushes, issued by B (s0)", push_a);
  time_it(t, "3 both push, B issues both", [&] { push_b(), push_a(); });
  // Today's fallback: B's GPU pushes on s1 and pulls on a second stream of its own.
  Timer t4 = t;
  t4.s0 = pull_stream;
  CU(cuEventCreate(&t4.end0, CU_EVENT_DISABLE_TIMING));
  time_it(t4, "4 GPU 1 pushes and pulls (two streams)", [&] {
    push_b();
    CU(cuMemcpyAsync(mine + kBytes, a_buf, kBytes, pull_stream));
  });
  const char* under[] = {"2 while A spins on GPU 0", "3 while A spins on GPU 0"};
  for (int i = 0; i < 2; ++i) {
    say(sock, 'S');
    hear(sock);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (i == 0)
      time_it(t, under[i], push_a);
    else
      time_it(t, under[i], [&] { push_b(), push_a(); });
    hear(sock);
  }
  say(sock, 'Q');  // A's spin alone, for comparison
  hear(sock);
  hear(sock);
  say(sock, 'X');
  hear(sock);
  say(sock, 'X');
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0);  // children end with _exit
  return run_pair(owner_a, later_b) ? 0 : 1;
}
