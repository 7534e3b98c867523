// The CUDA driver API, resolved at run time through cuGetProcAddress. zerocta links no CUDA
// library: a process that never calls NCCL never loads or initialises CUDA because of us,
// and we never carry a second copy of the CUDA runtime's state.
#pragma once

#include <cuda.h>

#include "log.h"

namespace zc {

struct CudaDriver {
  // Device and context handling (also offered by the test suite's fake driver).
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);

  // The copy-engine route. `ce_ok` is true only when every one of these resolved.
  CUresult (*cuDeviceGetUuid)(CUuuid*, CUdevice);
  CUresult (*cuDeviceCanAccessPeer)(int*, CUdevice, CUdevice);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuStreamQuery)(CUstream);
  CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus*);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  // The route's flag waits and writes, a stream's consecutive ones in one call (ce_exec.cc).
  CUresult (*cuStreamBatchMemOp)(CUstream, unsigned, CUstreamBatchMemOpParams*, unsigned);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  // A push stream's copies to its peers in one call (ce_exec.cc): the 13.0 ABI (no failIdx),
  // resolved only from a driver of 13.0 or later; null otherwise (one copy per call then).
  CUresult (*cuMemcpyBatchAsync)(CUdeviceptr*, CUdeviceptr*, size_t*, size_t,
                                 CUmemcpyAttributes*, size_t*, size_t, CUstream);
  // Mapping the peers' exported allocations (route_memory.cc, peer_memory.cc); also part of
  // `ce_ok`.
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long);
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*,
                                             CUmemAllocationHandleType);
  CUresult (*cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode*);
  // Reaching the applications' buffers (peer_memory.cc) and the host-mapped flags
  // (op_exchange.h); also part of `ce_ok`.
  CUresult (*cuPointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr);
  // Several at once (peer_memory.cc, per allocation a buffer lies in); null: one by one.
  CUresult (*cuPointerGetAttributes)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
  CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle*, void*);
  CUresult (*cuMemGetAccess)(unsigned long long*, const CUmemLocation*, CUdeviceptr);
  CUresult (*cuCtxEnablePeerAccess)(CUcontext, unsigned);
  CUresult (*cuMemHostRegister)(void*, size_t, unsigned);
  CUresult (*cuMemHostUnregister)(void*);
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr*, void*, unsigned);
  // A rank's stage, where its unreachable buffers are reached instead (stage_buffer.h); also
  // part of `ce_ok`.
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                          unsigned long long);
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*,
                                            CUmemAllocationGranularity_flags);

  // The route's ops captured into CUDA graphs (captured_ops.h); `capture_ok` when all resolved.
  // cuStreamGetCaptureInfo with the 12.0 ABI (its _v2).
  CUresult (*cuStreamGetCaptureInfo)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                                     const CUgraphNode**, size_t*);
  CUresult (*cuUserObjectCreate)(CUuserObject*, void*, CUhostFn, unsigned, unsigned);
  CUresult (*cuGraphRetainUserObject)(CUgraph, CUuserObject, unsigned, unsigned);

  // The push issuer's contexts of its own (push_issuer.h); `own_context_ok` when all resolved.
  // cuCtxCreate with the 3.2 ABI, named as that version is.
  CUresult (*cuCtxCreate_v2)(CUcontext*, unsigned, CUdevice);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);

  // Kernels the library carries (the reduce-scatter's reduction, chunk_sum.h); `kernel_ok`
  // when all resolved.
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void**, void**);

  bool context_ok = false;  // the device/context group resolved
  bool ce_ok = false;       // the copy-engine group resolved too
  bool capture_ok = false;  // ... and the capture group
  bool own_context_ok = false;  // ... and the push issuer's group
  bool kernel_ok = false;       // ... and the kernel group (with ce_ok)
};

// nullptr when no CUDA driver can be loaded. Loads libcuda.so.1 on first use only.
const CudaDriver* cuda_driver();

// The ordinal of the calling thread's current device, -1 when there is none (or no driver).
int current_device();

// Text for a CUresult ("CUDA_ERROR_..."), never NULL.
const char* cuda_error_string(CUresult r);

// Whether `stream` is being captured into a CUDA graph (true when it cannot be queried: the
// mode tag then makes a mistaken answer an error on every rank, never a divergence).
bool stream_is_capturing(CUstream stream);

// The primary context of `device` (retained once and kept), nullptr if it cannot be had.
CUcontext primary_context_of(int device);

// Makes `ctx` current on this thread for a scope and restores the caller's context when
// destroyed (nullptr: only saves and restores it); ok() says whether `ctx` is current.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx);
  ~ScopedContext();
  bool ok() const { return ok_; }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  CUcontext saved_ = nullptr;
  bool ok_ = false;
  bool restore_ = false;
};

// Makes `device`'s primary context current for a scope: the caller's current device is never
// changed by zerocta. Log lines written meanwhile carry `device` in their [dev] field.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) : log_device_(device), context_(primary_context_of(device)) {}
  bool ok() const { return context_.ok(); }

 private:
  LogDeviceScope log_device_;
  ScopedContext context_;
};

}  // namespace zc
