#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>
#include <cstring>

#include "rs_soak_kernels.h"

namespace zgpu {
namespace {

constexpr int kThreads = 256;  // a multiple of the warp: every lane reaches the warp reductions

unsigned grid_for(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 8192 ? (blocks ? blocks : 1) : 8192);
}

#define RS_FOR_EACH(i, n)                                                              \
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

__device__ void note(unsigned long long* count, unsigned long long* first, unsigned long long at) {
  atomicAdd(count, 1ull);
  atomicMin(first, at);
}

// A non-negative double as bits that order as the doubles do; a NaN as +infinity, so that a
// NaN output is the largest error there is.
__device__ unsigned long long ordered(double d) {
  return d <= DBL_MAX ? static_cast<unsigned long long>(__double_as_longlong(d))
                      : 0x7FF0000000000000ull;
}

// One atomic per warp: a 512 MiB op would otherwise queue hundreds of millions on one word.
__device__ void warp_max_into(unsigned long long* dst, unsigned long long v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = max(v, __shfl_down_sync(0xFFFFFFFFu, v, offset));
  if ((threadIdx.x & 31) == 0 && v != 0) atomicMax(dst, v);
}

// The unit roundoff of the element type, and its smallest subnormal (an absolute floor for
// results that cancel to near zero).
double unit_roundoff(RsElem t) {
  return t == RsElem::kF32 ? rs_pow2(-24) : t == RsElem::kF16 ? rs_pow2(-11) : rs_pow2(-8);
}
double smallest_subnormal(RsElem t) {
  return t == RsElem::kF32 ? rs_pow2(-149) : t == RsElem::kF16 ? rs_pow2(-24) : rs_pow2(-133);
}

template <typename Bits>
__global__ void fill_kernel(Bits* dst, RsElem t, size_t count, uint64_t seed, int src) {
  RS_FOR_EACH(i, count) { dst[i] = static_cast<Bits>(rs_input_bits(t, seed, src, i)); }
}

template <typename Bits>
__global__ void check_output_kernel(const Bits* out, const Bits* nccl_out, RsElem t, size_t count,
                                    uint64_t first_index, int nranks, RsReduction red,
                                    uint64_t seed, double unit, double tiny, RsOpCheck* c) {
  unsigned long long max_out = 0, max_nccl = 0, max_between = 0;
  RS_FOR_EACH(j, count) {
    double magnitude = 0;
    const double sum = rs_reference(t, seed, nranks, first_index + j, red, &magnitude);
    const uint32_t o = out[j], r = nccl_out[j];
    if (o != r) note(&c->differ_from_nccl, &c->first_differ_from_nccl, j);
    const double od = rs_to_double(t, o), rd = rs_to_double(t, r);
    const double out_error = fabs(od - sum), nccl_error = fabs(rd - sum);
    // Each of the nranks - 1 additions and each pre-multiplication (average: by the rounded
    // 1/n; pre-multiplied sum: by each rank's scalar) rounds once, by at most the unit roundoff
    // of the partial sum or product; twice that leaves room for either order.
    const double bound = 2.0 * nranks * unit * magnitude + tiny;
    if (!(out_error <= bound)) note(&c->out_beyond_bound, &c->first_out_beyond_bound, j);
    if (!(nccl_error <= bound)) note(&c->nccl_beyond_bound, &c->first_nccl_beyond_bound, j);
    max_out = max(max_out, ordered(out_error));
    max_nccl = max(max_nccl, ordered(nccl_error));
    if (o != r) max_between = max(max_between, ordered(fabs(od - rd)));
  }
  warp_max_into(&c->max_out_error, max_out);
  warp_max_into(&c->max_nccl_error, max_nccl);
  warp_max_into(&c->max_out_vs_nccl, max_between);
}

template <typename Bits>
__global__ void input_kept_kernel(const Bits* in, RsElem t, size_t count, size_t skip_begin,
                                  size_t skip_end, uint64_t seed, int src, RsOpCheck* c) {
  RS_FOR_EACH(i, count) {
    if (i >= skip_begin && i < skip_end) continue;
    if (in[i] != static_cast<Bits>(rs_input_bits(t, seed, src, i)))
      note(&c->input_changed, &c->first_input_changed, i);
  }
}

__global__ void poison_kernel(const uint8_t* p, size_t len, uint8_t value, unsigned long long base,
                              RsOpCheck* c) {
  RS_FOR_EACH(i, len) {
    if (p[i] != value) note(&c->poison_changed, &c->first_poison_changed, base + i);
  }
}

}  // namespace

uint32_t rs_scalar_bits(RsElem t, double value) {
  const float f = static_cast<float>(value);
  if (t == RsElem::kF32) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
  }
  uint16_t bits;
  if (t == RsElem::kF16) {
    const __half h = __float2half_rn(f);
    memcpy(&bits, &h, sizeof bits);
  } else {
    const __nv_bfloat16 h = __float2bfloat16_rn(f);
    memcpy(&bits, &h, sizeof bits);
  }
  return bits;
}

void rs_reset_check(RsOpCheck* device_check, cudaStream_t stream) {
  static const RsOpCheck initial = {0, ULLONG_MAX, 0, ULLONG_MAX, 0, ULLONG_MAX, 0, ULLONG_MAX,
                                    0, ULLONG_MAX, 0, 0,          0};
  cudaMemcpyAsync(device_check, &initial, sizeof initial, cudaMemcpyHostToDevice, stream);
}

void rs_fill_input(void* dst, RsElem t, size_t count, uint64_t seed, int src, cudaStream_t stream) {
  if (count == 0) return;
  if (t == RsElem::kF32) {
    fill_kernel<<<grid_for(count), kThreads, 0, stream>>>(static_cast<uint32_t*>(dst), t, count,
                                                          seed, src);
  } else {
    fill_kernel<<<grid_for(count), kThreads, 0, stream>>>(static_cast<uint16_t*>(dst), t, count,
                                                          seed, src);
  }
}

void rs_check_output(const void* out, const void* nccl_out, RsElem t, size_t count,
                     uint64_t first_index, int nranks, const RsReduction& red, uint64_t seed,
                     RsOpCheck* device_check, cudaStream_t stream) {
  if (count == 0) return;
  const double unit = unit_roundoff(t), tiny = smallest_subnormal(t);
  if (t == RsElem::kF32) {
    check_output_kernel<<<grid_for(count), kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(out), static_cast<const uint32_t*>(nccl_out), t, count,
        first_index, nranks, red, seed, unit, tiny, device_check);
  } else {
    check_output_kernel<<<grid_for(count), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(out), static_cast<const uint16_t*>(nccl_out), t, count,
        first_index, nranks, red, seed, unit, tiny, device_check);
  }
}

void rs_check_input_kept(const void* in, RsElem t, size_t count, size_t skip_begin, size_t skip_end,
                         uint64_t seed, int src, RsOpCheck* device_check, cudaStream_t stream) {
  if (count == 0) return;
  if (t == RsElem::kF32) {
    input_kept_kernel<<<grid_for(count), kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(in), t, count, skip_begin, skip_end, seed, src, device_check);
  } else {
    input_kept_kernel<<<grid_for(count), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(in), t, count, skip_begin, skip_end, seed, src, device_check);
  }
}

void rs_check_poison(const void* p, size_t len, uint8_t value, unsigned long long offset_base,
                     RsOpCheck* device_check, cudaStream_t stream) {
  if (len == 0) return;
  poison_kernel<<<grid_for(len), kThreads, 0, stream>>>(static_cast<const uint8_t*>(p), len, value,
                                                        offset_base, device_check);
}

}  // namespace zgpu
