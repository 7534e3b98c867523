// What does a pair's all-gather cost if the earlier rank E never waits for the later rank L?
// Today each GPU of a pair pushes its own chunk straight into the other's receive buffer
// ("each pushes"), so E waits on the host until L has arrived. The alternative: E pushes its
// chunk into a scratch ring on L's GPU (S slots of X bytes, at an address E knows in advance);
// L pushes its chunk straight into E's receive buffer and copies E's slices out of the ring into
// its own receive buffer (a same-GPU copy: on this driver it runs on the SMs, not on a copy
// engine); E's push of slice k waits until L has copied out slice k-S. Measured against each
// pushes, alone and while both GPUs run an SM-bound compute loop.
//
// One process, GPU 0 = E, GPU 1 = L, cudaMalloc memory with peer access both ways. In place:
// each GPU's output is 2*C bytes and GPU r's own chunk is already at offset r*C. Variants:
//   each-pushes                        GPU 0's stream copies its chunk into GPU 1's out[0,C),
//                                      GPU 1's stream its chunk into GPU 0's out[C,2C), at once
//   scratch-memcpy/slice=X/slots=S     the ring; L's local copy of each slice (slot -> out) is a
//                                      cudaMemcpyAsync device to device on a third stream that
//                                      waits for the slice's arrival (an event after E's copy);
//                                      X = 8 and 32 MiB with S = 2, and X = C with S = 1
//                                      (at C = 32 MiB, X = 32 is X = C: run once, as S = 1)
//   scratch-kernel/ctas=K              the same with X = 32 MiB, S = 2, the local copy this
//                                      file's kernel: K CTAs x 1024 threads, 16-byte loads and
//                                      stores in a grid-stride loop, 4 in flight a thread
// for C = 32, 128, 512 MiB. RESULT lines: op time, median and min of 9 after one warm-up, and
// GB/s a direction (C / median). After every repetition both GPUs' whole outputs are checked
// word for word on the GPU against the pattern (the receive halves are zeroed before each
// repetition; the pattern has no zero byte): any difference prints a WRONG line.
// PART lines (C = 128 MiB): E's push alone, and L's local copy alone (memcpy, kernel of K CTAs).
//
// Timing of one op: E's stream waits on a host-written flag (cuStreamWaitValue32 on pinned host
// memory) while the host enqueues the whole op on every stream, so the host's enqueueing is not
// timed; then it records the start event and an event that L's streams wait on (so both GPUs
// start together), and at the end E's stream waits for L's done events and records the end
// event. Both timing events are on GPU 0 (cudaEventElapsedTime needs one device), so the time
// includes one cross-GPU event wait at each end (a few microseconds), the same for every variant.
//
// Under load: a fixed-work FMA kernel (every SM full, 4 waves; its work calibrated at start to
// ~1 ms a kernel) launched 40 times back to back on a compute stream of each GPU. Per
// repetition (3, interleaved across the variants): the compute loop alone, then per variant
// (each-pushes, scratch-memcpy X = 32 MiB S = 2, scratch-kernel K = 2, 4, 8, 16, and not asked
// for but cheap: K = 8 with L's local stream at the highest stream priority) its ops alone and
// then the ops together with the compute loop, C = 128 MiB, all released by one host flag.
// The number of ops is calibrated per variant so that, alone, they take ~90% of the compute
// loop alone. LOAD lines, one per GPU: the compute loop's time alone and with the ops, the
// slowdown, the ops' total time alone and under load, the host's enqueue time after the flag
// (ops are released after the first 6 are enqueued, the rest enqueued while they run: if
// enqueue_ms nears ops_under_load_ms, the host was the limit).
// What it showed (2xH200, driver 580.159.04, docs/plots/lifecycle-2xH200/scratch-push-probe.txt):
// alone, the ring with the driver's copy and 32 MiB slices ran at 0.91-0.93x each pushes (339 /
// 362 GB/s against 373 / 387 at 128 / 512 MiB); the kernel needs 16 CTAs to come near it. Beside
// the SM-bound loop each pushes kept its time (35.8 ms for its ops) and cost the loop nothing,
// while every ring variant took 68-71 ms for the same ops (L's local copy waits for SMs, and
// E's pushes wait for L's slots), 58 ms with L's copy stream at the highest priority, which
// cost the loop 3-4 %. So E pushing into L's scratch doubles the op beside compute.
//   nvcc -O2 -std=c++17 -arch=sm_90 -o scratch_push_probe scratch_push_probe.cu -lcuda
//   scratch_push_probe [load repetitions (3)]
// Needs GPUs 0 and 1 with peer access, 1.5 GiB on GPU 1; well under a minute expected on 2xH200.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "probe_check.h"

