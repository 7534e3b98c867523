// A fake CUDA driver (libcuda.so.1) for CPU-only tests.
//
// This file: what a shim needs to save, switch and restore the current device: cuInit,
// cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, the primary-context and current-context
// calls (a per-thread context stack; cuCtxGetDevice reports the device of its top).
// Contexts are fake pointers (void*)(0x1000 + device), so a test can read the device straight
// from a logged context; cuCtxCreate makes (void*)(0x2000 + device) (one more context per
// device, made current), and cuMemGetInfo answers 80 GiB free of 80 GiB. Each call logs "cuda <name> ...". FAKE_CUDA_DEVICES (default 4) is
// the device count; FAKE_CUDA_ISOLATED=K makes the process see one device, the host's device K
// (as CUDA_VISIBLE_DEVICES=K does: ordinal 0, with device K's UUID).
//
// cuGetProcAddress_v2 hands out exactly those by default; for every other name it answers
// CUDA_ERROR_NOT_FOUND, which is how a shim learns that the copy-engine path cannot be used
// here. With FAKE_CUDA_CE=1 it also hands out the copy-engine API of fake_cuda_mem.cc (memory
// shared across processes through memfds, streams, events, copies run at once; its header
// lists every knob: FAKE_CUDA_GRANULARITY, FAKE_CUDA_WAIT_MS, FAKE_CUDA_UUID_SEED,
// FAKE_CUDA_NO_P2P, FAKE_CUDA_DELAY), the stream capture, graphs and user objects of
// fake_cuda_graph.cc (FAKE_CUDA_CAPTURING, FAKE_CUDA_INVALIDATE_CAPTURE), and the modules and
// kernel launches of fake_cuda_kernel.cc (the library's reduction kernels). FAKE_CUDA_FAIL=<name>
// [,<name>] makes those entry points fail (the ones of this file answer CUDA_ERROR_UNKNOWN);
// every entry point refuses a call from a user object's destructor (fake_cuda_graph.cc).
#include <cuda.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "fake_cuda_internal.h"
#include "fake_log.h"

namespace {

constexpr uintptr_t kCtxBase = 0x1000;
constexpr uintptr_t kCreatedCtxBase = 0x2000;
constexpr int kMaxDevices = 64;

std::atomic<bool> g_initialized{false};
std::mutex g_retain_mu;
int g_retain_count[kMaxDevices];

// The per-thread context stack; its top is the current context, as in the real driver.
thread_local std::vector<CUcontext> t_stack;

int device_count() {
  if (getenv("FAKE_CUDA_ISOLATED")) return 1;  // one GPU visible, as CUDA_VISIBLE_DEVICES=K
  const char* env = getenv("FAKE_CUDA_DEVICES");
  int n = env ? atoi(env) : 4;
  if (n < 0) n = 0;
  return n > kMaxDevices ? kMaxDevices : n;
}

CUcontext ctx_of(int dev) { return reinterpret_cast<CUcontext>(kCtxBase + dev); }

// -1 for a pointer that is not one of our contexts.
int device_of(CUcontext ctx) {
  auto v = reinterpret_cast<uintptr_t>(ctx);
  if (v >= kCreatedCtxBase) v -= kCreatedCtxBase - kCtxBase;
  if (v < kCtxBase || v >= kCtxBase + static_cast<uintptr_t>(device_count())) return -1;
  return static_cast<int>(v - kCtxBase);
}

CUcontext current() { return t_stack.empty() ? nullptr : t_stack.back(); }

CUresult done(const std::string& what, CUresult r) {
  fake::log_line("cuda " + what + fake::strf(" -> %d", static_cast<int>(r)));
  return r;
}

bool ce_enabled() {
  const char* v = getenv("FAKE_CUDA_CE");
  return v != nullptr && strcmp(v, "1") == 0;
}

}  // namespace

FAKE_HIDDEN int fake_cuda_current_device() { return device_of(current()); }
FAKE_HIDDEN int fake_cuda_device_count() { return device_count(); }
FAKE_HIDDEN bool fake_cuda_initialized() { return g_initialized.load(); }

