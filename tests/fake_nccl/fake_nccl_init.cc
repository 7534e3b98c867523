// Fake NCCL: versions, ids, communicator creation and the communicator queries.
// Init functions log the config bytes they received and the current CUDA device (read from
// the fake driver), which is what the interposition tests inspect. Deferral inside groups,
// non-blocking progress and the rendezvous of the ranks are in fake_nccl_state.cc.
#include <cstdlib>
#include <cstring>

#include "fake_nccl_internal.h"

using fake::finish;
using fake::name_of;
using fake::strf;

namespace {

// Creates the fake comm for an init call that received `config` and logs the call.
ncclResult_t init_common(const char* fn, const std::string& args, ncclComm_t* out, int nranks,
                         int rank, const ncclConfig_t* config, const ncclUniqueId* id) {
  int device = fake::current_device();
  std::string line =
      std::string(fn) + " " + args + strf(" device=%d ", device) + fake::describe_config(config);
  if (fake::should_fail(fn)) return finish(line, ncclInternalError);
  if (out == nullptr || nranks < 1 || rank < 0 || rank >= nranks)
    return finish(line, ncclInvalidArgument);
  if (config != nullptr && !fake::config_magic_ok(config)) return finish(line, ncclInvalidArgument);
  return fake::create_root(line, out, nranks, rank, device, config, id);
}

int version_code() {
  const char* env = getenv("FAKE_NCCL_VERSION");
  return env ? atoi(env) : 22809;
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
  if (fake::should_fail("ncclGetVersion")) return finish("ncclGetVersion", ncclInternalError);
  if (version == nullptr) return finish("ncclGetVersion", ncclInvalidArgument);
  *version = version_code();
  fake::log_line(strf("ncclGetVersion -> 0 version=%d", *version));
  return ncclSuccess;
}
FAKE_PNCCL_ALIAS(ncclGetVersion)

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (fake::should_fail("ncclGetUniqueId")) return finish("ncclGetUniqueId", ncclInternalError);
  if (uniqueId == nullptr) return finish("ncclGetUniqueId", ncclInvalidArgument);
  fake::fill_unique_id(uniqueId);
  fake::log_line("ncclGetUniqueId -> 0 id=" + fake::describe_id(*uniqueId));
  return ncclSuccess;
}
FAKE_PNCCL_ALIAS(ncclGetUniqueId)

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  return init_common("ncclCommInitRankConfig",
                     strf("nranks=%d rank=%d id=", nranks, rank) + fake::describe_id(commId), comm,
                     nranks, rank, config, &commId);
}
FAKE_PNCCL_ALIAS(ncclCommInitRankConfig)

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return init_common("ncclCommInitRank",
                     strf("nranks=%d rank=%d id=", nranks, rank) + fake::describe_id(commId), comm,
                     nranks, rank, nullptr, &commId);
}
FAKE_PNCCL_ALIAS(ncclCommInitRank)

ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config) {
  std::string ids = "[";
  for (int i = 0; commIds != nullptr && i < nId; ++i)
    ids += (i ? "," : "") + fake::describe_id(commIds[i]);
  ids += "]";
  return init_common("ncclCommInitRankScalable",
                     strf("nranks=%d rank=%d nId=%d ids=", nranks, myrank, nId) + ids, newcomm,
                     nranks, myrank, config, commIds != nullptr && nId > 0 ? &commIds[0] : nullptr);
}
FAKE_PNCCL_ALIAS(ncclCommInitRankScalable)

ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  std::string line = strf("ncclCommInitAll ndev=%d devlist=", ndev) + fake::int_list(devlist, ndev);
  if (fake::should_fail("ncclCommInitAll")) return finish(line, ncclInternalError);
  if (comm == nullptr || ndev < 1) return finish(line, ncclInvalidArgument);
  // NCCL validates the whole device list before creating anything.
  if (ncclResult_t bad = fake::check_device_list(ndev, devlist)) return finish(line, bad);
  std::string names;
  for (int i = 0; i < ndev; ++i) {
    comm[i] =
        reinterpret_cast<ncclComm_t>(fake::new_comm(ndev, i, devlist ? devlist[i] : i, nullptr));
    names += (i ? "," : "") + name_of(comm[i]);
  }
  std::vector<fake::Comm*> made;
  for (int i = 0; i < ndev; ++i) made.push_back(fake::find_comm(comm[i]));
  fake::key_local_comms(made.data(), ndev);
  fake::log_line(line + " -> 0 comms=[" + names + "]");
  return ncclSuccess;
}
FAKE_PNCCL_ALIAS(ncclCommInitAll)

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  std::string line = "ncclCommSplit comm=" + name_of(comm) + strf(" color=%d key=%d ", color, key) +
                     fake::describe_config(config);
  if (fake::should_fail("ncclCommSplit")) return finish(line, ncclInternalError);
  fake::Comm* parent = fake::find_comm(comm);
  if (parent == nullptr || newcomm == nullptr) return finish(line, ncclInvalidArgument);
  if (config != nullptr && !fake::config_magic_ok(config)) return finish(line, ncclInvalidArgument);
  // NULL config: the child inherits the parent's configuration, as in NCCL.
  const ncclConfig_t* inherited =
      config
          ? config
          : (parent->config.empty() ? nullptr
                                    : reinterpret_cast<const ncclConfig_t*>(parent->config.data()));
  // NCCL_SPLIT_NOCOLOR: *newcomm = NULL, no communicator.
  return fake::create_child(line, parent, /*shrink=*/false, color, key, nullptr, 0, newcomm,
                            inherited);
}
FAKE_PNCCL_ALIAS(ncclCommSplit)