namespace {

constexpr size_t kMiB = 1ull << 20;
constexpr size_t kMaxC = 512 * kMiB;
constexpr size_t kLoadC = 128 * kMiB;
constexpr int kReps = 9;
constexpr int kComputeKernels = 40;
constexpr int kComputeThreads = 256;
constexpr int kComputeWaves = 4;
constexpr int kCopyThreads = 1024;
constexpr int kRing = 64;            // events a ring; more than any S
constexpr int kReleaseAfterOps = 6;  // back-to-back runs: the flag is written after these
constexpr double kOpsShareOfLoop = 0.9;

// ---------------------------------------------------------------------------------------------
// Kernels.

// Word `w` of rank `rank`'s chunk. No byte is zero, so a byte left zeroed never matches.
__host__ __device__ inline uint32_t pattern(int rank, uint64_t w) {
  uint64_t x = w * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(rank + 1) * 0xD1B54A32D192ED03ull;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x) | 0x01010101u;
}

__global__ void fill_chunk(uint32_t* p, uint64_t words, int rank) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < words;
       i += stride)
    p[i] = pattern(rank, i);
}

// Counts the words of `out` (rank 0's chunk, then rank 1's, `words` each) that differ from the
// pattern into bad[0], and keeps the lowest such word index in bad[1].
__global__ void check_output(const uint32_t* out, uint64_t words, unsigned long long* bad) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < 2 * words;
       i += stride) {
    const int rank = i >= words ? 1 : 0;
    if (out[i] != pattern(rank, i - rank * words)) {
      atomicAdd(&bad[0], 1ull);
      atomicMin(&bad[1], static_cast<unsigned long long>(i));
    }
  }
}

// L's local copy: 16 bytes a load, grid-stride, 4 loads in flight a thread.
__global__ void __launch_bounds__(kCopyThreads)
    copy16(uint4* __restrict__ dst, const uint4* __restrict__ src, uint64_t n) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

