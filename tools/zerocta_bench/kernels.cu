#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

#include "kernels.h"

namespace zcb {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 132 * 8;  // grid-stride: enough to fill an H100/H200

// A 32-bit word of rank `rank`'s pattern (splitmix64 finaliser).
__device__ __forceinline__ uint32_t pattern_word(uint64_t seed, uint32_t rank, uint64_t w) {
  uint64_t x =
      seed ^ (static_cast<uint64_t>(rank) * 0xD1B54A32D192ED03ull) ^ (w * 0x9E3779B97F4A7C15ull);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return static_cast<uint32_t>(x);
}

// Element e (of type T) of rank's pattern: the bytes of the pattern's word stream at e's offset.
template <typename T>
__device__ __forceinline__ T pattern_elem(uint64_t seed, uint32_t rank, uint64_t e) {
  if constexpr (sizeof(T) == 8) {
    return static_cast<T>(pattern_word(seed, rank, 2 * e)) |
           (static_cast<T>(pattern_word(seed, rank, 2 * e + 1)) << 32);
  } else {
    uint64_t byte = e * sizeof(T);
    uint32_t w = pattern_word(seed, rank, byte / 4);
    return static_cast<T>(w >> (8 * (byte % 4)));
  }
}

template <typename T>
__global__ void fill_pattern(T* dst, uint64_t n, uint64_t seed, uint32_t rank) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    dst[i] = pattern_elem<T>(seed, rank, i);
}

template <typename T>
__global__ void count_wrong(const T* recv, uint64_t per_chunk, int nchunks, uint64_t seed,
                            int skip_chunk, unsigned long long* wrong) {
  uint64_t n = per_chunk * static_cast<uint64_t>(nchunks);
  unsigned local = 0;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    uint32_t chunk = static_cast<uint32_t>(i / per_chunk);
    if (static_cast<int>(chunk) == skip_chunk) continue;
    local += recv[i] != pattern_elem<T>(seed, chunk, i - chunk * per_chunk);
  }
  // Every lane reaches this point (no early return), so the full-mask reduction is safe.
  unsigned sum = __reduce_add_sync(0xffffffffu, local);
  if ((threadIdx.x & 31) == 0 && sum) atomicAdd(wrong, static_cast<unsigned long long>(sum));
}

__global__ void fill_bf16(__nv_bfloat16* dst, uint64_t n, uint64_t seed) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    float u = static_cast<float>(pattern_word(seed, 0, i) >> 8) * (1.0f / 16777216.0f);
    dst[i] = __float2bfloat16(2.0f * u - 1.0f);
  }
}

// How a reduction's element type is made from an exact integer and compared with the expected
// value: integers exactly (unsigned ones wrap like NCCL's sum), floating types by value, so
// a NaN never matches.
template <typename T>
struct Num {
  __device__ static T from_int(int64_t v) { return static_cast<T>(v); }
  __device__ static bool equal(T a, T b) { return a == b; }
};
template <>
struct Num<__half> {
  __device__ static __half from_int(int64_t v) { return __float2half_rn(static_cast<float>(v)); }
  __device__ static bool equal(__half a, __half b) { return __half2float(a) == __half2float(b); }
};
template <>
struct Num<__nv_bfloat16> {
  __device__ static __nv_bfloat16 from_int(int64_t v) {
    return __float2bfloat16_rn(static_cast<float>(v));
  }
  __device__ static bool equal(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __bfloat162float(a) == __bfloat162float(b);
  }
};
template <typename F8>
struct NumF8 {
  __device__ static F8 from_int(int64_t v) { return F8(static_cast<float>(v)); }
  __device__ static bool equal(F8 a, F8 b) {
    return static_cast<float>(a) == static_cast<float>(b);
  }
};
template <>
struct Num<__nv_fp8_e4m3> : NumF8<__nv_fp8_e4m3> {};
template <>
struct Num<__nv_fp8_e5m2> : NumF8<__nv_fp8_e5m2> {};

template <typename T>
__global__ void fill_reduce_input(T* dst, uint64_t n, ReducePattern p, int rank) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    dst[i] = Num<T>::from_int(reduce_input_value(p, i, rank));
}

template <typename T>
__global__ void count_wrong_sum(const T* out, uint64_t n, uint64_t base, int nranks,
                                ReducePattern p, unsigned long long* wrong) {
  unsigned local = 0;
  for (uint64_t j = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    local += !Num<T>::equal(out[j], Num<T>::from_int(reduce_expected_sum(p, base + j, nranks)));
  // As in count_wrong: every lane gets here.
  unsigned sum = __reduce_add_sync(0xffffffffu, local);
  if ((threadIdx.x & 31) == 0 && sum) atomicAdd(wrong, static_cast<unsigned long long>(sum));
}

unsigned blocks_for(uint64_t n) {
  uint64_t b = (n + kThreads - 1) / kThreads;
  if (b == 0) b = 1;
  return b > kMaxBlocks ? kMaxBlocks : static_cast<unsigned>(b);
}

template <typename T>
void fill_typed(void* dst, size_t bytes, uint64_t seed, int rank, cudaStream_t s) {
  uint64_t n = bytes / sizeof(T);
  if (n == 0) return;
  fill_pattern<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(dst), n, seed,
                                                     static_cast<uint32_t>(rank));
}

