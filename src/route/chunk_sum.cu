// The reduce-scatter's reduction: dst = the sum of `nsrc` chunks already in this GPU's memory
// (the copy engines brought the peers' chunks over NVLink; this kernel reads HBM only). Built by
// the CUDA Toolkit's nvcc into a fatbin (cubins for sm_80, sm_90 and sm_100, and PTX) that the
// library embeds and loads with cuModuleLoadData (chunk_sum.h): the library links no CUDA
// library and runs on machines with only the driver.
//
// The numbers are NCCL's (NCCL 2.28.9 and 2.30 read: src/device/reduce_kernel.h, FuncSum and
// FuncPreMulSum; src/enqueue.cc, hostToDevRedOp; and its sm_90 code disassembled):
//   - a sum: fp32 `+`, fp16 and bf16 the native add of packed pairs; one rounding each, so the
//     order of two terms does not matter. More terms are added in source order.
//   - a pre-multiplied sum (ncclAvg on floating types is one with the scale 1/nranks, rounded to
//     the element type; ncclRedOpCreatePreMulSum's scale is given in the element type, and each
//     rank gives its own): every rank multiplies its own input by its scale before it sends it
//     on, and adds it to the partial sum it received with a fused multiply-add (NCCL's SIMPLE
//     and LL protocols; its LL128 protocol does not fuse fp16/bf16). So src[0], this rank's own
//     chunk, goes in last as fma(src[0], s0, partial), and the others are rounded products
//     added in order: on two ranks fma(mine, s_mine, round(peer * s_peer)), NCCL's SIMPLE
//     result bit for bit.
//
// Arguments travel by value in one struct (no device allocation of ours); the layout is
// chunk_sum.h's ChunkSumArgs, which that header checks by size.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

constexpr int kMaxSources = 8;

struct Args {
  const void* src[kMaxSources];
  void* dst;
  unsigned long long count;  // elements
  int nsrc;
  int premul;           // nonzero: a pre-multiplied sum, src[0] this rank's own chunk
  unsigned scale_bits;  // the scale in the element type's bits (fp32: all 32; fp16/bf16: 16)
  unsigned pad;
  // Source k's own scale, one element in device memory, where set (each rank's scalar of a
  // pre-multiplied sum made by ncclRedOpCreatePreMulSum); scale_bits where null.
  const void* scale_at[kMaxSources];
};

// One element type: how 16-byte vectors of it and single elements are combined.
template <typename T>
struct Ops;

template <>
struct Ops<float> {
  using Vec = float4;
  static __device__ float scale(unsigned bits) { return __uint_as_float(bits); }
  static __device__ float scale_from(const void* at) { return *static_cast<const float*>(at); }
  // Rounded as written (`_rn`): no multiply and add fused into one rounding.
  static __device__ float mul(float a, float s) { return __fmul_rn(a, s); }
  static __device__ float add(float a, float b) { return __fadd_rn(a, b); }
  static __device__ float fma(float a, float s, float b) { return __fmaf_rn(a, s, b); }
  static __device__ Vec mul(Vec a, float s) {
    return make_float4(mul(a.x, s), mul(a.y, s), mul(a.z, s), mul(a.w, s));
  }
  static __device__ Vec add(Vec a, Vec b) {
    return make_float4(add(a.x, b.x), add(a.y, b.y), add(a.z, b.z), add(a.w, b.w));
  }
  static __device__ Vec fma(Vec a, float s, Vec b) {
    return make_float4(fma(a.x, s, b.x), fma(a.y, s, b.y), fma(a.z, s, b.z), fma(a.w, s, b.w));
  }
};

// fp16 and bf16: a 16-byte vector is four packed pairs, combined pair by pair with the native
// packed instruction, as NCCL combines them.
template <typename T, typename T2>
struct PackedOps {
  struct Vec {
    T2 h[4];
  };
  static __device__ T scale(unsigned bits) {
    const unsigned short b = static_cast<unsigned short>(bits);
    T s;
    memcpy(&s, &b, sizeof s);
    return s;
  }
  static __device__ T scale_from(const void* at) { return *static_cast<const T*>(at); }
  static __device__ T mul(T a, T s) { return __hmul_rn(a, s); }
  static __device__ T add(T a, T b) { return __hadd_rn(a, b); }
  static __device__ T fma(T a, T s, T b) { return __hfma(a, s, b); }
  static __device__ Vec mul(Vec a, T s) {
    const T2 s2{s, s};
    for (int i = 0; i < 4; ++i) a.h[i] = __hmul2_rn(a.h[i], s2);
    return a;
  }
  static __device__ Vec add(Vec a, Vec b) {
    for (int i = 0; i < 4; ++i) a.h[i] = __hadd2_rn(a.h[i], b.h[i]);
    return a;
  }
  static __device__ Vec fma(Vec a, T s, Vec b) {
    const T2 s2{s, s};
    for (int i = 0; i < 4; ++i) a.h[i] = __hfma2(a.h[i], s2, b.h[i]);
    return a;
  }
};
template <>
struct Ops<__half> : PackedOps<__half, __half2> {};
template <>
struct Ops<__nv_bfloat16> : PackedOps<__nv_bfloat16, __nv_bfloat162> {};

