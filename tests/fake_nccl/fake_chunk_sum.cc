// chunk_sum.cu's arithmetic on the host, bit for bit (the fake driver's launches of its entry
// points, fake_cuda_kernel.cc). Per element, as chunk_sum.cu's combine():
//   sum      acc = src[0]; acc = add(acc, src[k]) for k = 1, 2, ... in order
//   premul   acc = mul(src[1], s1); acc = add(acc, mul(src[k], sk)) for k = 2, ...;
//            acc = fma(src[0], s0, acc)
// where source k's scale sk is the element at scale_at[k], or scale_bits where that is null.
// with each add, mul and fma rounded once to the element type, to nearest with ties to even, as
// the GPU's __fadd_rn/__fmul_rn/__fmaf_rn and __hadd_rn/__hmul_rn/__hfma round. Vectors or
// single elements make no difference to the bits (chunk_sum.cu), so neither does alignment here.
//
// fp16 and bf16 are computed in doubles without a library: a product of two is exact in a
// double and a sum's rounding error is had exactly (two_sum), so every operation knows its exact
// result as hi + lo. Rounding hi to odd by lo (the neighbour with an odd last bit when lo != 0)
// and then to the 16-bit format rounds the exact value once: 53 bits of round-to-odd are enough
// for any format of 51 bits or fewer. That holds for the fused multiply-add too, where rounding
// the double result to 16 bits directly could round twice.
//
// NaN: a GPU's float and half arithmetic answers the canonical NaN (0x7fffffff, 0x7fff) whatever
// NaNs went in; a NaN only copied (a sum of one source) keeps its bits.
//
// Built with -ffp-contract=off (CMakeLists.txt): a multiply and an add contracted into one fma
// by the host compiler would round once where the GPU rounds twice.
#include "fake_chunk_sum.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

// fp32: the host's IEEE single operations round exactly as the GPU's _rn ones.
struct F32 {
  using Bits = uint32_t;
  static float value(Bits b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
  }
  static Bits bits(float f) {
    if (std::isnan(f)) return 0x7fffffffu;
    Bits b;
    memcpy(&b, &f, sizeof b);
    return b;
  }
  static Bits mul(Bits a, Bits s) { return bits(value(a) * value(s)); }
  static Bits add(Bits a, Bits b) { return bits(value(a) + value(b)); }
  static Bits fma(Bits a, Bits s, Bits b) { return bits(std::fma(value(a), value(s), value(b))); }
};

// An exact result as two doubles: hi is it rounded to a double, lo the rest.
struct Exact {
  double hi, lo;
};

// Knuth's two_sum: a + b exactly (for finite a and b).
Exact two_sum(double a, double b) {
  const double s = a + b;
  const double bb = s - a;
  return {s, (a - (s - bb)) + (b - bb)};
}

// hi rounded to odd by lo: hi if exact or its last bit is odd, else its neighbour towards lo
// (consecutive doubles alternate parity, so one of the two around the exact value is odd).
double round_to_odd(const Exact& x) {
  if (x.lo == 0 || !std::isfinite(x.hi)) return x.hi;
  uint64_t b;
  memcpy(&b, &x.hi, sizeof b);
  if (b & 1) return x.hi;
  return std::nextafter(x.hi, x.lo > 0 ? INFINITY : -INFINITY);
}

// A binary floating-point format of 16 bits: 1 sign, kExpBits exponent, kMant stored mantissa
// bits (fp16: 5 and 10; bf16: 8 and 7).
template <int kExpBits, int kMant>
struct Binary16 {
  static_assert(1 + kExpBits + kMant == 16, "a 16-bit format");
  using Bits = uint16_t;
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kMinExp = 1 - kBias;  // of the smallest normal number
  static constexpr Bits kInf = static_cast<Bits>(((1 << kExpBits) - 1) << kMant);
  static constexpr Bits kCanonicalNaN = 0x7fff;

