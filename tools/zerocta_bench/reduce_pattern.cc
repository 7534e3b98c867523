#include "reduce_pattern.h"

#include <algorithm>

namespace zcb {

uint64_t exact_integer_limit(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return 127;
    case ncclUint8:
      return 255;
    case ncclInt32:
      return 2147483647ull;
    case ncclUint32:
      return 4294967295ull;
    case ncclInt64:
      return 9223372036854775807ull;
    case ncclUint64:
      return ~0ull;
    case ncclFloat16:
      return 1ull << 11;  // 10 stored mantissa bits + the implicit one
    case ncclFloat32:
      return 1ull << 24;
    case ncclFloat64:
      return 1ull << 53;
    case ncclBfloat16:
      return 1ull << 8;
    case ncclFloat8e4m3:
      return 1ull << 4;
    case ncclFloat8e5m2:
      return 1ull << 3;
    default:
      return 0;
  }
}

bool is_unsigned_type(ncclDataType_t type) {
  return type == ncclUint8 || type == ncclUint32 || type == ncclUint64;
}

ReducePattern make_reduce_pattern(ncclDataType_t type, int nranks, uint64_t seed) {
  constexpr uint64_t kMaxAmplitude = 8;
  const uint64_t n = static_cast<uint64_t>(std::max(nranks, 1));
  const bool unsig = is_unsigned_type(type);
  ReducePattern p;
  p.amplitude = std::min(kMaxAmplitude, exact_integer_limit(type) / (unsig ? 2 * n : n));
  p.offset = unsig ? p.amplitude : 0;
  p.shift = seed % (2 * p.amplitude + 1);
  return p;
}

}  // namespace zcb
