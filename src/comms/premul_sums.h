// The pre-multiplied sums (ncclRedOpCreatePreMulSum) made on one communicator, as the
// reduce-scatter's route needs them. NCCL keeps an op's scalar inside the communicator, where
// the route cannot read it, and each rank makes its own op with its own scalar: so the
// creation's wrapper notes what it was given here, the destruction's forgets it, and a
// reduce-scatter looks its op up at the call (a group's op may be destroyed before the group
// ends, as PyTorch does right after each call).
//
// Noted only where ZEROCTA_REDUCESCATTER asks for the route: with default settings the wrapper
// only forwards.
#pragma once

#include <nccl.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "route.h"

namespace zc {

// One pre-multiplied sum, as its creation described it.
struct PreMulSum {
  ncclRedOp_t op = ncclSum;
  ncclDataType_t datatype = ncclFloat32;
  // ncclScalarDevice: the scalar lives at `device_scalar` (one element of `datatype`), read
  // when the op runs; ncclScalarHostImmediate: `host_bits` are its bits, copied at the creation
  // (fp16 and bf16 in the low 16 bits), as NCCL copies them.
  bool on_device = false;
  uint64_t device_scalar = 0;
  uint32_t host_bits = 0;
};

// A reduce-scatter's reduction, resolved at the call.
struct ResolvedRedOp {
  ncclRedOp_t op = ncclSum;  // as the application passed it
  RsReduce kind = RsReduce::kSum;
  PreMulSum premul;  // kind == kPreMulSum: its creation
};

class PreMulSums {
 public:
  // After NCCL created `p.op` (a later op of the same number replaces an older one).
  void note(const PreMulSum& p);
  // After NCCL destroyed `op`.
  void forget(ncclRedOp_t op);
  // Whether `op` was noted (and not forgotten since), into *out.
  bool find(ncclRedOp_t op, PreMulSum* out) const;

 private:
  mutable std::mutex mu_;
  std::vector<PreMulSum> ops_;  // a few at a time: PyTorch destroys each after its call
};

// `op` resolved: the built-in ones by value, a pre-multiplied sum noted in `sums` (null: none)
// with its scalar, anything else kOther.
ResolvedRedOp resolve_red_op(const PreMulSums* sums, ncclRedOp_t op);

}  // namespace zc
