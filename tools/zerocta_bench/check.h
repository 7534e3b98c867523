// The #wrong column: counts mismatching elements on the device and brings one number back.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>

#include "reduce_pattern.h"
#include "rs_kernels.h"

namespace zcb {

// The value the output is poisoned with before a checked operation: any element the operation
// fails to write stays 0xA5.. and is counted wrong (a random pattern byte equals 0xA5 only by
// chance, so an unwritten chunk is always caught).
constexpr int kPoisonByte = 0xA5;

class WrongCounter {
 public:
  WrongCounter();  // on the current device
  ~WrongCounter();
  WrongCounter(const WrongCounter&) = delete;
  WrongCounter& operator=(const WrongCounter&) = delete;

  // Counts wrong elements of recv (see launch_count_wrong); synchronizes stream.
  int64_t count(const void* recv, size_t chunk_bytes, int nchunks, int elem_bytes, uint64_t seed,
                int skip_chunk, cudaStream_t stream);
  // Counts elements of a reduction's output that differ from the exact sum (see
  // launch_count_wrong_sum); synchronizes stream.
  int64_t count_sum(const void* out, uint64_t n, uint64_t base, int nranks, ncclDataType_t type,
                    const ReducePattern& p, cudaStream_t stream);
  // A reduce-scatter's output (launch_check_rs): the elements whose bits differ from the
  // expected ones, and in *maxdiff the largest |output - float64 reference|; synchronizes stream.
  int64_t count_rs(const RsCheck& c, double* maxdiff, cudaStream_t stream);

 private:
  int64_t collect(cudaStream_t stream);  // launches done: copy the count back, synchronize
  unsigned long long* d_wrong_ = nullptr;
  unsigned long long* h_wrong_ = nullptr;
  unsigned long long* d_maxdiff_ = nullptr;  // the bits of a non-negative double
  unsigned long long* h_maxdiff_ = nullptr;
};

}  // namespace zcb
