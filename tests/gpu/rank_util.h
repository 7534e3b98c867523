// Helpers used inside a rank process: error checks that throw (the harness turns the
// exception into a failed rank with a message), communicator creation, datatype facts,
// waiting on a stream with a deadline, and what the process knows about the shim and NCCL.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "mp_harness.h"
#include "zerocta.h"

namespace zgpu {

struct RankError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& what);
void check_cuda(cudaError_t err, const char* call, const char* file, int line);
void check_nccl(ncclResult_t res, const char* call, const char* file, int line);

#define ZG_CUDA(call) ::zgpu::check_cuda((call), #call, __FILE__, __LINE__)
#define ZG_NCCL(call) ::zgpu::check_nccl((call), #call, __FILE__, __LINE__)

// How a test communicator is created.
enum class InitKind {
  kInitRank,        // ncclCommInitRank: no config at all (nccl-tests, old applications)
  kInitRankConfig,  // ncclCommInitRankConfig with NCCL_CONFIG_INITIALIZER (PyTorch)
};
ncclComm_t init_comm(const RankContext& ctx, InitKind kind, int id_index = 0);
const char* init_kind_name(InitKind kind);

size_t dtype_size(ncclDataType_t dt);
const char* dtype_name(ncclDataType_t dt);

// Seconds a single operation may take before the rank declares a hang (env
// ZCTEST_OP_TIMEOUT_S, default 60).
double op_timeout_s();

// Waits for `stream` with cudaStreamQuery polling; throws RankError naming `what` when the
// stream is not done within op_timeout_s() or reports an error.
void wait_stream(cudaStream_t stream, const std::string& what);

// Throws when the communicator has an asynchronous error.
void check_comm_async(ncclComm_t comm, const std::string& what);

// The shim's stats entry point when libzerocta.so is loaded (LD_PRELOAD), else nullptr.
using GetStatsFn = int (*)(zerocta_stats_t*);
GetStatsFn shim_get_stats();

// One line per route with all-gather counters, "" when the shim is absent.
std::string shim_allgather_stats_line();

// NCCL_VERSION_CODE of the NCCL library really loaded (pncclGetVersion bypasses the shim) and
// the file it was loaded from.
int real_nccl_version();
std::string real_nccl_path();

}  // namespace zgpu
