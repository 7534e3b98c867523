#include "cumem_buffer.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "rank_util.h"

namespace zgpu {
namespace {

struct Mapping {
  CUdeviceptr base = 0;
  size_t reserved = 0;
  std::vector<std::pair<size_t, CUmemGenericAllocationHandle>> pieces;  // size, handle
};

// The driver entry points, resolved through the runtime: the tests link no libcuda, so that
// they start (and skip) on machines without a driver.
struct DriverApi {
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuGetErrorString) error_string = nullptr;
};

template <typename F>
void resolve(const char* name, F* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess || fn == nullptr)
    fail(std::string("driver entry point ") + name + " not found");
  *out = reinterpret_cast<F>(fn);
}

const DriverApi& cu() {
  static const DriverApi a = [] {
    DriverApi r;
    resolve("cuMemGetAllocationGranularity", &r.granularity);
    resolve("cuMemAddressReserve", &r.reserve);
    resolve("cuMemAddressFree", &r.address_free);
    resolve("cuMemCreate", &r.create);
    resolve("cuMemRelease", &r.release);
    resolve("cuMemMap", &r.map);
    resolve("cuMemUnmap", &r.unmap);
    resolve("cuMemSetAccess", &r.set_access);
    resolve("cuGetErrorString", &r.error_string);
    return r;
  }();
  return a;
}

std::mutex g_mu;
std::map<void*, Mapping>& mappings() {
  static auto* m = new std::map<void*, Mapping>;
  return *m;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cu().error_string(r, &s);
  fail(std::string(what) + " failed: " + (s ? s : "?"));
}

}  // namespace

CUmemAllocationProp props_here(bool fabric) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) fail("cudaGetDevice failed");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes =
      fabric ? CU_MEM_HANDLE_TYPE_FABRIC : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

std::string fabric_unavailable() {
  const CUmemAllocationProp prop = props_here(true);
  size_t g = 0;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cu().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r == CUDA_SUCCESS) r = cu().create(&h, g, &prop, 0);
  if (r == CUDA_SUCCESS) {
    cu().release(h);
    return "";
  }
  const char* s = nullptr;
  cu().error_string(r, &s);
  return std::string("cuMemCreate of FABRIC-exportable memory: ") + (s ? s : "?") +
         " (no IMEX channel on this machine?)";
}

void* cumem_alloc(size_t bytes, size_t piece, bool fabric, const std::vector<int>& also_open_to) {
  const CUmemAllocationProp prop = props_here(fabric);
  size_t g = 0;
  check(cu().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        "cuMemGetAllocationGranularity");
  const size_t total = (bytes + g - 1) / g * g;
  piece = piece == 0 ? total : (piece + g - 1) / g * g;
  Mapping m;
  m.reserved = total;
  check(cu().reserve(&m.base, total, 0, 0, 0), "cuMemAddressReserve");
  for (size_t at = 0; at < total; at += piece) {
    const size_t n = total - at < piece ? total - at : piece;
    CUmemGenericAllocationHandle h;
    check(cu().create(&h, n, &prop, 0), "cuMemCreate");
    check(cu().map(m.base + at, n, 0, h, 0), "cuMemMap");
    m.pieces.push_back({n, h});
  }
  std::vector<CUmemAccessDesc> access(1);
  access[0].location = prop.location;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int d : also_open_to) {
    if (d == prop.location.id) continue;
    access.push_back(access[0]);
    access.back().location.id = d;
  }
  check(cu().set_access(m.base, total, access.data(), access.size()), "cuMemSetAccess");
  void* p = reinterpret_cast<void*>(m.base);
  std::lock_guard<std::mutex> lock(g_mu);
  mappings()[p] = m;
  return p;
}

void cumem_free(void* p) {
  Mapping m;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = mappings().find(p);
    if (it == mappings().end()) fail("cumem_free of an unknown pointer");
    m = it->second;
    mappings().erase(it);
  }
  if (cudaDeviceSynchronize() != cudaSuccess) fail("cudaDeviceSynchronize failed");
  size_t at = 0;
  for (auto& [n, h] : m.pieces) {
    check(cu().unmap(m.base + at, n), "cuMemUnmap");
    check(cu().release(h), "cuMemRelease");
    at += n;
  }
  check(cu().address_free(m.base, m.reserved), "cuMemAddressFree");
}

}  // namespace zgpu