  static double value(Bits b) {
    const int e = b >> kMant & ((1 << kExpBits) - 1);
    const int f = b & ((1 << kMant) - 1);
    const double sign = b & 0x8000 ? -1.0 : 1.0;
    if (e == (1 << kExpBits) - 1) return f ? NAN : sign * INFINITY;
    if (e == 0) return sign * std::ldexp(f, kMinExp - kMant);  // subnormal
    return sign * std::ldexp(f + (1 << kMant), e - kBias - kMant);
  }

  // x (exact, or rounded to odd) to nearest, ties to even; NaN: the canonical NaN.
  static Bits round(double x) {
    if (std::isnan(x)) return kCanonicalNaN;
    const Bits sign = std::signbit(x) ? 0x8000 : 0;
    x = std::fabs(x);
    if (std::isinf(x)) return sign | kInf;
    if (x == 0) return sign;
    int e;
    std::frexp(x, &e);                         // x in [2^(e-1), 2^e)
    const int exp = std::max(e - 1, kMinExp);  // subnormals share the smallest exponent's step
    // The multiple of the format's step nearest x (nearbyint: to nearest, ties to even, the
    // default rounding mode); at most 2^(kMant+1), which carries into the exponent below.
    const double n = std::nearbyint(std::ldexp(x, kMant - exp));
    // Exponent field and mantissa in one addition: n below 2^kMant is a subnormal's mantissa,
    // and n = 2^kMant .. 2^(kMant+1) adds the hidden bit as one more step of exponent.
    const long encoded = (static_cast<long>(exp - kMinExp) << kMant) + static_cast<long>(n);
    if (encoded >= kInf) return sign | kInf;  // beyond the largest finite number
    return static_cast<Bits>(sign | encoded);
  }

  static Bits round(const Exact& x) { return round(round_to_odd(x)); }
  static Bits mul(Bits a, Bits s) { return round(Exact{value(a) * value(s), 0}); }  // exact
  static Bits add(Bits a, Bits b) { return round(sum(value(a), value(b))); }
  static Bits fma(Bits a, Bits s, Bits b) { return round(sum(value(a) * value(s), value(b))); }

 private:
  // two_sum where it is defined; an infinite or NaN operand makes no rounding error to carry.
  static Exact sum(double a, double b) {
    if (!std::isfinite(a) || !std::isfinite(b)) return {a + b, 0};
    return two_sum(a, b);
  }
};
using F16 = Binary16<5, 10>;
using BF16 = Binary16<8, 7>;

// One element type's sum of args.count elements (chunk_sum.cu's combine, one element at a time).
template <typename T>
void sum_elements(const FakeChunkSumArgs& a) {
  using Bits = typename T::Bits;
  Bits s[kFakeChunkSumMaxSources];
  for (int k = 0; k < a.nsrc; ++k) {
    s[k] = static_cast<Bits>(a.scale_bits);
    if (a.scale_at[k]) memcpy(&s[k], a.scale_at[k], sizeof(Bits));
  }
  for (unsigned long long i = 0; i < a.count; ++i) {
    auto at = [&](int k) {
      Bits b;
      memcpy(&b, static_cast<const char*>(a.src[k]) + i * sizeof(Bits), sizeof b);
      return b;
    };
    Bits acc = a.premul ? T::mul(at(1), s[1]) : at(0);
    for (int k = a.premul ? 2 : 1; k < a.nsrc; ++k)
      acc = T::add(acc, a.premul ? T::mul(at(k), s[k]) : at(k));
    if (a.premul) acc = T::fma(at(0), s[0], acc);
    memcpy(static_cast<char*>(a.dst) + i * sizeof(Bits), &acc, sizeof acc);
  }
}

}  // namespace

FAKE_HIDDEN size_t fake_chunk_type_bytes(FakeChunkType type) {
  return type == FakeChunkType::kF32 ? 4 : 2;
}

FAKE_HIDDEN void fake_chunk_sum(FakeChunkType type, const FakeChunkSumArgs& args) {
  switch (type) {
    case FakeChunkType::kF32:
      return sum_elements<F32>(args);
    case FakeChunkType::kF16:
      return sum_elements<F16>(args);
    case FakeChunkType::kBF16:
      return sum_elements<BF16>(args);
  }
}
