#include "nvml_links.h"

#include <dlfcn.h>

#include <cstdio>

namespace zc {
namespace {

// The few NVML declarations used here (nvml.h is not among the build's dependencies); their
// values are NVML's ABI.
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kP2pCapsIndexNvlink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kP2pStatusOk = 0;         // NVML_P2P_STATUS_OK

struct Nvml {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*handle_by_uuid)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*p2p_status)(NvmlDevice, NvmlDevice, int, int*) = nullptr;
};

// NVML, loaded and initialized once per process (never shut down: its initialization is
// counted, and the application may use it too); null when it cannot be had.
const Nvml* nvml() {
  static const Nvml* loaded = []() -> const Nvml* {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return nullptr;
    static Nvml n;
    n.init = reinterpret_cast<decltype(n.init)>(dlsym(lib, "nvmlInit_v2"));
    n.handle_by_uuid =
        reinterpret_cast<decltype(n.handle_by_uuid)>(dlsym(lib, "nvmlDeviceGetHandleByUUID"));
    n.p2p_status = reinterpret_cast<decltype(n.p2p_status)>(dlsym(lib, "nvmlDeviceGetP2PStatus"));
    if (!n.init || !n.handle_by_uuid || !n.p2p_status || n.init() != kNvmlSuccess) {
      dlclose(lib);
      return nullptr;
    }
    return &n;
  }();
  return loaded;
}

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as NVML names a GPU.
void uuid_text(const unsigned char u[16], char out[48]) {
  snprintf(out, 48,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
           u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
           u[15]);
}

}  // namespace

NvlinkAnswer nvlink_between(const unsigned char a[16], const unsigned char b[16]) {
  const Nvml* n = nvml();
  if (!n) return NvlinkAnswer::kUnknown;
  char ta[48], tb[48];
  uuid_text(a, ta);
  uuid_text(b, tb);
  NvmlDevice da = nullptr, db = nullptr;
  if (n->handle_by_uuid(ta, &da) != kNvmlSuccess || n->handle_by_uuid(tb, &db) != kNvmlSuccess)
    return NvlinkAnswer::kUnknown;
  int status = -1;
  if (n->p2p_status(da, db, kP2pCapsIndexNvlink, &status) != kNvmlSuccess)
    return NvlinkAnswer::kUnknown;
  return status == kP2pStatusOk ? NvlinkAnswer::kLinked : NvlinkAnswer::kNotLinked;
}

}  // namespace zc
