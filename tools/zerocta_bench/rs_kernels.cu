#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstring>
#include <type_traits>

#include "rs_kernels.h"

namespace zcb {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 132 * 8;

// splitmix64 of (seed, rank, element): 24 random bits -> uniform in [-1, 1).
__device__ __forceinline__ float rs_uniform(uint64_t seed, int rank, uint64_t e) {
  uint64_t x = (seed ^ 0x52534E4F49534521ull) ^
               (static_cast<uint64_t>(rank) * 0xD1B54A32D192ED03ull) ^ (e * 0x9E3779B97F4A7C15ull);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  const float u = static_cast<float>(static_cast<uint32_t>(x) >> 8) * (1.0f / 16777216.0f);
  return 2.0f * u - 1.0f;
}

// Arithmetic in the element type, rounded as src/route/chunk_sum.cu rounds it.
template <typename T>
struct RsNum;
template <>
struct RsNum<float> {
  static __device__ float make(float x) { return x; }
  static __device__ double wide(float x) { return x; }
  static __device__ float scale(unsigned b) { return __uint_as_float(b); }
  static __device__ float mul(float a, float s) { return __fmul_rn(a, s); }
  static __device__ float add(float a, float b) { return __fadd_rn(a, b); }
  static __device__ float fma(float a, float s, float b) { return __fmaf_rn(a, s, b); }
  static __device__ unsigned bits(float x) { return __float_as_uint(x); }
};
template <typename T, T (*Make)(float), float (*Wide)(T)>
struct RsHalfNum {
  static __device__ T make(float x) { return Make(x); }
  static __device__ double wide(T x) { return Wide(x); }
  static __device__ T scale(unsigned b) {
    const unsigned short s = static_cast<unsigned short>(b);
    T t;
    memcpy(&t, &s, sizeof t);
    return t;
  }
  static __device__ T mul(T a, T s) { return __hmul_rn(a, s); }
  static __device__ T add(T a, T b) { return __hadd_rn(a, b); }
  static __device__ T fma(T a, T s, T b) { return __hfma(a, s, b); }
  static __device__ unsigned bits(T x) {
    unsigned short s;
    memcpy(&s, &x, sizeof s);
    return s;
  }
};
__device__ __half make_half(float x) { return __float2half_rn(x); }
__device__ float wide_half(__half x) { return __half2float(x); }
__device__ __nv_bfloat16 make_bf16(float x) { return __float2bfloat16_rn(x); }
__device__ float wide_bf16(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
struct RsNum<__half> : RsHalfNum<__half, make_half, wide_half> {};
template <>
struct RsNum<__nv_bfloat16> : RsHalfNum<__nv_bfloat16, make_bf16, wide_bf16> {};

// Rank r's pre-multiplied-sum scalar before it is rounded to the element type (premul_scalar_bits).
__host__ __device__ float premul_scalar_float(int rank, int nranks) {
  return static_cast<float>((rank + 1.0) / (nranks + 1.0));
}

template <typename T>
__global__ void fill_random(T* dst, uint64_t n, uint64_t seed, int rank) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    dst[i] = RsNum<T>::make(rs_uniform(seed, rank, i));
}

template <typename T>
__global__ void check_rs(RsCheck c, unsigned long long* wrong, unsigned long long* maxdiff) {
  using N = RsNum<T>;
  const T* out = static_cast<const T*>(c.out);
  const T* ref = static_cast<const T*>(c.ref);
  unsigned local = 0;
  double worst = 0;
  for (uint64_t j = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; j < c.count;
       j += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const T o = out[j];
    const uint64_t e = c.base + j;
    // Exact: every input is a multiple of 2^-24 below 1 in magnitude; premul: each product with
    // a scalar of the type is exact, their sum within float64's rounding.
    double exact = 0;
    for (int r = 0; r < c.nranks; ++r) {
      double v = N::wide(N::make(rs_uniform(c.seed, r, e)));
      if (c.premul) v *= N::wide(N::make(premul_scalar_float(r, c.nranks)));
      exact += v;
    }
    if (c.avg) exact /= c.nranks;
    double d = fabs(N::wide(o) - exact);
    if (!(d <= DBL_MAX)) d = INFINITY;
    worst = fmax(worst, d);
    if (ref) {
      local += N::bits(o) != N::bits(ref[j]);
    } else if (c.in_order) {
      auto in = [&](int r) { return N::make(rs_uniform(c.seed, r, e)); };
      T x;
      if (!c.avg) {
        x = in(0);
        for (int r = 1; r < c.nranks; ++r) x = N::add(x, in(r));
      } else {
        const T s = N::scale(c.scale_bits);
        x = N::mul(in(1), s);
        for (int r = 2; r < c.nranks; ++r) x = N::add(x, N::mul(in(r), s));
        x = N::fma(in(0), s, x);
      }
      local += N::bits(o) != N::bits(x);
    }
  }
  // Every lane gets here (no early return).
  const unsigned sum = __reduce_add_sync(0xffffffffu, local);
  for (int off = 16; off > 0; off /= 2)
    worst = fmax(worst, __shfl_down_sync(0xffffffffu, worst, off));
  if ((threadIdx.x & 31) == 0) {
    if (sum) atomicAdd(wrong, static_cast<unsigned long long>(sum));
    if (worst > 0) atomicMax(maxdiff, static_cast<unsigned long long>(__double_as_longlong(worst)));
  }
}

unsigned blocks_for(uint64_t n) {
  uint64_t b = (n + kThreads - 1) / kThreads;
  if (b == 0) b = 1;
  return b > kMaxBlocks ? kMaxBlocks : static_cast<unsigned>(b);
}

template <typename F>
bool with_float_type(ncclDataType_t type, F f) {
  switch (type) {
    case ncclFloat32:
      f(static_cast<float*>(nullptr));
      return true;
    case ncclFloat16:
      f(static_cast<__half*>(nullptr));
      return true;
    case ncclBfloat16:
      f(static_cast<__nv_bfloat16*>(nullptr));
      return true;
    default:
      return false;
  }
}

// `s` rounded to `type` (to nearest even), in its bits.
unsigned type_bits(ncclDataType_t type, float s) {
  unsigned bits = 0;
  if (type == ncclFloat16) {
    const __half h = __float2half_rn(s);
    unsigned short u;
    memcpy(&u, &h, sizeof u);
    bits = u;
  } else if (type == ncclBfloat16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(s);
    unsigned short u;
    memcpy(&u, &h, sizeof u);
    bits = u;
  } else {
    memcpy(&bits, &s, sizeof bits);
  }
  return bits;
}

}  // namespace

bool launch_fill_random(void* dst, uint64_t n, ncclDataType_t type, uint64_t seed, int rank,
                        cudaStream_t stream) {
  return with_float_type(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (n > 0)
      fill_random<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(dst), n, seed, rank);
  });
}

bool launch_check_rs(const RsCheck& c, unsigned long long* d_wrong, unsigned long long* d_maxdiff,
                     cudaStream_t stream) {
  return with_float_type(c.type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (c.count > 0)
      check_rs<T><<<blocks_for(c.count), kThreads, 0, stream>>>(c, d_wrong, d_maxdiff);
  });
}

unsigned avg_scale_bits(ncclDataType_t type, int n) {
  return type_bits(type, 1.0f / static_cast<float>(n > 0 ? n : 1));
}

unsigned premul_scalar_bits(ncclDataType_t type, int rank, int nranks) {
  return type_bits(type, premul_scalar_float(rank, nranks));
}

}  // namespace zcb
