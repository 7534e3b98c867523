#include "rank_util.h"

#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>

namespace zgpu {

void fail(const std::string& what) { throw RankError(what); }

void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  std::ostringstream s;
  s << file << ":" << line << ": " << call << " -> " << cudaGetErrorName(err) << " ("
    << cudaGetErrorString(err) << ")";
  fail(s.str());
}

void check_nccl(ncclResult_t res, const char* call, const char* file, int line) {
  if (res == ncclSuccess) return;
  std::ostringstream s;
  s << file << ":" << line << ": " << call << " -> ncclResult " << static_cast<int>(res) << " ("
    << ncclGetErrorString(res) << "); last error: " << ncclGetLastError(nullptr);
  fail(s.str());
}

const char* init_kind_name(InitKind kind) {
  return kind == InitKind::kInitRank ? "InitRank" : "InitRankConfig";
}

ncclComm_t init_comm(const RankContext& ctx, InitKind kind, int id_index) {
  ncclComm_t comm = nullptr;
  const ncclUniqueId& id = ctx.ids.at(static_cast<size_t>(id_index));
  if (kind == InitKind::kInitRank) {
    ZG_NCCL(ncclCommInitRank(&comm, ctx.nranks, id, ctx.rank));
  } else {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ZG_NCCL(ncclCommInitRankConfig(&comm, ctx.nranks, id, ctx.rank, &config));
  }
  if (comm == nullptr) fail("communicator init returned success and a NULL communicator");
  return comm;
}

size_t dtype_size(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      fail("unknown datatype " + std::to_string(static_cast<int>(dt)));
  }
}

const char* dtype_name(ncclDataType_t dt) {
  switch (dt) {
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclInt32:
      return "int32";
    case ncclUint32:
      return "uint32";
    case ncclInt64:
      return "int64";
    case ncclUint64:
      return "uint64";
    case ncclFloat16:
      return "float16";
    case ncclFloat32:
      return "float32";
    case ncclFloat64:
      return "float64";
    case ncclBfloat16:
      return "bfloat16";
    case ncclFloat8e4m3:
      return "float8e4m3";
    case ncclFloat8e5m2:
      return "float8e5m2";
    default:
      return "unknown";
  }
}

double op_timeout_s() {
  static const double seconds = static_cast<double>(env_long("ZCTEST_OP_TIMEOUT_S", 60));
  return seconds;
}

void wait_stream(cudaStream_t stream, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<long>(op_timeout_s() * 1000));
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    cudaError_t err = cudaStreamQuery(stream);
    if (err == cudaSuccess) return;
    if (err != cudaErrorNotReady) {
      fail(what + ": stream reported " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
           ")");
    }
    if (Clock::now() >= deadline) {
      fail(what + ": not complete after " + std::to_string(op_timeout_s()) + " s (hang)");
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(2)) pause *= 2;
  }
}

void check_comm_async(ncclComm_t comm, const std::string& what) {
  ncclResult_t async = ncclSuccess;
  ZG_NCCL(ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) {
    fail(what + ": communicator async error " + std::to_string(static_cast<int>(async)) + " (" +
         ncclGetErrorString(async) + ")");
  }
}

GetStatsFn shim_get_stats() {
  return reinterpret_cast<GetStatsFn>(dlsym(RTLD_DEFAULT, "zerocta_get_stats"));
}

std::string shim_allgather_stats_line() {
  GetStatsFn get = shim_get_stats();
  if (get == nullptr) return "";
  zerocta_stats_t stats{};
  if (get(&stats) != 0) return "zerocta_get_stats failed";
  using RouteNameFn = const char* (*)(zerocta_route_t);
  auto route_name = reinterpret_cast<RouteNameFn>(dlsym(RTLD_DEFAULT, "zerocta_route_name"));
  std::ostringstream s;
  s << "allgather";
  for (int r = 0; r < zerocta_route_count; ++r) {
    const zerocta_counter_t& c = stats.counters[zerocta_op_allgather][r];
    const char* name = route_name ? route_name(static_cast<zerocta_route_t>(r)) : nullptr;
    s << " " << (name ? name : ("route" + std::to_string(r)).c_str()) << "=" << c.calls << "/"
      << c.bytes << "B";
  }
  s << " comms_created=" << stats.comms_created << " comms_zero_policy=" << stats.comms_zero_policy
    << " comms_ce_ready=" << stats.comms_ce_ready;
  return s.str();
}

int real_nccl_version() {
  int version = 0;
  if (pncclGetVersion(&version) != ncclSuccess) return -1;
  return version;
}

std::string real_nccl_path() {
  // Looked up by name: the address of pncclGetVersion taken in this file could be a PLT stub
  // of the executable, which dladdr would attribute to the executable.
  void* sym = dlsym(RTLD_DEFAULT, "pncclGetVersion");
  Dl_info info{};
  if (sym == nullptr || dladdr(sym, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  char resolved[4096];
  if (realpath(info.dli_fname, resolved) != nullptr) return resolved;
  return info.dli_fname;
}

}  // namespace zgpu