#ifndef FAKE_NCCL_OLD_API
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  std::string line = "ncclCommShrink comm=" + name_of(comm) +
                     " exclude=" + fake::int_list(excludeRanksList, excludeRanksCount) +
                     strf(" count=%d flags=%d ", excludeRanksCount, shrinkFlags) +
                     fake::describe_config(config);
  if (fake::should_fail("ncclCommShrink")) return finish(line, ncclInternalError);
  fake::Comm* parent = fake::find_comm(comm);
  if (parent == nullptr || newcomm == nullptr || excludeRanksCount < 0 ||
      excludeRanksCount >= parent->nranks)
    return finish(line, ncclInvalidArgument);
  if (config != nullptr && !fake::config_magic_ok(config)) return finish(line, ncclInvalidArgument);
  const ncclConfig_t* inherited =
      config
          ? config
          : (parent->config.empty() ? nullptr
                                    : reinterpret_cast<const ncclConfig_t*>(parent->config.data()));
  return fake::create_child(line, parent, /*shrink=*/true, 0, 0, excludeRanksList,
                            excludeRanksCount, newcomm, inherited);
}
FAKE_PNCCL_ALIAS(ncclCommShrink)
#endif

namespace {

// Finalize/Destroy/Abort/Revoke share this shape: validate the comm, log, maybe free it.
// `wait_ready`: Finalize and Destroy refuse a comm still in progress (ncclCommEnsureReady);
// Abort and Revoke do not wait.
ncclResult_t comm_lifecycle(const char* fn, ncclComm_t comm, const std::string& extra, bool free_it,
                            bool wait_ready) {
  std::string line = std::string(fn) + " comm=" + name_of(comm) + extra;
  if (fake::should_fail(fn)) return finish(line, ncclInternalError);
  // NCCL 2.28's ncclCommDestroy and ncclCommAbort accept NULL as a no-op.
  if (comm == nullptr && free_it && fake::check_args_enabled()) return finish(line, ncclSuccess);
  fake::Comm* c = fake::find_comm(comm);
  if (c == nullptr) return finish(line, ncclInvalidArgument);
  if (wait_ready && c->state.load() == fake::State::kInProgress)
    return finish(line, ncclInvalidArgument);
  if (free_it) fake::before_free(c);  // its fake NCCL thread ends first
  finish(line, ncclSuccess);
  if (free_it) fake::delete_comm(comm);
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm_lifecycle("ncclCommFinalize", comm, "", false, true);
}
FAKE_PNCCL_ALIAS(ncclCommFinalize)

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return comm_lifecycle("ncclCommDestroy", comm, "", true, true);
}
FAKE_PNCCL_ALIAS(ncclCommDestroy)

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return comm_lifecycle("ncclCommAbort", comm, "", true, false);
}
FAKE_PNCCL_ALIAS(ncclCommAbort)

ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  return comm_lifecycle("ncclCommRevoke", comm, strf(" flags=%d", revokeFlags), false, false);
}
FAKE_PNCCL_ALIAS(ncclCommRevoke)

