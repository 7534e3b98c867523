// Calls every function of nccl.h once with distinctive arguments and prints each result
// ("<function>=<ncclResult_t>"). The test compares the fake NCCL's log of this program with
// and without the shim.
#include <nccl.h>

#include <climits>

#include "driver_util.h"

namespace {

int g_failures = 0;

void report(const char* fn, ncclResult_t r) {
  drv::out(fn, r);
  if (r != ncclSuccess) ++g_failures;
}

// A 2.28 config with every field set to something recognisable.
ncclConfig_t* make_config(unsigned char* where, int cta) {
  auto* c = reinterpret_cast<ncclConfig_t*>(where);
  *c = NCCL_CONFIG_INITIALIZER;
  c->blocking = 1;
  c->cgaClusterSize = 2;
  c->maxCTAs = 17;
  c->commName = reinterpret_cast<const char*>(drv::arena() + 0x800);
  c->CTAPolicy = cta;
  return c;
}

}  // namespace

int main() {
  unsigned char* arena = drv::arena();
  strcpy(reinterpret_cast<char*>(arena + 0x800), "every_call");
  cudaStream_t s1 = static_cast<cudaStream_t>(drv::fake_stream(1));
  cudaStream_t s2 = static_cast<cudaStream_t>(drv::fake_stream(2));

  int version = 0;
  report("ncclGetVersion", ncclGetVersion(&version));
  drv::out("version", version);
  ncclUniqueId id;
  report("ncclGetUniqueId", ncclGetUniqueId(&id));
  drv::out("ncclGetErrorString", ncclGetErrorString(ncclInvalidUsage));

  ncclComm_t c1 = nullptr, c2 = nullptr, c3 = nullptr, all[3] = {};
  report("ncclCommInitRank", ncclCommInitRank(&c1, 4, id, 1));
  report("ncclCommInitRankConfig",
         ncclCommInitRankConfig(&c2, 8, id, 3, make_config(arena + 0x100, INT_MIN)));
  auto* ids = reinterpret_cast<ncclUniqueId*>(arena + 0x200);
  ids[0] = id;
  report("ncclGetUniqueId", ncclGetUniqueId(&ids[1]));
  report("ncclCommInitRankScalable",
         ncclCommInitRankScalable(&c3, 6, 5, 2, ids, make_config(arena + 0x400, 1)));
  auto* devlist = reinterpret_cast<int*>(arena + 0x600);
  devlist[0] = 2, devlist[1] = 0, devlist[2] = 1;
  report("ncclCommInitAll", ncclCommInitAll(all, 3, devlist));

  int value = 0;
  report("ncclCommCount", ncclCommCount(c1, &value));
  report("ncclCommCuDevice", ncclCommCuDevice(c1, &value));
  report("ncclCommUserRank", ncclCommUserRank(c2, &value));
  ncclResult_t async = ncclInProgress;
  report("ncclCommGetAsyncError", ncclCommGetAsyncError(c1, &async));
  drv::out("ncclGetLastError", ncclGetLastError(c1));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ncclResetDebugInit();
#pragma GCC diagnostic pop

  void* mem = nullptr;
  report("ncclMemAlloc", ncclMemAlloc(&mem, 12345));
  void* handle = nullptr;
  report("ncclCommRegister", ncclCommRegister(c1, drv::fake_buffer(1), 4096, &handle));
  report("ncclCommDeregister", ncclCommDeregister(c1, handle));
  ncclWindow_t win = nullptr;
  report("ncclCommWindowRegister",
         ncclCommWindowRegister(c1, drv::fake_buffer(2), 8192, &win, NCCL_WIN_COLL_SYMMETRIC));
  report("ncclCommWindowDeregister", ncclCommWindowDeregister(c1, win));
  report("ncclMemFree", ncclMemFree(mem));

  ncclRedOp_t op = ncclSum;
  report("ncclRedOpCreatePreMulSum",
         ncclRedOpCreatePreMulSum(&op, arena + 0x700, ncclFloat64, ncclScalarHostImmediate, c1));

  report("ncclReduce",
         ncclReduce(drv::fake_buffer(3), drv::fake_buffer(4), 301, ncclInt8, op, 2, c1, s1));
  report("ncclRedOpDestroy", ncclRedOpDestroy(op, c1));
  report("ncclBcast", ncclBcast(drv::fake_buffer(5), 302, ncclUint8, 3, c1, s2));
  report("ncclBroadcast",
         ncclBroadcast(drv::fake_buffer(6), drv::fake_buffer(7), 303, ncclInt32, 1, c2, s1));
  report("ncclAllReduce",
         ncclAllReduce(drv::fake_buffer(8), drv::fake_buffer(9), 304, ncclUint32, ncclMax, c1, s2));
  report("ncclReduceScatter", ncclReduceScatter(drv::fake_buffer(10), drv::fake_buffer(11), 305,
                                                ncclInt64, ncclMin, c2, s1));
  report("ncclAllGather",
         ncclAllGather(drv::fake_buffer(12), drv::fake_buffer(13), 306, ncclBfloat16, c1, s1));
  report("ncclAllGather",
         ncclAllGather(drv::fake_buffer(12), drv::fake_buffer(13), 1 << 26, ncclFloat32, c2, s2));
  report("ncclAlltoAll",
         ncclAlltoAll(drv::fake_buffer(14), drv::fake_buffer(15), 307, ncclFloat16, c1, s2));
  report("ncclGather",
         ncclGather(drv::fake_buffer(16), drv::fake_buffer(17), 308, ncclFloat8e4m3, 0, c1, s1));
  report("ncclScatter",
         ncclScatter(drv::fake_buffer(18), drv::fake_buffer(19), 309, ncclFloat8e5m2, 3, c2, s2));
  report("ncclGroupStart", ncclGroupStart());
  report("ncclSend", ncclSend(drv::fake_buffer(20), 310, ncclDouble, 2, c1, s1));
  report("ncclRecv", ncclRecv(drv::fake_buffer(21), 311, ncclUint64, 3, c1, s1));
  report("ncclGroupEnd", ncclGroupEnd());
  report("ncclGroupStart", ncclGroupStart());
  auto* sim = reinterpret_cast<ncclSimInfo_t*>(arena + 0x780);
  *sim = NCCL_SIM_INFO_INITIALIZER;
  report("ncclAllReduce", ncclAllReduce(drv::fake_buffer(22), drv::fake_buffer(22), 312,
                                        ncclFloat32, ncclAvg, c2, s2));
  report("ncclGroupSimulateEnd", ncclGroupSimulateEnd(sim));

  ncclComm_t split = nullptr, nocolor = nullptr, shrunk = nullptr;
  report("ncclCommSplit", ncclCommSplit(c1, 7, 9, &split, make_config(arena + 0x900, INT_MIN)));
  report("ncclCommSplit", ncclCommSplit(c2, NCCL_SPLIT_NOCOLOR, 1, &nocolor, nullptr));
  auto* exclude = reinterpret_cast<int*>(arena + 0xa00);
  exclude[0] = 2;
  report("ncclCommShrink", ncclCommShrink(c2, exclude, 1, &shrunk, nullptr, NCCL_SHRINK_ABORT));
  report("ncclCommRevoke", ncclCommRevoke(c3, NCCL_REVOKE_DEFAULT));
  report("ncclCommFinalize", ncclCommFinalize(c1));
  report("ncclCommDestroy", ncclCommDestroy(c1));
  report("ncclCommAbort", ncclCommAbort(c3));
  for (ncclComm_t c : {c2, split, shrunk, all[0], all[1], all[2]})
    report("ncclCommDestroy", ncclCommDestroy(c));
  drv::out("nocolor_is_null", nocolor == nullptr ? 1 : 0);
  drv::out("failures", g_failures);
  return g_failures == 0 ? 0 : 1;
}
