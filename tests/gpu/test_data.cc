#include "test_data.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "rank_util.h"

namespace zgpu {
namespace {

// Bits of a finite float of the given layout with a random sign, a random mantissa and a
// biased exponent in [exp_lo, exp_hi].
uint64_t random_float_bits(uint64_t r, int mant_bits, int exp_lo, int exp_hi) {
  const uint64_t mant = r & ((uint64_t{1} << mant_bits) - 1);
  const uint64_t r2 = mix64(r ^ 0xE3);  // independent of the mantissa bits
  const uint64_t exp =
      static_cast<uint64_t>(exp_lo) + r2 % static_cast<uint64_t>(exp_hi - exp_lo + 1);
  const uint64_t sign = r2 >> 63;
  const int exp_bits = (mant_bits == 10) ? 5 : (mant_bits == 7 || mant_bits == 23) ? 8 : 11;
  return (sign << (mant_bits + exp_bits)) | (exp << mant_bits) | mant;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  float value;
  if (exp == 0) {
    value = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    value = mant ? NAN : INFINITY;
  } else {
    value = std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  }
  return sign ? -value : value;
}

template <typename T>
T load(const uint8_t* data, size_t index) {
  T v;
  memcpy(&v, data + index * sizeof(T), sizeof(T));
  return v;
}

// Wrap-around sum of integer elements (the reduction NCCL performs on the device).
template <typename T>
std::string check_int_sum(const uint8_t* got, const std::vector<const uint8_t*>& inputs, size_t off,
                          size_t count) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = 0; i < count; ++i) {
    U sum = 0;
    for (const uint8_t* in : inputs)
      sum = static_cast<U>(sum + static_cast<U>(load<T>(in, off + i)));
    const T want = static_cast<T>(sum);
    const T have = load<T>(got, i);
    if (want != have) {
      std::ostringstream s;
      s << "element " << i << ": got " << static_cast<long long>(have) << ", want "
        << static_cast<long long>(want);
      return s.str();
    }
  }
  return "";
}

}  // namespace

uint64_t mix64(uint64_t x) {
  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t seed_of(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x5A17C0DEull;
  for (uint64_t p : parts) h = mix64(h ^ mix64(p));
  return h;
}

std::vector<uint8_t> make_input(ncclDataType_t dt, size_t count, uint64_t seed) {
  const size_t size = dtype_size(dt);
  std::vector<uint8_t> out(count * size);
  uint64_t state = seed;
  for (size_t i = 0; i < count; ++i) {
    state += 0x9E3779B97F4A7C15ull;
    const uint64_t r = mix64(state);
    uint64_t bits;
    switch (dt) {
      case ncclFloat16:
        bits = random_float_bits(r, 10, 11, 16);
        break;
      case ncclBfloat16:
        bits = random_float_bits(r, 7, 123, 128);
        break;
      case ncclFloat32:
        bits = random_float_bits(r, 23, 123, 128);
        break;
      case ncclFloat64:
        bits = random_float_bits(r, 52, 1019, 1024);
        break;
      default:
        bits = r;
        break;
    }
    memcpy(out.data() + i * size, &bits, size);  // little-endian: the low bytes
  }
  return out;
}

double element_as_double(const uint8_t* data, ncclDataType_t dt, size_t index) {
  switch (dt) {
    case ncclInt8:
      return load<int8_t>(data, index);
    case ncclUint8:
      return load<uint8_t>(data, index);
    case ncclInt32:
      return load<int32_t>(data, index);
    case ncclUint32:
      return load<uint32_t>(data, index);
    case ncclInt64:
      return static_cast<double>(load<int64_t>(data, index));
    case ncclUint64:
      return static_cast<double>(load<uint64_t>(data, index));
    case ncclFloat16:
      return half_to_float(load<uint16_t>(data, index));
    case ncclBfloat16: {
      const uint32_t bits = static_cast<uint32_t>(load<uint16_t>(data, index)) << 16;
      float f;
      memcpy(&f, &bits, sizeof(f));
      return f;
    }
    case ncclFloat32:
      return load<float>(data, index);
    case ncclFloat64:
      return load<double>(data, index);
    default:
      fail(std::string("element_as_double: unsupported type ") + dtype_name(dt));
  }
}

std::string check_sum(const uint8_t* got, const std::vector<const uint8_t*>& inputs, size_t off,
                      size_t count, ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8:
      return check_int_sum<int8_t>(got, inputs, off, count);
    case ncclUint8:
      return check_int_sum<uint8_t>(got, inputs, off, count);
    case ncclInt32:
      return check_int_sum<int32_t>(got, inputs, off, count);
    case ncclUint32:
      return check_int_sum<uint32_t>(got, inputs, off, count);
    case ncclInt64:
      return check_int_sum<int64_t>(got, inputs, off, count);
    case ncclUint64:
      return check_int_sum<uint64_t>(got, inputs, off, count);
    default:
      break;
  }
  // Each addition rounds by at most one unit in the last place of the partial sum; allow
  // twice that per addend, relative to the sum of magnitudes.
  double eps;
  switch (dt) {
    case ncclFloat16:
      eps = std::ldexp(1.0, -11);
      break;
    case ncclBfloat16:
      eps = std::ldexp(1.0, -8);
      break;
    case ncclFloat32:
      eps = std::ldexp(1.0, -24);
      break;
    case ncclFloat64:
      eps = std::ldexp(1.0, -53);
      break;
    default:
      return std::string("check_sum: unsupported type ") + dtype_name(dt);
  }
  const double n = static_cast<double>(inputs.size());
  for (size_t i = 0; i < count; ++i) {
    double sum = 0, magnitude = 0;
    for (const uint8_t* in : inputs) {
      const double x = element_as_double(in, dt, off + i);
      sum += x;
      magnitude += std::fabs(x);
    }
    const double have = element_as_double(got, dt, i);
    const double bound = 2.0 * n * eps * magnitude;
    if (!(std::fabs(have - sum) <= bound)) {  // also catches NaN
      std::ostringstream s;
      s.precision(17);
      s << "element " << i << ": got " << have << ", want " << sum << " +- " << bound;
      return s.str();
    }
  }
  return "";
}

uint64_t fnv1a64(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

size_t first_difference(const void* a, const void* b, size_t len) {
  if (memcmp(a, b, len) == 0) return SIZE_MAX;
  const uint8_t* pa = static_cast<const uint8_t*>(a);
  const uint8_t* pb = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < len; ++i) {
    if (pa[i] != pb[i]) return i;
  }
  return SIZE_MAX;
}

size_t first_not(const void* data, size_t len, uint8_t value) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < len; ++i) {
    if (p[i] != value) return i;
  }
  return SIZE_MAX;
}

std::string bytes_at(const void* data, size_t len, size_t offset) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  std::string s;
  char buf[8];
  for (size_t i = offset; i < len && i < offset + 8; ++i) {
    snprintf(buf, sizeof(buf), "%s0x%02x", s.empty() ? "" : " ", p[i]);
    s += buf;
  }
  return s;
}

}  // namespace zgpu
