#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

#include "driver_call_times.h"
#include "log.h"

namespace zc {
namespace {

using GetProcAddressFn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);

// Asks for the 12.0 ABI of each entry point (e.g. cuStreamBatchMemOp_v2, cuMemAlloc_v2)
// with legacy default-stream semantics for stream 0, which is how NCCL treats stream 0.
constexpr int kAbiVersion = 12000;

template <typename Fn>
bool get(GetProcAddressFn gpa, const char* name, Fn* out, int abi = kAbiVersion) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult status{};
  if (gpa(name, &p, abi, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != CUDA_SUCCESS ||
      p == nullptr) {
    *out = nullptr;
    return false;
  }
  *out = reinterpret_cast<Fn>(p);
  return true;
}

CudaDriver* load() {
  void* h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
  if (!h) h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!h) return nullptr;
  auto gpa = reinterpret_cast<GetProcAddressFn>(dlsym(h, "cuGetProcAddress_v2"));
  if (!gpa) return nullptr;
  static CudaDriver d;
  bool ctx = true;
  ctx &= get(gpa, "cuInit", &d.cuInit);
  ctx &= get(gpa, "cuDriverGetVersion", &d.cuDriverGetVersion);
  ctx &= get(gpa, "cuDeviceGet", &d.cuDeviceGet);
  ctx &= get(gpa, "cuDeviceGetCount", &d.cuDeviceGetCount);
  ctx &= get(gpa, "cuCtxGetCurrent", &d.cuCtxGetCurrent);
  ctx &= get(gpa, "cuCtxSetCurrent", &d.cuCtxSetCurrent);
  ctx &= get(gpa, "cuCtxGetDevice", &d.cuCtxGetDevice);
  ctx &= get(gpa, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain);
  ctx &= get(gpa, "cuDevicePrimaryCtxRelease", &d.cuDevicePrimaryCtxRelease);
  bool ce = ctx;
  ce &= get(gpa, "cuDeviceGetUuid", &d.cuDeviceGetUuid);
  ce &= get(gpa, "cuDeviceCanAccessPeer", &d.cuDeviceCanAccessPeer);
  ce &= get(gpa, "cuStreamCreate", &d.cuStreamCreate);
  ce &= get(gpa, "cuStreamDestroy", &d.cuStreamDestroy);
  ce &= get(gpa, "cuStreamSynchronize", &d.cuStreamSynchronize);
  ce &= get(gpa, "cuStreamQuery", &d.cuStreamQuery);
  ce &= get(gpa, "cuStreamIsCapturing", &d.cuStreamIsCapturing);
  ce &= get(gpa, "cuStreamWaitEvent", &d.cuStreamWaitEvent);
  ce &= get(gpa, "cuEventCreate", &d.cuEventCreate);
  ce &= get(gpa, "cuEventDestroy", &d.cuEventDestroy);
  ce &= get(gpa, "cuEventRecord", &d.cuEventRecord);
  ce &= get(gpa, "cuEventQuery", &d.cuEventQuery);
  ce &= get(gpa, "cuMemcpyAsync", &d.cuMemcpyAsync);
  ce &= get(gpa, "cuStreamBatchMemOp", &d.cuStreamBatchMemOp);
  ce &= get(gpa, "cuMemRelease", &d.cuMemRelease);
  ce &= get(gpa, "cuMemAddressReserve", &d.cuMemAddressReserve);
  ce &= get(gpa, "cuMemAddressFree", &d.cuMemAddressFree);
  ce &= get(gpa, "cuMemMap", &d.cuMemMap);
  ce &= get(gpa, "cuMemUnmap", &d.cuMemUnmap);
  ce &= get(gpa, "cuMemSetAccess", &d.cuMemSetAccess);
  ce &= get(gpa, "cuMemExportToShareableHandle", &d.cuMemExportToShareableHandle);
  ce &= get(gpa, "cuMemImportFromShareableHandle", &d.cuMemImportFromShareableHandle);
  ce &= get(gpa, "cuThreadExchangeStreamCaptureMode", &d.cuThreadExchangeStreamCaptureMode);
  ce &= get(gpa, "cuPointerGetAttribute", &d.cuPointerGetAttribute);
  ce &= get(gpa, "cuMemRetainAllocationHandle", &d.cuMemRetainAllocationHandle);
  ce &= get(gpa, "cuMemGetAccess", &d.cuMemGetAccess);
  ce &= get(gpa, "cuCtxEnablePeerAccess", &d.cuCtxEnablePeerAccess);
  ce &= get(gpa, "cuMemHostRegister", &d.cuMemHostRegister);
  ce &= get(gpa, "cuMemHostUnregister", &d.cuMemHostUnregister);
  ce &= get(gpa, "cuMemHostGetDevicePointer", &d.cuMemHostGetDevicePointer);
  ce &= get(gpa, "cuMemCreate", &d.cuMemCreate);
  ce &= get(gpa, "cuMemGetAllocationGranularity", &d.cuMemGetAllocationGranularity);
  bool capture = ce;
  capture &= get(gpa, "cuStreamGetCaptureInfo", &d.cuStreamGetCaptureInfo);
  capture &= get(gpa, "cuUserObjectCreate", &d.cuUserObjectCreate);
  capture &= get(gpa, "cuGraphRetainUserObject", &d.cuGraphRetainUserObject);
  get(gpa, "cuPointerGetAttributes", &d.cuPointerGetAttributes);
  bool own = ce;
  own &= get(gpa, "cuCtxCreate", &d.cuCtxCreate_v2, 3020);
  own &= get(gpa, "cuCtxPopCurrent", &d.cuCtxPopCurrent);
  own &= get(gpa, "cuMemGetInfo", &d.cuMemGetInfo);
  bool kernel = ce;
  kernel &= get(gpa, "cuModuleLoadData", &d.cuModuleLoadData);
  kernel &= get(gpa, "cuModuleUnload", &d.cuModuleUnload);
  kernel &= get(gpa, "cuModuleGetFunction", &d.cuModuleGetFunction);
  kernel &= get(gpa, "cuLaunchKernel", &d.cuLaunchKernel);
  get(gpa, "cuGetErrorString", &d.cuGetErrorString);
  d.context_ok = ctx && d.cuInit(0) == CUDA_SUCCESS;
  // Asked for with the 13.0 ABI only where the driver has it: a 12.8 driver would answer that
  // request with its 12.8 function, which takes one more argument.
  int version = 0;
  d.cuMemcpyBatchAsync = nullptr;
  if (d.context_ok && d.cuDriverGetVersion(&version) == CUDA_SUCCESS && version >= 13000)
    get(gpa, "cuMemcpyBatchAsync", &d.cuMemcpyBatchAsync, 13000);
  d.ce_ok = ce && d.context_ok;
  d.capture_ok = capture && d.ce_ok;
  d.own_context_ok = own && d.ce_ok;
  d.kernel_ok = kernel && d.ce_ok;
  if (!d.context_ok) return nullptr;
  time_driver_calls(&d);
  return &d;
}

}  // namespace