// Vectors each thread has in flight per source: one 16-byte load at a time left each CTA at
// ~27 GB/s of HBM traffic (1 H200: the loads' latency, not the bandwidth, bounds a few CTAs).
constexpr int kUnroll = 4;

// The scale of every source: each its own where the sources' ranks brought theirs, else one.
template <typename T>
struct Scales {
  using S = decltype(Ops<T>::scale(0u));
  S s[kMaxSources];
};

// kUnroll results (vectors or single elements) from the sources: at(k, u) is source k's u-th
// value, valid where u < n. The loop over the sources is unrolled to kMaxSources (guarded by
// nsrc) so that each source's scale stays in a register, and my own chunk is loaded first even
// where it is summed last, so that its loads are in flight with the next source's. Measured
// side by side on an H200 (64 MiB sources, 32 CTAs): loading it last made the averages of two
// sources 14-16 % slower; a loop over a run-time count made fp32 sums 5-25 % slower; the loop
// specialised for each count of sources (a template argument) made fp32 sums 20-40 % slower.
template <typename T, typename X, typename At>
__device__ void combine(const Args& a, const Scales<T>& sc, int n, X* out, At at) {
  using O = Ops<T>;
  X acc[kUnroll], x[kUnroll], own[kUnroll];
  // Every loop runs kUnroll times, guarded, so that the arrays stay in registers. My own
  // chunk's loads first, so that they are in flight with the next source's.
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (u < n) own[u] = at(0, u);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (u < n) acc[u] = a.premul ? O::mul(at(1, u), sc.s[1]) : own[u];
#pragma unroll
  for (int k = 1; k < kMaxSources; ++k) {
    if (k >= a.nsrc) break;
    if (a.premul && k == 1) continue;  // the first product above
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < n) x[u] = at(k, u);  // the loads first, all in flight
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < n) acc[u] = O::add(acc[u], a.premul ? O::mul(x[u], sc.s[k]) : x[u]);
  }
  if (a.premul) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < n) acc[u] = O::fma(own[u], sc.s[0], acc[u]);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (u < n) out[u] = acc[u];
}

// Elements [0, count) of type X (a vector or T) with this thread's share: kUnroll at a time,
// strided over the grid.
template <typename T, typename X>
__device__ void sum_range(const Args& a, const Scales<T>& sc, unsigned long long count) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  const unsigned long long first =
      static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  X* dst = static_cast<X*>(a.dst);
  for (unsigned long long base = first; base < count; base += kUnroll * stride) {
    int n = 0;
    while (n < kUnroll && base + n * stride < count) ++n;
    X out[kUnroll];
    combine<T, X>(a, sc, n, out,
                  [&](int k, int u) { return static_cast<const X*>(a.src[k])[base + u * stride]; });
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (u < n) dst[base + u * stride] = out[u];
  }
}

template <typename T>
__device__ void chunk_sum(const Args& a) {
  using O = Ops<T>;
  using Vec = typename O::Vec;
  Scales<T> sc;
#pragma unroll
  for (int k = 0; k < kMaxSources; ++k)
    sc.s[k] = k < a.nsrc && a.scale_at[k] ? O::scale_from(a.scale_at[k]) : O::scale(a.scale_bits);
  constexpr unsigned long long kPerVec = sizeof(Vec) / sizeof(T);
  bool aligned = reinterpret_cast<uintptr_t>(a.dst) % sizeof(Vec) == 0;
  for (int k = 0; k < a.nsrc; ++k)
    aligned = aligned && reinterpret_cast<uintptr_t>(a.src[k]) % sizeof(Vec) == 0;
  if (!aligned) return sum_range<T, T>(a, sc, a.count);
  const unsigned long long nvec = a.count / kPerVec;
  sum_range<T, Vec>(a, sc, nvec);
  // The tail, one element at a time: the same operations on single elements give the same
  // bits as on packed pairs.
  Args tail = a;
  const unsigned long long done = nvec * kPerVec;
  for (int k = 0; k < a.nsrc; ++k) tail.src[k] = static_cast<const T*>(a.src[k]) + done;
  tail.dst = static_cast<T*>(a.dst) + done;
  sum_range<T, T>(tail, sc, a.count - done);
}

}  // namespace

extern "C" __global__ void zc_chunk_sum_f32(Args a) { chunk_sum<float>(a); }
extern "C" __global__ void zc_chunk_sum_f16(Args a) { chunk_sum<__half>(a); }
extern "C" __global__ void zc_chunk_sum_bf16(Args a) { chunk_sum<__nv_bfloat16>(a); }