template <typename T>
void count_typed(const void* recv, size_t chunk_bytes, int nchunks, uint64_t seed, int skip_chunk,
                 unsigned long long* wrong, cudaStream_t s) {
  uint64_t per_chunk = chunk_bytes / sizeof(T);
  if (per_chunk == 0 || nchunks <= 0) return;
  count_wrong<T><<<blocks_for(per_chunk * nchunks), kThreads, 0, s>>>(
      static_cast<const T*>(recv), per_chunk, nchunks, seed, skip_chunk, wrong);
}

// Calls f with a null pointer of the C++ type of an NCCL data type (false for an unknown one).
template <typename F>
bool with_type(ncclDataType_t type, F f) {
  switch (type) {
    case ncclInt8:
      f(static_cast<int8_t*>(nullptr));
      return true;
    case ncclUint8:
      f(static_cast<uint8_t*>(nullptr));
      return true;
    case ncclInt32:
      f(static_cast<int32_t*>(nullptr));
      return true;
    case ncclUint32:
      f(static_cast<uint32_t*>(nullptr));
      return true;
    case ncclInt64:
      f(static_cast<int64_t*>(nullptr));
      return true;
    case ncclUint64:
      f(static_cast<uint64_t*>(nullptr));
      return true;
    case ncclFloat16:
      f(static_cast<__half*>(nullptr));
      return true;
    case ncclFloat32:
      f(static_cast<float*>(nullptr));
      return true;
    case ncclFloat64:
      f(static_cast<double*>(nullptr));
      return true;
    case ncclBfloat16:
      f(static_cast<__nv_bfloat16*>(nullptr));
      return true;
    case ncclFloat8e4m3:
      f(static_cast<__nv_fp8_e4m3*>(nullptr));
      return true;
    case ncclFloat8e5m2:
      f(static_cast<__nv_fp8_e5m2*>(nullptr));
      return true;
    default:
      return false;
  }
}

}  // namespace

void launch_fill_pattern(void* dst, size_t bytes, int elem_bytes, uint64_t seed, int rank,
                         cudaStream_t stream) {
  switch (elem_bytes) {
    case 1:
      fill_typed<uint8_t>(dst, bytes, seed, rank, stream);
      break;
    case 2:
      fill_typed<uint16_t>(dst, bytes, seed, rank, stream);
      break;
    case 4:
      fill_typed<uint32_t>(dst, bytes, seed, rank, stream);
      break;
    default:
      fill_typed<uint64_t>(dst, bytes, seed, rank, stream);
      break;
  }
}

void launch_count_wrong(const void* recv, size_t chunk_bytes, int nchunks, int elem_bytes,
                        uint64_t seed, int skip_chunk, unsigned long long* d_wrong,
                        cudaStream_t stream) {
  switch (elem_bytes) {
    case 1:
      count_typed<uint8_t>(recv, chunk_bytes, nchunks, seed, skip_chunk, d_wrong, stream);
      break;
    case 2:
      count_typed<uint16_t>(recv, chunk_bytes, nchunks, seed, skip_chunk, d_wrong, stream);
      break;
    case 4:
      count_typed<uint32_t>(recv, chunk_bytes, nchunks, seed, skip_chunk, d_wrong, stream);
      break;
    default:
      count_typed<uint64_t>(recv, chunk_bytes, nchunks, seed, skip_chunk, d_wrong, stream);
      break;
  }
}

bool launch_fill_reduce_input(void* dst, uint64_t n, ncclDataType_t type, const ReducePattern& p,
                              int rank, cudaStream_t stream) {
  if (n == 0) return true;
  return with_type(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    fill_reduce_input<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<T*>(dst), n, p, rank);
  });
}

bool launch_count_wrong_sum(const void* out, uint64_t n, uint64_t base, int nranks,
                            ncclDataType_t type, const ReducePattern& p,
                            unsigned long long* d_wrong, cudaStream_t stream) {
  if (n == 0) return true;
  return with_type(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    count_wrong_sum<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(out), n, base,
                                                               nranks, p, d_wrong);
  });
}

void launch_fill_bf16(void* dst, size_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_bf16<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), n, seed);
}

}  // namespace zcb