extern "C" {

CUresult cuInit(unsigned int flags) {
  FAKE_CUDA_ENTRY("cuInit", fake::strf("cuInit flags=%u", flags), CUDA_ERROR_UNKNOWN);
  g_initialized = true;
  return done(fake::strf("cuInit flags=%u", flags), CUDA_SUCCESS);
}

CUresult cuDriverGetVersion(int* version) {
  FAKE_CUDA_ENTRY("cuDriverGetVersion", "cuDriverGetVersion", CUDA_ERROR_UNKNOWN);
  if (version == nullptr) return done("cuDriverGetVersion", CUDA_ERROR_INVALID_VALUE);
  *version = 13000;
  return done("cuDriverGetVersion version=13000", CUDA_SUCCESS);
}

CUresult cuDeviceGetCount(int* count) {
  FAKE_CUDA_ENTRY("cuDeviceGetCount", "cuDeviceGetCount", CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done("cuDeviceGetCount", CUDA_ERROR_NOT_INITIALIZED);
  if (count == nullptr) return done("cuDeviceGetCount", CUDA_ERROR_INVALID_VALUE);
  *count = device_count();
  return done(fake::strf("cuDeviceGetCount count=%d", *count), CUDA_SUCCESS);
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  std::string what = fake::strf("cuDeviceGet ordinal=%d", ordinal);
  FAKE_CUDA_ENTRY("cuDeviceGet", what, CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (device == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  if (ordinal < 0 || ordinal >= device_count()) return done(what, CUDA_ERROR_INVALID_DEVICE);
  *device = ordinal;
  return done(what, CUDA_SUCCESS);
}

CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  std::string what = fake::strf("cuDevicePrimaryCtxRetain dev=%d", dev);
  FAKE_CUDA_ENTRY("cuDevicePrimaryCtxRetain", what, CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (pctx == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= device_count()) return done(what, CUDA_ERROR_INVALID_DEVICE);
  {
    std::lock_guard<std::mutex> lock(g_retain_mu);
    g_retain_count[dev]++;
  }
  *pctx = ctx_of(dev);
  return done(what + " ctx=" + fake::hex_ptr(*pctx), CUDA_SUCCESS);
}

// cuda.h maps cuDevicePrimaryCtxRelease to the _v2 entry point, as the real driver exports it.
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  std::string what = fake::strf("cuDevicePrimaryCtxRelease dev=%d", dev);
  FAKE_CUDA_ENTRY("cuDevicePrimaryCtxRelease", what, CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (dev < 0 || dev >= device_count()) return done(what, CUDA_ERROR_INVALID_DEVICE);
  std::lock_guard<std::mutex> lock(g_retain_mu);
  if (g_retain_count[dev] <= 0) return done(what, CUDA_ERROR_INVALID_CONTEXT);
  g_retain_count[dev]--;
  return done(what, CUDA_SUCCESS);
}

CUresult cuCtxGetCurrent(CUcontext* pctx) {
  FAKE_CUDA_ENTRY("cuCtxGetCurrent", "cuCtxGetCurrent", CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done("cuCtxGetCurrent", CUDA_ERROR_NOT_INITIALIZED);
  if (pctx == nullptr) return done("cuCtxGetCurrent", CUDA_ERROR_INVALID_VALUE);
  *pctx = current();
  return done("cuCtxGetCurrent ctx=" + fake::hex_ptr(*pctx), CUDA_SUCCESS);
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  std::string what = "cuCtxSetCurrent ctx=" + fake::hex_ptr(ctx);
  FAKE_CUDA_ENTRY("cuCtxSetCurrent", what, CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (ctx != nullptr && device_of(ctx) < 0) return done(what, CUDA_ERROR_INVALID_CONTEXT);
  // Real semantics: replace the top of the stack; NULL pops it.
  if (ctx == nullptr) {
    if (!t_stack.empty()) t_stack.pop_back();
  } else if (t_stack.empty()) {
    t_stack.push_back(ctx);
  } else {
    t_stack.back() = ctx;
  }
  return done(what, CUDA_SUCCESS);
}

CUresult cuCtxGetDevice(CUdevice* device) {
  FAKE_CUDA_ENTRY("cuCtxGetDevice", "cuCtxGetDevice", CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done("cuCtxGetDevice", CUDA_ERROR_NOT_INITIALIZED);
  if (device == nullptr) return done("cuCtxGetDevice", CUDA_ERROR_INVALID_VALUE);
  int dev = device_of(current());
  if (dev < 0) return done("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT);
  *device = dev;
  return done(fake::strf("cuCtxGetDevice dev=%d", dev), CUDA_SUCCESS);
}

CUresult cuCtxPushCurrent(CUcontext ctx) {
  std::string what = "cuCtxPushCurrent ctx=" + fake::hex_ptr(ctx);
  FAKE_CUDA_ENTRY("cuCtxPushCurrent", what, CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (device_of(ctx) < 0) return done(what, CUDA_ERROR_INVALID_CONTEXT);
  t_stack.push_back(ctx);
  return done(what, CUDA_SUCCESS);
}

CUresult cuCtxPopCurrent(CUcontext* pctx) {
  FAKE_CUDA_ENTRY("cuCtxPopCurrent", "cuCtxPopCurrent", CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done("cuCtxPopCurrent", CUDA_ERROR_NOT_INITIALIZED);
  if (t_stack.empty()) return done("cuCtxPopCurrent", CUDA_ERROR_INVALID_CONTEXT);
  CUcontext top = t_stack.back();
  t_stack.pop_back();
  if (pctx != nullptr) *pctx = top;
  return done("cuCtxPopCurrent ctx=" + fake::hex_ptr(top), CUDA_SUCCESS);
}

CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  std::string what = fake::strf("cuCtxCreate flags=%u dev=%d", flags, dev);
  FAKE_CUDA_ENTRY("cuCtxCreate", what, CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (pctx == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= device_count()) return done(what, CUDA_ERROR_INVALID_DEVICE);
  *pctx = reinterpret_cast<CUcontext>(kCreatedCtxBase + static_cast<uintptr_t>(dev));
  t_stack.push_back(*pctx);
  return done(what + " ctx=" + fake::hex_ptr(*pctx), CUDA_SUCCESS);
}

CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  FAKE_CUDA_ENTRY("cuMemGetInfo", "cuMemGetInfo", CUDA_ERROR_UNKNOWN);
  if (!g_initialized) return done("cuMemGetInfo", CUDA_ERROR_NOT_INITIALIZED);
  if (current() == nullptr) return done("cuMemGetInfo", CUDA_ERROR_INVALID_CONTEXT);
  *free_bytes = *total_bytes = size_t{80} << 30;
  return done("cuMemGetInfo", CUDA_SUCCESS);
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  struct Entry {
    const char* name;
    void* fn;
  };
  // Base names, as callers ask for them; the version argument is accepted but unused.
  static const Entry kTable[] = {
      {"cuInit", reinterpret_cast<void*>(&cuInit)},
      {"cuDriverGetVersion", reinterpret_cast<void*>(&cuDriverGetVersion)},
      {"cuDeviceGetCount", reinterpret_cast<void*>(&cuDeviceGetCount)},
      {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
      {"cuCtxGetCurrent", reinterpret_cast<void*>(&cuCtxGetCurrent)},
      {"cuCtxSetCurrent", reinterpret_cast<void*>(&cuCtxSetCurrent)},
      {"cuCtxGetDevice", reinterpret_cast<void*>(&cuCtxGetDevice)},
      {"cuDevicePrimaryCtxRetain", reinterpret_cast<void*>(&cuDevicePrimaryCtxRetain)},
      {"cuDevicePrimaryCtxRelease", reinterpret_cast<void*>(&cuDevicePrimaryCtxRelease)},
      {"cuCtxPushCurrent", reinterpret_cast<void*>(&cuCtxPushCurrent)},
      {"cuCtxPopCurrent", reinterpret_cast<void*>(&cuCtxPopCurrent)},
      {"cuCtxCreate", reinterpret_cast<void*>(&cuCtxCreate_v2)},
      {"cuMemGetInfo", reinterpret_cast<void*>(&cuMemGetInfo_v2)},
  };
  std::string what =
      fake::strf("cuGetProcAddress symbol=%s version=%d flags=%llu", symbol ? symbol : "(null)",
                 cudaVersion, static_cast<unsigned long long>(flags));
  FAKE_CUDA_ENTRY("cuGetProcAddress", what, CUDA_ERROR_UNKNOWN);
  if (pfn == nullptr || symbol == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  for (const Entry& e : kTable) {
    if (strcmp(e.name, symbol) == 0) {
      *pfn = e.fn;
      if (symbolStatus) *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
      return done(what + " found", CUDA_SUCCESS);
    }
  }
  if (ce_enabled()) {
    void* fn = fake_cuda_ce_lookup(symbol);
    if (fn == nullptr) fn = fake_cuda_graph_lookup(symbol);
    if (fn == nullptr) fn = fake_cuda_kernel_lookup(symbol);
    if (fn != nullptr) {
      *pfn = fn;
      if (symbolStatus) *symbolStatus = CU_GET_PROC_ADDRESS_SUCCESS;
      return done(what + " found", CUDA_SUCCESS);
    }
  }
  *pfn = nullptr;
  if (symbolStatus) *symbolStatus = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return done(what + " not_found", CUDA_ERROR_NOT_FOUND);
}

}  // extern "C"