// SM-bound work: 8 independent FMA chains a thread, `iters` rounds.
__global__ void compute(float* sink, int iters) {
  float a[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = threadIdx.x + j;
  const float m = 1.0000001f, c = 0.9999999f;
  for (int k = 0; k < iters; ++k) {
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = fmaf(a[j], m, c);
  }
  float s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += a[j];
  if (s == 1.25e-30f) sink[blockIdx.x] = s;  // never true; keeps the loop
}

// ---------------------------------------------------------------------------------------------
// Host side.

void dev(int d) { CK(cudaSetDevice(d)); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A flag in pinned host memory that streams wait on (>= the gate's generation) until the host
// writes it. A watchdog writes it after 10 s if the host never did (its enqueueing blocked
// behind the closed gate): the run then says so and its numbers are not valid.
class Gate {
 public:
  Gate() {
    void* h = nullptr;
    CK(cudaHostAlloc(&h, 64, cudaHostAllocMapped | cudaHostAllocPortable));
    flag_ = static_cast<volatile uint32_t*>(h);
    *flag_ = 0;
    void* d = nullptr;
    CK(cudaHostGetDevicePointer(&d, h, 0));
    dflag_ = reinterpret_cast<CUdeviceptr>(d);
    watchdog_ = std::thread([this] { watch(); });
  }
  ~Gate() {
    stop_ = true;
    watchdog_.join();
  }
  // Makes each (device, stream) wait for the next generation.
  void arm(std::initializer_list<std::pair<int, cudaStream_t>> streams) {
    uint32_t g;
    {
      std::lock_guard<std::mutex> l(mu_);
      g = ++gen_;
    }
    for (const auto& s : streams) {  // not under the lock: these calls could block
      dev(s.first);
      CU(cuStreamWaitValue32(s.second, dflag_, g, CU_STREAM_WAIT_VALUE_GEQ));
    }
    std::lock_guard<std::mutex> l(mu_);
    armed_at_ = now_ns();
    armed_ = true;
  }
  void open() {
    std::lock_guard<std::mutex> l(mu_);
    *flag_ = gen_;
    armed_ = false;
  }
  // True (and reset) if the watchdog opened the gate since the last call.
  bool tripped() { return tripped_.exchange(false); }

 private:
  void watch() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::lock_guard<std::mutex> l(mu_);
      if (armed_ && now_ns() - armed_at_ > 10'000'000'000ll) {
        *flag_ = gen_;
        armed_ = false;
        tripped_ = true;
      }
    }
  }
  volatile uint32_t* flag_ = nullptr;
  CUdeviceptr dflag_ = 0;
  uint32_t gen_ = 0;
  bool armed_ = false;
  int64_t armed_at_ = 0;
  std::mutex mu_;
  std::atomic<bool> tripped_{false};
  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

enum class Kind { kEach, kMemcpy, kKernel };

struct Variant {
  Kind kind = Kind::kEach;
  size_t slice = 0;  // bytes; 0: C (one slice)
  int slots = 1;
  int ctas = 0;
  bool high_priority = false;  // L's local stream at the highest priority
  size_t slice_for(size_t C) const { return slice ? std::min(slice, C) : C; }
  std::string name(size_t C) const {
    char b[128];
    switch (kind) {
      case Kind::kEach:
        return "each-pushes";
      case Kind::kMemcpy:
        snprintf(b, sizeof b, "scratch-memcpy/slice=%zuMiB/slots=%d", slice_for(C) / kMiB, slots);
        return b;
      case Kind::kKernel:
        snprintf(b, sizeof b, "scratch-kernel/ctas=%d%s", ctas,
                 high_priority ? "/local=high-priority" : "");
        return b;
    }
    return "?";
  }
};

Variant each_pushes() { return Variant{}; }
Variant scratch_memcpy(size_t slice, int slots) {
  Variant v;
  v.kind = Kind::kMemcpy;
  v.slice = slice;
  v.slots = slots;
  return v;
}
Variant scratch_kernel(int ctas, bool high = false) {
  Variant v;
  v.kind = Kind::kKernel;
  v.slice = 32 * kMiB;
  v.slots = 2;
  v.ctas = ctas;
  v.high_priority = high;
  return v;
}

struct Pair {
  uint8_t* out[2] = {};        // 2 * kMaxC on GPU r
  uint8_t* scratch = nullptr;  // kMaxC on GPU 1 (L)
  unsigned long long* bad[2] = {};
  float* sink[2] = {};
  cudaStream_t s0 = nullptr;                 // GPU 0: E's push
  cudaStream_t s1 = nullptr;                 // GPU 1: L's push
  cudaStream_t local = nullptr;              // GPU 1: L's local copies
  cudaStream_t local_hi = nullptr;           // GPU 1: the same at the highest priority
  cudaStream_t compute[2] = {};              // each GPU: the compute loop
  cudaEvent_t go = nullptr;                  // sync, GPU 0
  cudaEvent_t done1 = nullptr;               // sync, GPU 1
  cudaEvent_t done_local = nullptr;          // sync, GPU 1
  cudaEvent_t arrived[kRing] = {};           // sync, GPU 0
  cudaEvent_t copied[kRing] = {};            // sync, GPU 1
  cudaEvent_t t0 = nullptr, t1 = nullptr;    // timing, GPU 0
  cudaEvent_t lt0 = nullptr, lt1 = nullptr;  // timing, GPU 1
  cudaEvent_t ct0[2] = {}, ct1[2] = {};      // timing, each GPU
  size_t C = 0;
  uint64_t slices = 0;     // ring slices issued
  uint64_t run_start = 0;  // `slices` when the current run (after a synchronize) began
  int sms[2] = {};
  int compute_blocks = 0;
  int compute_iters = 0;
};

void setup(Pair& p) {
  for (int d = 0; d < 2; ++d) {
    dev(d);
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&p.out[d], 2 * kMaxC));
    CK(cudaMalloc(&p.bad[d], 2 * sizeof(unsigned long long)));
    CK(cudaMalloc(&p.sink[d], 1 << 20));
    CK(cudaStreamCreateWithFlags(&p.compute[d], cudaStreamNonBlocking));
    CK(cudaEventCreate(&p.ct0[d]));
    CK(cudaEventCreate(&p.ct1[d]));
    CK(cudaDeviceGetAttribute(&p.sms[d], cudaDevAttrMultiProcessorCount, d));
  }
  dev(0);
  CK(cudaStreamCreateWithFlags(&p.s0, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&p.go, cudaEventDisableTiming));
  for (auto& e : p.arrived) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CK(cudaEventCreate(&p.t0));
  CK(cudaEventCreate(&p.t1));
  dev(1);
  CK(cudaMalloc(&p.scratch, kMaxC));
  CK(cudaStreamCreateWithFlags(&p.s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&p.local, cudaStreamNonBlocking));
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  CK(cudaStreamCreateWithPriority(&p.local_hi, cudaStreamNonBlocking, greatest));
  CK(cudaEventCreateWithFlags(&p.done1, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&p.done_local, cudaEventDisableTiming));
  for (auto& e : p.copied) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CK(cudaEventCreate(&p.lt0));
  CK(cudaEventCreate(&p.lt1));
}

