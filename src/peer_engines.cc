#include "peer_engines.h"

#include <algorithm>
#include <mutex>

#include "log.h"

namespace zc {
namespace {

constexpr int kMaxDevices = 64;

// The process's contexts on peers' GPUs, counted by the engines that use them.
struct EngineContexts {
  std::mutex mu;
  CUcontext ctx[kMaxDevices] = {};
  int refs[kMaxDevices] = {};
};
EngineContexts& contexts() {  // never destroyed: an exit-time destructor must not call CUDA
  static auto* c = new EngineContexts;
  return *c;
}

bool has_context_calls(const CudaDriver& cu) {
  return cu.cuCtxCreate && cu.cuCtxDestroy && cu.cuCtxPushCurrent && cu.cuCtxPopCurrent &&
         cu.cuCtxSetLimit;
}

// A context on `device` for copies only, referenced once more; nullptr if it cannot be had.
CUcontext retain_context(const CudaDriver& cu, int device) {
  EngineContexts& c = contexts();
  std::lock_guard<std::mutex> lock(c.mu);
  if (!c.ctx[device]) {
    CUdevice dev;
    CUcontext made = nullptr;
    CUctxCreateParams params{};
    if (cu.cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
        cu.cuCtxCreate(&made, &params, 0, dev) != CUDA_SUCCESS)
      return nullptr;
    // No kernel runs in it: what a context reserves for kernels, at its least.
    cu.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0);
    cu.cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, 0);
    cu.cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, 0);
    CUcontext popped;
    cu.cuCtxPopCurrent(&popped);  // cuCtxCreate made it current
    c.ctx[device] = made;
    ZC_INFO("peer engines: a context of this process on GPU %d, for its copy engine", device);
  }
  ++c.refs[device];
  return c.ctx[device];
}

void release_context(const CudaDriver& cu, int device) {
  EngineContexts& c = contexts();
  std::lock_guard<std::mutex> lock(c.mu);
  if (--c.refs[device] > 0 || !c.ctx[device]) return;
  cu.cuCtxDestroy(c.ctx[device]);
  c.ctx[device] = nullptr;
}

// The stream and event of `e` (on e->device), made in `ctx`.
bool make_stream(const CudaDriver& cu, CUcontext ctx, PeerEngine* e) {
  if (cu.cuCtxPushCurrent(ctx) != CUDA_SUCCESS) return false;
  bool ok = cu.cuStreamCreate(&e->stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
  if (!ok) e->stream = nullptr;
  ok = ok && cu.cuEventCreate(&e->event, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
  if (!ok) e->event = nullptr;
  CUcontext popped;
  cu.cuCtxPopCurrent(&popped);
  return ok;
}

}  // namespace

PeerEngines::~PeerEngines() = default;

bool PeerEngines::open(const CudaDriver& cu, int own_device, const std::vector<int>& devices) {
  if (!has_context_calls(cu)) return false;
  by_rank_.assign(devices.size(), PeerEngine{});
  bool ok = true;
  for (size_t r = 0; r < devices.size() && ok; ++r) {
    const int d = devices[r];
    if (d < 0) continue;
    if (d == own_device || d >= kMaxDevices) {
      ok = false;
      break;
    }
    CUcontext ctx = retain_context(cu, d);
    if (!ctx) {
      ok = false;
      break;
    }
    by_rank_[r].device = d;
    ++count_;
    if (std::find(devices_.begin(), devices_.end(), d) == devices_.end()) devices_.push_back(d);
    ok = make_stream(cu, ctx, &by_rank_[r]);
  }
  if (!ok) close(cu);
  return ok;
}

void PeerEngines::drain(const CudaDriver& cu) const {
  for (const PeerEngine& e : by_rank_)
    if (e.stream) cu.cuStreamSynchronize(e.stream);
}

void PeerEngines::close(const CudaDriver& cu) {
  drain(cu);
  for (PeerEngine& e : by_rank_) {
    if (e.device < 0) continue;
    if (e.event) cu.cuEventDestroy(e.event);
    if (e.stream) cu.cuStreamDestroy(e.stream);
    release_context(cu, e.device);
  }
  by_rank_.clear();
  devices_.clear();
  count_ = 0;
}

}  // namespace zc
