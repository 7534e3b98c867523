#include "soak_common.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "cumem_buffer.h"
#include "rank_util.h"

namespace zgpu {

const char* stream_name(StreamKind k) {
  switch (k) {
    case StreamKind::kLegacy:
      return "legacy";
    case StreamKind::kPerThread:
      return "per-thread";
    case StreamKind::kNonBlocking:
      return "user-nonblocking";
    case StreamKind::kBlocking:
      return "user-blocking";
  }
  return "?";
}

SoakStreams::SoakStreams() {
  ZG_CUDA(cudaStreamCreateWithFlags(&nonblocking_, cudaStreamNonBlocking));
  ZG_CUDA(cudaStreamCreateWithFlags(&blocking_, cudaStreamDefault));
}

SoakStreams::~SoakStreams() {
  if (std::uncaught_exceptions() > 0) return;
  cudaStreamDestroy(nonblocking_);
  cudaStreamDestroy(blocking_);
}

cudaStream_t SoakStreams::get(StreamKind k) const {
  switch (k) {
    case StreamKind::kLegacy:
      return nullptr;
    case StreamKind::kPerThread:
      return cudaStreamPerThread;
    case StreamKind::kNonBlocking:
      return nonblocking_;
    case StreamKind::kBlocking:
      return blocking_;
  }
  return nullptr;
}

size_t draw_soak_count(SoakRng& rng, size_t cap, size_t elem, int nranks) {
  const size_t n = static_cast<size_t>(nranks);
  const double total = std::exp(rng.uniform() * std::log(static_cast<double>(cap)));
  size_t per_rank = std::max<size_t>(1, static_cast<size_t>(total) / n);
  if (rng.chance(0.15)) {
    size_t p = 1;
    while (p * 2 <= per_rank) p *= 2;
    switch (rng.below(3)) {  // a power of two, or one element either side
      case 0:
        per_rank = p > elem ? p - elem : p;
        break;
      case 1:
        per_rank = p;
        break;
      default:
        per_rank = (p + elem) * n <= cap ? p + elem : p;
        break;
    }
  }
  size_t count = std::max<size_t>(1, per_rank / elem);
  while (count > 1 && count * elem * n > cap) --count;
  return count;
}

const char* memory_name(SoakMemory m) {
  switch (m) {
    case SoakMemory::kCudaMalloc:
      return "cudamalloc";
    case SoakMemory::kCumem:
      return "cumem";
    case SoakMemory::kCumemFabric:
      return "cumem-fabric";
  }
  return "?";
}

void* soak_alloc(SoakMemory m, size_t bytes) {
  constexpr size_t kExpandableSegmentPiece = size_t{20} << 20;
  if (m == SoakMemory::kCudaMalloc) {
    void* p = nullptr;
    ZG_CUDA(cudaMalloc(&p, bytes));
    return p;
  }
  return cumem_alloc(bytes, kExpandableSegmentPiece, m == SoakMemory::kCumemFabric);
}

void soak_free(SoakMemory m, void* p) {
  if (p == nullptr) return;
  if (m == SoakMemory::kCudaMalloc) {
    cudaFree(p);
  } else {
    cumem_free(p);
  }
}

std::string shim_route_name(int route) {
  using RouteNameFn = const char* (*)(zerocta_route_t);
  static const auto name_of =
      reinterpret_cast<RouteNameFn>(dlsym(RTLD_DEFAULT, "zerocta_route_name"));
  const char* name = name_of ? name_of(static_cast<zerocta_route_t>(route)) : nullptr;
  return name ? name : std::to_string(route);
}

}  // namespace zgpu