void sync_both() {
  for (int d = 0; d < 2; ++d) {
    dev(d);
    CK(cudaDeviceSynchronize());
  }
}

// Chunk size C: each GPU's own chunk written at r*C, the other half zeroed.
void use_chunk_size(Pair& p, size_t C) {
  p.C = C;
  for (int d = 0; d < 2; ++d) {
    dev(d);
    CK(cudaMemset(p.out[d], 0, 2 * kMaxC));
    fill_chunk<<<p.sms[d] * 4, 256>>>(reinterpret_cast<uint32_t*>(p.out[d] + d * C), C / 4, d);
    CK(cudaGetLastError());
  }
  sync_both();
}

// Zeroes both receive halves (GPU 0's [C,2C), GPU 1's [0,C)); returns when done.
void clear_receive(Pair& p) {
  dev(0);
  CK(cudaMemsetAsync(p.out[0] + p.C, 0, p.C, p.s0));
  dev(1);
  CK(cudaMemsetAsync(p.out[1], 0, p.C, p.s1));
  sync_both();
}

// Checks both GPUs' whole outputs; prints a WRONG line per GPU that differs. True if right.
bool outputs_right(Pair& p, const std::string& what) {
  bool ok = true;
  for (int d = 0; d < 2; ++d) {
    dev(d);
    const unsigned long long init[2] = {0, ~0ull};
    CK(cudaMemcpy(p.bad[d], init, sizeof init, cudaMemcpyHostToDevice));
    check_output<<<p.sms[d] * 4, 256>>>(reinterpret_cast<const uint32_t*>(p.out[d]), p.C / 4,
                                        p.bad[d]);
    CK(cudaGetLastError());
    unsigned long long got[2];
    CK(cudaMemcpy(got, p.bad[d], sizeof got, cudaMemcpyDeviceToHost));
    if (got[0]) {
      ok = false;
      printf("WRONG %s C_MiB=%zu gpu=%d words_wrong=%llu first_wrong_byte=%llu\n", what.c_str(),
             p.C / kMiB, d, got[0], got[1] * 4);
    }
  }
  return ok;
}

// Enqueues one all-gather of the pair in variant `v` (nothing waits on the host). Starts with
// E's stream recording `go`, which L's streams wait on; ends with E's stream waiting for L's.
void enqueue_op(Pair& p, const Variant& v) {
  const size_t C = p.C;
  dev(0);
  CK(cudaEventRecord(p.go, p.s0));
  dev(1);
  CK(cudaStreamWaitEvent(p.s1, p.go, 0));
  // L pushes its chunk straight into E's receive buffer, in every variant.
  CK(cudaMemcpyAsync(p.out[0] + C, p.out[1] + C, C, cudaMemcpyDefault, p.s1));
  CK(cudaEventRecord(p.done1, p.s1));
  if (v.kind == Kind::kEach) {
    dev(0);
    CK(cudaMemcpyAsync(p.out[1], p.out[0], C, cudaMemcpyDefault, p.s0));
  } else {
    cudaStream_t local = v.high_priority ? p.local_hi : p.local;
    const size_t X = v.slice_for(C);
    for (size_t off = 0; off < C; off += X, ++p.slices) {
      const size_t len = std::min(X, C - off);
      const uint64_t g = p.slices;
      uint8_t* slot = p.scratch + (g % v.slots) * X;
      dev(0);
      // The slot's previous slice (g - S) must have been copied out by L.
      if (g >= p.run_start + v.slots)
        CK(cudaStreamWaitEvent(p.s0, p.copied[(g - v.slots) % kRing], 0));
      CK(cudaMemcpyAsync(slot, p.out[0] + off, len, cudaMemcpyDefault, p.s0));
      CK(cudaEventRecord(p.arrived[g % kRing], p.s0));
      dev(1);
      CK(cudaStreamWaitEvent(local, p.arrived[g % kRing], 0));
      if (v.kind == Kind::kMemcpy) {
        CK(cudaMemcpyAsync(p.out[1] + off, slot, len, cudaMemcpyDeviceToDevice, local));
      } else {
        copy16<<<v.ctas, kCopyThreads, 0, local>>>(reinterpret_cast<uint4*>(p.out[1] + off),
                                                   reinterpret_cast<const uint4*>(slot), len / 16);
        CK(cudaGetLastError());
      }
      CK(cudaEventRecord(p.copied[g % kRing], local));
    }
    CK(cudaEventRecord(p.done_local, local));
    dev(0);
    CK(cudaStreamWaitEvent(p.s0, p.done_local, 0));
  }
  dev(0);
  CK(cudaStreamWaitEvent(p.s0, p.done1, 0));
}