// NCCL 2.29.7's memory suspend and resume (the 2.28 header lacks them): a ready communicator's
// memory "released" and "restored", logged. The old fake lacks them, as NCCL before 2.29.7 does.
#ifndef FAKE_NCCL_OLD_API
extern "C" __attribute__((visibility("default"))) ncclResult_t ncclCommSuspend(ncclComm_t comm,
                                                                          int flags) {
  return comm_lifecycle("ncclCommSuspend", comm, strf(" flags=%d", flags), false, true);
}
FAKE_PNCCL_ALIAS(ncclCommSuspend)

extern "C" __attribute__((visibility("default"))) ncclResult_t ncclCommResume(ncclComm_t comm) {
  return comm_lifecycle("ncclCommResume", comm, "", false, true);
}
FAKE_PNCCL_ALIAS(ncclCommResume)
#endif

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  std::string line = "ncclCommGetAsyncError comm=" + name_of(comm);
  if (fake::should_fail("ncclCommGetAsyncError")) return finish(line, ncclInternalError);
  fake::Comm* c = fake::find_comm(comm);
  if (c == nullptr || asyncError == nullptr) return finish(line, ncclInvalidArgument);
  std::string extra;
  *asyncError = fake::poll_async(c, &extra);
  fake::log_line(line + strf(" -> 0 asyncError=%d", static_cast<int>(*asyncError)) + extra);
  return ncclSuccess;
}
FAKE_PNCCL_ALIAS(ncclCommGetAsyncError)

namespace {

// Count/CuDevice/UserRank: one int answered from the fake comm (0 while its init is deferred
// to a group end; an error while it is in progress or failed).
ncclResult_t comm_query(const char* fn, ncclComm_t comm, int* out, int fake::Comm::*field) {
  std::string line = std::string(fn) + " comm=" + name_of(comm);
  if (fake::should_fail(fn)) return finish(line, ncclInternalError);
  fake::Comm* c = fake::find_comm(comm);
  if (c == nullptr || out == nullptr) return finish(line, ncclInvalidArgument);
  int value = 0;
  if (ncclResult_t r = fake::query_value(c, field, &value)) return finish(line, r);
  *out = value;
  fake::log_line(line + strf(" -> 0 value=%d", *out));
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return comm_query("ncclCommCount", comm, count, &fake::Comm::nranks);
}
FAKE_PNCCL_ALIAS(ncclCommCount)

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return comm_query("ncclCommCuDevice", comm, device, &fake::Comm::device);
}
FAKE_PNCCL_ALIAS(ncclCommCuDevice)

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return comm_query("ncclCommUserRank", comm, rank, &fake::Comm::rank);
}
FAKE_PNCCL_ALIAS(ncclCommUserRank)

const char* ncclGetErrorString(ncclResult_t result) {
  static const char* const kNames[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  fake::log_line(strf("ncclGetErrorString result=%d", static_cast<int>(result)));
  auto r = static_cast<unsigned>(result);
  return r < sizeof(kNames) / sizeof(kNames[0]) ? kNames[r] : "unknown result code";
}
FAKE_PNCCL_ALIAS(ncclGetErrorString)

const char* ncclGetLastError(ncclComm_t comm) {
  fake::log_line("ncclGetLastError comm=" + name_of(comm));
  return "fake nccl: no error";
}
FAKE_PNCCL_ALIAS(ncclGetLastError)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void ncclResetDebugInit() { fake::log_line("ncclResetDebugInit"); }
FAKE_PNCCL_ALIAS(ncclResetDebugInit)
#pragma GCC diagnostic pop
