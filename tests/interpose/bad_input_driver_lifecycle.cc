// Bad-input driver, communicator and other non-collective steps:
//
//   init  init_dead                      make the "live" / "dead" communicators (2 ranks)
//   initrank_nullcomm  initrankconfig_nullcomm  scalable_nullcomm   NULL ncclComm_t*
//   initrank_badnranks  initrank_badrank                           nranks 0, rank 5 of 2
//   config16  config16_badmagic  config12  ncclCommInitRankConfig with a 16- or 12-byte
//                                         config that ends at an inaccessible page (NCCL
//                                         reads `size` bytes of it, nothing more)
//   initall_nullcomms  initall_baddev  initall_dupdev  initall_negndev
//   split:<comm>  split_nullout  shrink:<comm>  shrink_nullexclude
//   destroy:<comm>  finalize:<comm>  abort:<comm>  revoke:<comm>
//   asyncerror:<comm>  asyncerror_nullout  count:<comm>  count_nullout  cudevice:<comm>
//   userrank:<comm>  winreg:<comm>  winreg_nullwin  windereg_null  windereg_bogus
//   register_nullhandle  deregister_bogus  redop:<comm>  memalloc_nullptr  memfree_null
//   memfree_bogus  groupend_unmatched  group_nullcomm  errorstring_bad  lasterror:<comm>
// Steps that create communicators print "<step>.created=N" (how many non-NULL handles came
// back), so a test can tell "refused" from "half done".
#include <cstring>
#include <vector>

#include "bad_input_driver.h"
#include "driver_util.h"