float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

void enqueue_compute_loop(Pair& p) {
  for (int k = 0; k < kComputeKernels; ++k) {
    for (int d = 0; d < 2; ++d) {
      dev(d);
      if (k == 0) CK(cudaEventRecord(p.ct0[d], p.compute[d]));
      compute<<<p.compute_blocks, kComputeThreads, 0, p.compute[d]>>>(p.sink[d], p.compute_iters);
      CK(cudaGetLastError());
      if (k == kComputeKernels - 1) CK(cudaEventRecord(p.ct1[d], p.compute[d]));
    }
  }
}

struct RunTimes {
  double ops_ms = 0;          // first op's start to last op's end (GPU 0's events)
  double compute_ms[2] = {};  // each GPU's compute loop
  double enqueue_ms = 0;      // host: gate opened to the last op enqueued
  bool valid = true;
};

// `n` ops of `v` back to back (none if n == 0), with the compute loop on both GPUs if
// `with_compute`, everything released at once by the gate. The gate opens after the first
// `release_after` ops are enqueued (>= n: after every op and the end event).
RunTimes run(Pair& p, Gate& gate, const Variant& v, int n, bool with_compute, int release_after) {
  RunTimes t;
  p.run_start = p.slices;
  if (with_compute && n)
    gate.arm({{0, p.compute[0]}, {1, p.compute[1]}, {0, p.s0}});
  else if (with_compute)
    gate.arm({{0, p.compute[0]}, {1, p.compute[1]}});
  else
    gate.arm({{0, p.s0}});
  if (with_compute) enqueue_compute_loop(p);
  if (n) {
    dev(0);
    CK(cudaEventRecord(p.t0, p.s0));
  }
  // Opened at the end (after the end event is enqueued too) unless `release_after` < n.
  const bool open_at_end = release_after >= n;
  int64_t opened = 0;
  for (int i = 0; i < n; ++i) {
    enqueue_op(p, v);
    if (!open_at_end && i + 1 == release_after) {
      gate.open();
      opened = now_ns();
    }
  }
  if (n) {
    dev(0);
    CK(cudaEventRecord(p.t1, p.s0));
  }
  if (open_at_end) {
    gate.open();
    opened = now_ns();
  }
  t.enqueue_ms = (now_ns() - opened) / 1e6;
  if (n) t.ops_ms = elapsed_ms(p.t0, p.t1);
  if (with_compute)
    for (int d = 0; d < 2; ++d) t.compute_ms[d] = elapsed_ms(p.ct0[d], p.ct1[d]);
  sync_both();
  if (gate.tripped()) {
    t.valid = false;
    printf("INVALID %s: the host's enqueueing blocked behind the closed gate (watchdog)\n",
           v.name(p.C).c_str());
  }
  return t;
}

void print_result(const char* tag, const std::string& what, size_t C, std::vector<double> us) {
  const double med = median_of(us);
  printf("%s %s C_MiB=%zu median_us=%.1f min_us=%.1f GBps=%.1f\n", tag, what.c_str(), C / kMiB, med,
         us.front(), C / (med * 1e-6) / 1e9);
}

