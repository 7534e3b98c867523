// How long one flag handshake between two GPUs takes, by where the flags live: the route's
// per-op protocol is a few such handshakes (ready, done), so their latency is part of the
// fixed cost that keeps a 256 MiB all-gather below the copy engines' ceiling.
//
//   nvcc -O2 -o flag_probe tests/gpu/probes/flag_latency_probe.cu -lcuda && ./flag_probe
//
// Two streams, one per GPU, ping-pong N times: A writes ping = i and waits pong >= i; B waits
// ping >= i and writes pong = i. The host queues the operations far ahead of the devices, so the
// time per round trip is the devices' own latency, not the host's. Placements:
//   host     both flags in pinned host memory (cuMemHostRegister, what the route uses now)
//   device   each flag in the memory of the GPU that waits on it; the other GPU writes it
//            over NVLink (what NCCL's copy-engine collectives do)
//   event    (for scale) two streams of GPU 0 handing over through record/wait of events
//   event across GPUs   a stream of GPU 0 and one of GPU 1 handing over through events (one
//            process only; the shortest round trip alone, yet within an all-gather's plan the
//            flags in host memory are ahead: local_group_probe.cu)
// Prints the median of 5 runs of N = 2000 round trips per placement.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_check.h"

namespace {

constexpr int kTrips = 2000;
constexpr int kRuns = 5;

struct Flags {
  CUdeviceptr ping = 0, pong = 0;  // as both GPUs address them (unified addressing)
};

// Microseconds per round trip, median of kRuns. The two streams' operations are queued in step,
// one round trip at a time: all of one stream's first would fill its queue and block the host
// before the other stream had anything to answer with.
double ping_pong(const Flags& f, cudaStream_t a, cudaStream_t b, cudaEvent_t start, cudaEvent_t end,
                 uint32_t* base) {
  std::vector<double> us;
  for (int run = 0; run < kRuns; ++run) {
    const uint32_t first = *base + 1;
    *base += kTrips;
    CK(cudaSetDevice(0));
    CK(cudaEventRecord(start, a));
    for (int i = 0; i < kTrips; ++i) {
      CU(cuStreamWriteValue32(reinterpret_cast<CUstream>(a), f.ping, first + i, 0));
      CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(a), f.pong, first + i,
                             CU_STREAM_WAIT_VALUE_GEQ));
      CU(cuStreamWaitValue32(reinterpret_cast<CUstream>(b), f.ping, first + i,
                             CU_STREAM_WAIT_VALUE_GEQ));
      CU(cuStreamWriteValue32(reinterpret_cast<CUstream>(b), f.pong, first + i, 0));
    }
    CK(cudaEventRecord(end, a));
    CK(cudaEventSynchronize(end));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, end));
    us.push_back(ms * 1000.0 / kTrips);
  }
  return median_of(us);
}

// The same round trip between two streams of one GPU through events (record on one, wait on the
// other): the hop the route's plan makes between the user's stream and its own streams.
// `b_device`: the device of stream b (its event is created there).
double event_ping_pong(cudaStream_t a, cudaStream_t b, int b_device, cudaEvent_t start,
                       cudaEvent_t end) {
  cudaEvent_t ping, pong;
  CK(cudaSetDevice(b_device));
  CK(cudaEventCreateWithFlags(&pong, cudaEventDisableTiming));
  CK(cudaSetDevice(0));
  CK(cudaEventCreateWithFlags(&ping, cudaEventDisableTiming));
  std::vector<double> us;
  for (int run = 0; run < kRuns; ++run) {
    CK(cudaEventRecord(start, a));
    for (int i = 0; i < kTrips; ++i) {
      CK(cudaEventRecord(ping, a));
      CK(cudaSetDevice(b_device));
      CK(cudaStreamWaitEvent(b, ping, 0));
      CK(cudaEventRecord(pong, b));
      CK(cudaSetDevice(0));
      CK(cudaStreamWaitEvent(a, pong, 0));
    }
    CK(cudaEventRecord(end, a));
    CK(cudaEventSynchronize(end));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, end));
    us.push_back(ms * 1000.0 / kTrips);
  }
  CK(cudaEventDestroy(ping));
  CK(cudaEventDestroy(pong));
  return median_of(us);
}

}  // namespace

int main() {
  int n = gpus_for_probe("flag_latency_probe");
  if (n == 0) return 0;
  CU(cuInit(0));
  cudaStream_t a, b;
  cudaEvent_t start, end;
  CK(cudaSetDevice(1));
  CK(cudaDeviceEnablePeerAccess(0, 0));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CK(cudaSetDevice(0));
  CK(cudaDeviceEnablePeerAccess(1, 0));
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&end));

  // Host: one page, registered for every device (portable), as the route's op region.
  void* page = aligned_alloc(4096, 4096);
  std::fill_n(static_cast<uint32_t*>(page), 1024, 0u);
  CK(cudaHostRegister(page, 4096, cudaHostRegisterPortable | cudaHostRegisterMapped));
  uint32_t* host = static_cast<uint32_t*>(page);
  Flags in_host{reinterpret_cast<CUdeviceptr>(host), reinterpret_cast<CUdeviceptr>(host + 16)};

  // Device: ping waited on by GPU 1 lives on GPU 1; pong waited on by GPU 0 lives on GPU 0.
  void *ping_dev = nullptr, *pong_dev = nullptr;
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&ping_dev, 4096));
  CK(cudaMemset(ping_dev, 0, 4096));
  CK(cudaSetDevice(0));
  CK(cudaMalloc(&pong_dev, 4096));
  CK(cudaMemset(pong_dev, 0, 4096));
  CK(cudaDeviceSynchronize());
  Flags in_device{reinterpret_cast<CUdeviceptr>(ping_dev), reinterpret_cast<CUdeviceptr>(pong_dev)};

  uint32_t host_base = 0, device_base = 0;
  ping_pong(in_host, a, b, start, end, &host_base);  // warm-up
  ping_pong(in_device, a, b, start, end, &device_base);
  const double h = ping_pong(in_host, a, b, start, end, &host_base);
  const double d = ping_pong(in_device, a, b, start, end, &device_base);
  cudaStream_t a2;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&a2, cudaStreamNonBlocking));
  const double e = event_ping_pong(a, a2, 0, start, end);
  event_ping_pong(a, b, 1, start, end);  // warm-up
  const double x = event_ping_pong(a, b, 1, start, end);
  printf("flag round trip between GPU 0 and GPU 1 (median of %d runs of %d):\n", kRuns, kTrips);
  printf("  host     pinned host memory, both GPUs poll it      %.2f us\n", h);
  printf("  device   each flag in its waiter's memory, NVLink write  %.2f us\n", d);
  printf("  event    two streams of GPU 0, record/wait events   %.2f us\n", e);
  printf("  event across GPUs   GPU 0's stream and GPU 1's, events  %.2f us\n", x);
  return 0;
}