const CudaDriver* cuda_driver() {
  static std::once_flag once;
  static CudaDriver* d = nullptr;
  std::call_once(once, [] { d = load(); });
  return d;
}

int current_device() {
  const CudaDriver* d = cuda_driver();
  CUdevice dev = -1;
  if (!d || d->cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -1;
  return static_cast<int>(dev);
}

const char* cuda_error_string(CUresult r) {
  const char* s = nullptr;
  const CudaDriver* d = cuda_driver();
  if (d && d->cuGetErrorString) d->cuGetErrorString(r, &s);
  return s ? s : "unknown CUDA error";
}

namespace {

// Primary contexts retained once per device and kept: it is the context the CUDA runtime and
// NCCL use on that device anyway, and retaining per call would leak references.
CUcontext primary_context(const CudaDriver& d, int device) {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static CUcontext cache[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!cache[device]) {
    CUdevice dev;
    CUcontext ctx = nullptr;
    if (d.cuDeviceGet(&dev, device) == CUDA_SUCCESS &&
        d.cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS)
      cache[device] = ctx;
  }
  return cache[device];
}

}  // namespace

CUcontext primary_context_of(int device) {
  const CudaDriver* d = cuda_driver();
  return d ? primary_context(*d, device) : nullptr;
}

ScopedContext::ScopedContext(CUcontext ctx) {
  const CudaDriver* d = cuda_driver();
  if (!d || d->cuCtxGetCurrent(&saved_) != CUDA_SUCCESS) return;
  if (ctx == saved_) {
    ok_ = ctx != nullptr;
    return;
  }
  restore_ = true;
  ok_ = ctx && d->cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}

ScopedContext::~ScopedContext() {
  const CudaDriver* d = cuda_driver();
  if (d && restore_) d->cuCtxSetCurrent(saved_);
}

bool stream_is_capturing(CUstream stream) {
  const CudaDriver* cu = cuda_driver();
  if (!cu || !cu->ce_ok) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  // The legacy stream cannot be captured, and querying it during another thread's global-mode
  // capture is itself an error; it never needs the question.
  if (stream == nullptr || stream == CU_STREAM_LEGACY) return false;
  if (cu->cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS) return true;
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace zc