// One op of `v`, timed: warm-up, then kReps, each on zeroed receive halves and checked.
void timed_variant(Pair& p, Gate& gate, const Variant& v) {
  const std::string name = "variant=" + v.name(p.C);
  std::vector<double> us;
  bool ok = true, valid = true;
  for (int r = -1; r < kReps; ++r) {
    clear_receive(p);
    const RunTimes t = run(p, gate, v, 1, false, 1);
    valid = valid && t.valid;
    ok = outputs_right(p, name) && ok;
    if (r >= 0) us.push_back(t.ops_ms * 1000);
    if (!valid) break;  // the watchdog tripped: do not wait it out 10 times
  }
  if (us.empty()) us.push_back(0);
  print_result("RESULT", name + (ok ? "" : " (WRONG)") + (valid ? "" : " (INVALID)"), p.C, us);
}

// E's push alone (one direction), and L's local copies alone, C = p.C.
void parts(Pair& p, Gate& gate) {
  {
    std::vector<double> us;
    for (int r = -1; r < kReps; ++r) {
      gate.arm({{0, p.s0}});
      dev(0);
      CK(cudaEventRecord(p.t0, p.s0));
      CK(cudaMemcpyAsync(p.out[1], p.out[0], p.C, cudaMemcpyDefault, p.s0));
      CK(cudaEventRecord(p.t1, p.s0));
      gate.open();
      if (r >= 0) us.push_back(elapsed_ms(p.t0, p.t1) * 1000);
    }
    print_result("PART", "what=push-E-to-L-alone", p.C, us);
  }
  for (int ctas : {0, 1, 2, 4, 8, 16}) {
    std::vector<double> us;
    for (int r = -1; r < kReps; ++r) {
      gate.arm({{1, p.local}});
      dev(1);
      CK(cudaEventRecord(p.lt0, p.local));
      if (ctas == 0) {
        CK(cudaMemcpyAsync(p.out[1], p.scratch, p.C, cudaMemcpyDeviceToDevice, p.local));
      } else {
        copy16<<<ctas, kCopyThreads, 0, p.local>>>(reinterpret_cast<uint4*>(p.out[1]),
                                                   reinterpret_cast<const uint4*>(p.scratch),
                                                   p.C / 16);
        CK(cudaGetLastError());
      }
      CK(cudaEventRecord(p.lt1, p.local));
      gate.open();
      if (r >= 0) us.push_back(elapsed_ms(p.lt0, p.lt1) * 1000);
    }
    char what[64];
    if (ctas == 0)
      snprintf(what, sizeof what, "what=local-memcpy-alone");
    else
      snprintf(what, sizeof what, "what=local-kernel-alone/ctas=%d", ctas);
    print_result("PART", what, p.C, us);
  }
  sync_both();
}

// Sets the compute kernel's iterations so that one kernel takes ~1 ms on GPU 0.
void calibrate_compute(Pair& p) {
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, compute, kComputeThreads, 0));
  p.compute_blocks = std::max(1, per_sm) * std::min(p.sms[0], p.sms[1]) * kComputeWaves;
  auto kernel_ms = [&](int d, int iters) {
    dev(d);
    double best = 1e30;
    for (int r = 0; r < 4; ++r) {
      CK(cudaEventRecord(p.ct0[d], p.compute[d]));
      compute<<<p.compute_blocks, kComputeThreads, 0, p.compute[d]>>>(p.sink[d], iters);
      CK(cudaGetLastError());
      CK(cudaEventRecord(p.ct1[d], p.compute[d]));
      best = std::min(best, static_cast<double>(elapsed_ms(p.ct0[d], p.ct1[d])));
    }
    return best;
  };
  int iters = 2000;
  for (int step = 0; step < 3; ++step) {
    const double ms = kernel_ms(0, iters);
    iters = std::max(1, static_cast<int>(std::lround(iters * 1.0 / ms)));
  }
  p.compute_iters = iters;
  printf("CALIB compute blocks=%d threads=%d iters=%d kernel_ms_gpu0=%.3f kernel_ms_gpu1=%.3f\n",
         p.compute_blocks, kComputeThreads, iters, kernel_ms(0, iters), kernel_ms(1, iters));
}

