#include "cumem_buffer.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <sstream>

#include "channel.h"

namespace zcb {

namespace {

// The driver entry points, resolved once through the runtime (CUDA 12.0 ABI of each).
struct CumemApi {
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
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
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr)
    fatal("--alloc cumem: driver entry point %s not found (%s)", name, cudaGetErrorString(e));
  *out = reinterpret_cast<F>(fn);
}

const CumemApi& api() {
  static const CumemApi a = [] {
    CumemApi r;
    resolve("cuDeviceGet", &r.device_get);
    resolve("cuDeviceGetAttribute", &r.device_attribute);
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

void check(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return;
  const char* text = nullptr;
  if (api().error_string) api().error_string(r, &text);
  fatal("--alloc cumem: %s failed: %s (%d)", call, text ? text : "?", static_cast<int>(r));
}

size_t round_up(size_t v, size_t to) { return to == 0 ? v : (v + to - 1) / to * to; }

CUmemAllocationProp chunk_properties(int device, const CumemProps& props) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  // Exportable like PyTorch's segments (which IPC shares them as file descriptors).
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (props.rdma) {
    CUdevice dev = 0;
    check(api().device_get(&dev, device), "cuDeviceGet");
    int supported = 0;
    check(api().device_attribute(&supported,
                                 CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev),
          "cuDeviceGetAttribute");
    // As ncclMemAlloc: the flag where the GPU supports it, else off (said once a process, so
    // that a pass that asked for it is not read as having had it).
    if (supported) {
      prop.allocFlags.gpuDirectRDMACapable = 1;
    } else {
      static bool said = false;
      if (!said)
        fprintf(stderr,
                "# --cumem-props rdma: GPU %d has no GPUDirect RDMA for cuMem; the flag stays "
                "off, as ncclMemAlloc leaves it\n",
                device);
      said = true;
    }
  }
  return prop;
}

// The devices granted access to the buffer: its own, and with peer_access every device that
// can reach it, as ncclMemAlloc grants.
std::vector<CUmemAccessDesc> access_list(int device, const CumemProps& props) {
  std::vector<int> devices{device};
  if (props.peer_access) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) fatal("--cumem-props peers: no device count");
    for (int d = 0; d < count; ++d) {
      int can = 0;
      if (d != device && cudaDeviceCanAccessPeer(&can, d, device) == cudaSuccess && can)
        devices.push_back(d);
    }
  }
  std::vector<CUmemAccessDesc> out;
  for (int d : devices) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = d;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    out.push_back(access);
  }
  return out;
}

}  // namespace

bool parse_cumem_props(const std::string& text, CumemProps* out) {
  CumemProps p;
  if (text != "none") {
    std::stringstream list(text);
    std::string item;
    int items = 0;
    while (std::getline(list, item, ',')) {
      ++items;
      if (item == "rdma")
        p.rdma = true;
      else if (item == "recommended")
        p.recommended = true;
      else if (item == "peers")
        p.peer_access = true;
      else
        return false;
    }
    if (items == 0 || text.back() == ',') return false;
  }
  *out = p;
  return true;
}

std::string cumem_props_name(const CumemProps& props) {
  std::string out;
  for (const auto& [on, name] :
       {std::pair{props.rdma, "rdma"}, std::pair{props.recommended, "recommended"},
        std::pair{props.peer_access, "peers"}})
    if (on) out += (out.empty() ? "" : ",") + std::string(name);
  return out.empty() ? "none" : out;
}

std::vector<size_t> cumem_chunk_sizes(size_t bytes, size_t chunk, size_t granularity) {
  std::vector<size_t> out;
  const size_t full = round_up(chunk, granularity);
  if (full == 0) return out;
  for (size_t left = bytes; left > 0;) {
    const size_t piece = left >= full ? full : round_up(left, granularity);
    out.push_back(piece);
    left -= left >= full ? full : left;
  }
  return out;
}

CumemBuffer::CumemBuffer(int device, size_t bytes, size_t chunk, const CumemProps& props) {
  const CumemApi& a = api();
  const CUmemAllocationProp prop = chunk_properties(device, props);
  size_t gran = 0;
  check(a.granularity(&gran, &prop,
                      props.recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                                        : CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  sizes_ = cumem_chunk_sizes(bytes, chunk, gran);
  for (size_t s : sizes_) reserved_ += s;
  CUdeviceptr base = 0;
  check(a.reserve(&base, reserved_, gran, 0, 0), "cuMemAddressReserve");
  base_ = base;
  size_t offset = 0;
  for (size_t s : sizes_) {
    CUmemGenericAllocationHandle h = 0;
    check(a.create(&h, s, &prop, 0), "cuMemCreate");
    handles_.push_back(h);
    check(a.map(base + offset, s, 0, h, 0), "cuMemMap");
    offset += s;
  }
  const std::vector<CUmemAccessDesc> access = access_list(device, props);
  check(a.set_access(base, reserved_, access.data(), access.size()), "cuMemSetAccess");
}

CumemBuffer::~CumemBuffer() {
  const CumemApi& a = api();
  size_t offset = 0;
  for (size_t i = 0; i < handles_.size(); ++i) {  // one mapping per chunk, each unmapped alone
    a.unmap(base_ + offset, sizes_[i]);
    offset += sizes_[i];
  }
  for (unsigned long long h : handles_) a.release(h);
  if (base_ != 0) a.address_free(base_, reserved_);
}

void* CumemBuffer::ptr() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(base_)); }

}  // namespace zcb