namespace bad {
namespace {

constexpr int kRanks = 2;

ncclUniqueId unique_id() {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  ncclGetUniqueId(&id);
  return id;
}

// A config of `size` bytes (12: size and magic; 16: also the version) ending at the driver
// arena's guard page.
ncclConfig_t* short_config(size_t size, bool good_magic) {
  unsigned char* b = drv::guarded_block(size);
  uint64_t size_field = size;
  unsigned magic = good_magic ? 0xcafebeef : 0xdeadbeef, version = NCCL_VERSION_CODE;
  memcpy(b, &size_field, 8);
  memcpy(b + 8, &magic, 4);
  if (size >= 16) memcpy(b + 12, &version, 4);
  return reinterpret_cast<ncclConfig_t*>(b);
}

void created(const std::string& step, const ncclComm_t* c, int n) {
  int count = 0;
  for (int i = 0; i < n; ++i) count += c[i] != nullptr ? 1 : 0;
  result(step + ".created", count);
}

ncclResult_t init_all(const std::string& step, int ndev, std::vector<int> devs) {
  ncclComm_t c[4] = {};
  ncclResult_t r = ncclCommInitAll(c, ndev, devs.empty() ? nullptr : devs.data());
  created(step, c, ndev > 0 && ndev <= 4 ? ndev : 0);
  for (ncclComm_t comm : c)
    if (comm != nullptr) ncclCommDestroy(comm);
  return r;
}

// Steps with a communicator argument: "<name>:<comm>".
bool comm_step(const std::string& name, ncclComm_t comm, ncclResult_t* r) {
  int value = 0;
  ncclComm_t out = nullptr;
  if (name == "split") {
    *r = ncclCommSplit(comm, 1, 0, &out, nullptr);
  } else if (name == "shrink") {
    int exclude[1] = {1};
    *r = ncclCommShrink(comm, exclude, 1, &out, nullptr, NCCL_SHRINK_DEFAULT);
  } else if (name == "destroy") {
    *r = ncclCommDestroy(comm);
  } else if (name == "finalize") {
    *r = ncclCommFinalize(comm);
  } else if (name == "abort") {
    *r = ncclCommAbort(comm);
  } else if (name == "revoke") {
    *r = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
  } else if (name == "asyncerror") {
    ncclResult_t e = ncclSuccess;
    *r = ncclCommGetAsyncError(comm, &e);
  } else if (name == "count") {
    *r = ncclCommCount(comm, &value);
  } else if (name == "cudevice") {
    *r = ncclCommCuDevice(comm, &value);
  } else if (name == "userrank") {
    *r = ncclCommUserRank(comm, &value);
  } else if (name == "winreg") {
    ncclWindow_t win = nullptr;
    *r = ncclCommWindowRegister(comm, drv::fake_buffer(3), 4096, &win, NCCL_WIN_COLL_SYMMETRIC);
  } else if (name == "redop") {
    ncclRedOp_t op = ncclSum;
    *r = ncclRedOpCreatePreMulSum(&op, drv::arena() + 0x700, ncclFloat32, ncclScalarHostImmediate,
                                  comm);
  } else if (name == "lasterror") {
    *r = ncclGetLastError(comm) != nullptr ? ncclSuccess : ncclInternalError;
  } else {
    return false;
  }
  if (out != nullptr) ncclCommDestroy(out);
  return true;
}

}  // namespace

bool lifecycle_step(const std::string& step) {
  ncclResult_t r = ncclSuccess;
  ncclComm_t c = nullptr;
  const size_t colon = step.find(':');
  if (colon != std::string::npos && step.find(':', colon + 1) == std::string::npos) {
    ncclComm_t comm = nullptr;
    if (!comm_named(step.substr(colon + 1), &comm)) return false;
    if (!comm_step(step.substr(0, colon), comm, &r)) return false;
  } else if (step == "init") {
    r = ncclCommInitRank(&comms().live, kRanks, unique_id(), 0);
  } else if (step == "init_dead") {
    r = ncclCommInitRank(&comms().dead, kRanks, unique_id(), 0);
    if (r == ncclSuccess) r = ncclCommDestroy(comms().dead);  // the handle now dangles
  } else if (step == "initrank_nullcomm") {
    r = ncclCommInitRank(nullptr, kRanks, unique_id(), 0);
  } else if (step == "initrankconfig_nullcomm") {
    r = ncclCommInitRankConfig(nullptr, kRanks, unique_id(), 0, nullptr);
  } else if (step == "scalable_nullcomm") {
    ncclUniqueId id = unique_id();
    r = ncclCommInitRankScalable(nullptr, kRanks, 0, 1, &id, nullptr);
  } else if (step == "initrank_badnranks") {
    r = ncclCommInitRank(&c, 0, unique_id(), 0);
    created(step, &c, 1);
  } else if (step == "initrank_badrank") {
    r = ncclCommInitRank(&c, kRanks, unique_id(), 5);
    created(step, &c, 1);
  } else if (step == "config16" || step == "config16_badmagic" || step == "config12") {
    ncclConfig_t* config = short_config(step == "config12" ? 12 : 16, step != "config16_badmagic");
    r = ncclCommInitRankConfig(&c, kRanks, unique_id(), 0, config);
    created(step, &c, 1);
  } else if (step == "initall_nullcomms") {
    r = ncclCommInitAll(nullptr, kRanks, nullptr);
  } else if (step == "initall_baddev") {
    r = init_all(step, 2, {0, 99});
  } else if (step == "initall_dupdev") {
    r = init_all(step, 2, {1, 1});
  } else if (step == "initall_negndev") {
    r = init_all(step, -1, {});
  } else if (step == "split_nullout") {
    r = ncclCommSplit(comms().live, 1, 0, nullptr, nullptr);
  } else if (step == "shrink_nullexclude") {
    r = ncclCommShrink(comms().live, nullptr, 1, &c, nullptr, NCCL_SHRINK_DEFAULT);
  } else if (step == "asyncerror_nullout") {
    r = ncclCommGetAsyncError(comms().live, nullptr);
  } else if (step == "count_nullout") {
    r = ncclCommCount(comms().live, nullptr);
  } else if (step == "winreg_nullwin") {
    r = ncclCommWindowRegister(comms().live, drv::fake_buffer(3), 4096, nullptr,
                               NCCL_WIN_COLL_SYMMETRIC);
  } else if (step == "windereg_null") {
    r = ncclCommWindowDeregister(comms().live, nullptr);
  } else if (step == "windereg_bogus") {
    r = ncclCommWindowDeregister(comms().live, reinterpret_cast<ncclWindow_t>(uintptr_t{0x1234}));
  } else if (step == "register_nullhandle") {
    r = ncclCommRegister(comms().live, drv::fake_buffer(4), 4096, nullptr);
  } else if (step == "deregister_bogus") {
    r = ncclCommDeregister(comms().live, reinterpret_cast<void*>(uintptr_t{0x1234}));
  } else if (step == "memalloc_nullptr") {
    r = ncclMemAlloc(nullptr, 4096);
  } else if (step == "memfree_null") {
    r = ncclMemFree(nullptr);
  } else if (step == "memfree_bogus") {
    r = ncclMemFree(reinterpret_cast<void*>(uintptr_t{0x1234}));
  } else if (step == "groupend_unmatched") {
    r = ncclGroupEnd();
  } else if (step == "group_nullcomm") {
    // A bad all-gather inside a group: NCCL answers at the call; the group still ends.
    ncclResult_t start = ncclGroupStart();
    ncclResult_t in = ncclAllGather(drv::fake_buffer(1), drv::fake_buffer(2), 8, ncclFloat32,
                                    nullptr, static_cast<cudaStream_t>(drv::fake_stream(1)));
    result(step + ".start", start);
    result(step + ".call", in);
    r = ncclGroupEnd();
  } else if (step == "errorstring_bad") {
    const char* s = ncclGetErrorString(static_cast<ncclResult_t>(99));
    drv::out(step + ".text", s != nullptr ? s : "(null)");
  } else {
    return false;
  }
  if (c != nullptr) ncclCommDestroy(c);
  result(step, r);
  return true;
}

}  // namespace bad