void load(Pair& p, Gate& gate, int reps) {
  const std::vector<Variant> variants = {
      each_pushes(),     scratch_memcpy(32 * kMiB, 2), scratch_kernel(2),      scratch_kernel(4),
      scratch_kernel(8), scratch_kernel(16),           scratch_kernel(8, true)};
  // The compute loop alone, and per variant the number of ops that fills ~90% of it.
  const RunTimes alone = run(p, gate, Variant{}, 0, true, 0);
  printf("CALIB compute-loop kernels=%d ms_gpu0=%.2f ms_gpu1=%.2f\n", kComputeKernels,
         alone.compute_ms[0], alone.compute_ms[1]);
  std::vector<int> n_ops;
  for (const Variant& v : variants) {
    constexpr int kProbeOps = 8;
    run(p, gate, v, kProbeOps, false, kReleaseAfterOps);  // warm-up
    const RunTimes t = run(p, gate, v, kProbeOps, false, kReleaseAfterOps);
    const double per_op = t.ops_ms / kProbeOps;
    const double loop = std::min(alone.compute_ms[0], alone.compute_ms[1]);
    n_ops.push_back(std::clamp(static_cast<int>(kOpsShareOfLoop * loop / per_op), 2, 400));
    printf("CALIB ops variant=%s C_MiB=%zu per_op_ms=%.3f n_ops=%d\n", v.name(p.C).c_str(),
           p.C / kMiB, per_op, n_ops.back());
  }
  for (int rep = 1; rep <= reps; ++rep) {
    const RunTimes c = run(p, gate, Variant{}, 0, true, 0);
    printf("COMPUTE rep=%d compute_alone_ms_gpu0=%.2f compute_alone_ms_gpu1=%.2f\n", rep,
           c.compute_ms[0], c.compute_ms[1]);
    for (size_t i = 0; i < variants.size(); ++i) {
      const Variant& v = variants[i];
      const std::string name = v.name(p.C);
      clear_receive(p);
      const RunTimes a = run(p, gate, v, n_ops[i], false, kReleaseAfterOps);
      const bool ok_a = outputs_right(p, "load-alone variant=" + name);
      clear_receive(p);
      const RunTimes w = run(p, gate, v, n_ops[i], true, kReleaseAfterOps);
      const bool ok_w = outputs_right(p, "load-with variant=" + name);
      const char* note = !(a.valid && w.valid) ? " INVALID" : (ok_a && ok_w ? "" : " WRONG");
      for (int d : {1, 0}) {
        printf(
            "LOAD rep=%d variant=%s C_MiB=%zu n_ops=%d gpu=%d role=%s compute_alone_ms=%.2f "
            "compute_with_ms=%.2f slowdown_pct=%.1f ops_alone_ms=%.2f ops_under_load_ms=%.2f "
            "enqueue_ms=%.2f%s\n",
            rep, name.c_str(), p.C / kMiB, n_ops[i], d, d ? "L" : "E", c.compute_ms[d],
            w.compute_ms[d], (w.compute_ms[d] / c.compute_ms[d] - 1) * 100, a.ops_ms, w.ops_ms,
            w.enqueue_ms, note);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const int load_reps = argc > 1 ? std::max(1, atoi(argv[1])) : 3;
  if (!gpus_for_probe("scratch_push_probe")) return 0;
  int can01 = 0, can10 = 0;
  CK(cudaDeviceCanAccessPeer(&can01, 0, 1));
  CK(cudaDeviceCanAccessPeer(&can10, 1, 0));
  if (!can01 || !can10) {
    printf("scratch_push_probe: GPUs 0 and 1 have no peer access\n");
    return 1;
  }
  int drv = 0;
  CK(cudaDriverGetVersion(&drv));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("INFO gpu0=%s driver=%d kernel_copy_threads=%d reps=%d\n", prop.name, drv, kCopyThreads,
         kReps);
  const int64_t start = now_ns();
  Pair p;
  setup(p);
  Gate gate;

  for (size_t C : {32 * kMiB, 128 * kMiB, 512 * kMiB}) {
    use_chunk_size(p, C);
    std::vector<Variant> vs = {each_pushes(), scratch_memcpy(8 * kMiB, 2)};
    if (32 * kMiB < C) vs.push_back(scratch_memcpy(32 * kMiB, 2));  // else the same as X = C
    vs.push_back(scratch_memcpy(0, 1));
    for (int k : {1, 2, 4, 8, 16}) vs.push_back(scratch_kernel(k));
    for (const Variant& v : vs) timed_variant(p, gate, v);
  }
  use_chunk_size(p, kLoadC);
  parts(p, gate);

  calibrate_compute(p);
  use_chunk_size(p, kLoadC);
  load(p, gate, load_reps);
  printf("INFO total_s=%.1f\n", (now_ns() - start) / 1e9);
  return 0;
}
