// A diagnostic build's account of the CUDA driver calls zerocta makes (cmake
// -DZEROCTA_DRIVER_CALL_TIMES=ON): every driver function an all-gather may call is replaced by
// one that counts its calls and host time, and the totals go to stderr when the process exits.
// It answers where an op's host time goes on a real driver, which the fake driver of the CPU
// suite cannot say; a release build has none of it.
#include "driver_call_times.h"

#ifdef ZC_DRIVER_CALL_TIMES
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "monotonic_clock.h"

namespace zc {
namespace {

struct CallTimes {
  const char* name = nullptr;
  std::atomic<uint64_t> calls{0}, nanos{0};
};

std::vector<CallTimes*>& all_times() {
  static auto* v = new std::vector<CallTimes*>;
  return *v;
}

template <auto Member>
struct Timed;

template <typename R, typename... A, R (*CudaDriver::*Member)(A...)>
struct Timed<Member> {
  static inline R (*real)(A...) = nullptr;
  static inline CallTimes times;
  static R call(A... a) {
    const uint64_t t0 = monotonic_ns();
    R r = real(a...);
    times.nanos.fetch_add(monotonic_ns() - t0, std::memory_order_relaxed);
    times.calls.fetch_add(1, std::memory_order_relaxed);
    return r;
  }
  static void install(CudaDriver* d, const char* name) {
    if (!(d->*Member)) return;
    real = d->*Member;
    times.name = name;
    all_times().push_back(&times);
    d->*Member = &call;
  }
};

void report() {
  for (const CallTimes* t : all_times()) {
    const uint64_t n = t->calls.load();
    if (n == 0) continue;
    fprintf(stderr, "zerocta driver-call-times pid=%d %s calls=%llu total_us=%.0f mean_us=%.2f\n",
            static_cast<int>(getpid()), t->name, static_cast<unsigned long long>(n),
            static_cast<double>(t->nanos.load()) / 1e3,
            static_cast<double>(t->nanos.load()) / 1e3 / static_cast<double>(n));
  }
}

}  // namespace

uint64_t driver_calls(const char* name) {
  for (const CallTimes* t : all_times())
    if (strcmp(t->name, name) == 0) return t->calls.load();
  return 0;
}

#define ZC_TIME(name) Timed<&CudaDriver::name>::install(d, #name)

void time_driver_calls(CudaDriver* d) {
  ZC_TIME(cuCtxGetCurrent);
  ZC_TIME(cuCtxSetCurrent);
  ZC_TIME(cuCtxGetDevice);
  ZC_TIME(cuStreamQuery);
  ZC_TIME(cuStreamIsCapturing);
  ZC_TIME(cuStreamWaitEvent);
  ZC_TIME(cuEventRecord);
  ZC_TIME(cuEventQuery);
  ZC_TIME(cuMemcpyAsync);
  ZC_TIME(cuStreamBatchMemOp);
  ZC_TIME(cuMemMap);
  ZC_TIME(cuMemUnmap);
  ZC_TIME(cuMemSetAccess);
  ZC_TIME(cuMemAddressReserve);
  ZC_TIME(cuMemAddressFree);
  ZC_TIME(cuMemRelease);
  ZC_TIME(cuMemExportToShareableHandle);
  ZC_TIME(cuMemImportFromShareableHandle);
  ZC_TIME(cuMemRetainAllocationHandle);
  ZC_TIME(cuPointerGetAttribute);
  ZC_TIME(cuMemGetAccess);
  ZC_TIME(cuStreamGetCaptureInfo);
  ZC_TIME(cuThreadExchangeStreamCaptureMode);
  atexit(report);
}

}  // namespace zc
#endif
