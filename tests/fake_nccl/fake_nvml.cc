// A fake NVML (libnvidia-ml.so.1) for CPU-only tests: the three calls the shim asks whether two
// GPUs are linked by NVLink (src/channel/nvml_links.h). It knows the GPUs of this host as the fake
// CUDA driver names them (fake_cuda_mem.cc: "fgpu", the host's seed, the device number, a
// fixed tail), so a GPU of another host (another FAKE_CUDA_UUID_SEED) is not found.
//
//   FAKE_NVML_FAIL_INIT=1   nvmlInit_v2 fails (a host without a usable NVML)
//   FAKE_NVML_NVLINK=0      every pair of GPUs answers "not linked" (default: linked)
//
// Each call logs "nvml <name> ... -> <result>".
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fake_log.h"

namespace {

constexpr int kSuccess = 0, kErrorDriverNotLoaded = 9, kErrorNotFound = 6,
              kErrorInvalidArgument = 2;
constexpr int kP2pStatusOk = 0, kP2pStatusNotSupported = 5;

int done(const std::string& what, int r) {
  fake::log_line("nvml " + what + fake::strf(" -> %d", r));
  return r;
}

// The host's device number behind a UUID text the fake CUDA driver's bytes make, or -1.
long device_of(const char* uuid) {
  unsigned b[16];
  if (!uuid ||
      sscanf(uuid, "GPU-%2x%2x%2x%2x-%2x%2x-%2x%2x-%2x%2x-%2x%2x%2x%2x%2x%2x", &b[0], &b[1], &b[2],
             &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13],
             &b[14], &b[15]) != 16)
    return -1;
  if (b[0] != 'f' || b[1] != 'g' || b[2] != 'p' || b[3] != 'u') return -1;
  const char* env = getenv("FAKE_CUDA_UUID_SEED");
  const uint32_t seed = static_cast<uint32_t>(env ? strtol(env, nullptr, 0) : 0);
  const uint32_t theirs = b[4] | b[5] << 8 | b[6] << 16 | static_cast<uint32_t>(b[7]) << 24;
  if (theirs != seed) return -1;  // a GPU of another host
  return static_cast<long>(b[8] | b[9] << 8 | b[10] << 16 | static_cast<uint32_t>(b[11]) << 24);
}

}  // namespace

extern "C" {

typedef struct FakeNvmlDevice* nvmlDevice_t;

int nvmlInit_v2() {
  const char* fail = getenv("FAKE_NVML_FAIL_INIT");
  return done("nvmlInit_v2", fail && strcmp(fail, "1") == 0 ? kErrorDriverNotLoaded : kSuccess);
}

int nvmlShutdown() { return done("nvmlShutdown", kSuccess); }

// A device handle is its number plus one, as a pointer.
int nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  const std::string what = std::string("nvmlDeviceGetHandleByUUID uuid=") + (uuid ? uuid : "null");
  if (device == nullptr) return done(what, kErrorInvalidArgument);
  const long d = device_of(uuid);
  if (d < 0) return done(what, kErrorNotFound);
  *device = reinterpret_cast<nvmlDevice_t>(static_cast<uintptr_t>(d) + 1);
  return done(what + fake::strf(" device=%ld", d), kSuccess);
}

int nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int caps_index, int* status) {
  const auto da = reinterpret_cast<uintptr_t>(a), db = reinterpret_cast<uintptr_t>(b);
  const std::string what =
      fake::strf("nvmlDeviceGetP2PStatus a=%lu b=%lu index=%d", static_cast<unsigned long>(da - 1),
                 static_cast<unsigned long>(db - 1), caps_index);
  if (status == nullptr || da == 0 || db == 0) return done(what, kErrorInvalidArgument);
  const char* nvlink = getenv("FAKE_NVML_NVLINK");
  const bool linked = da != db && !(nvlink && strcmp(nvlink, "0") == 0);
  *status = linked ? kP2pStatusOk : kP2pStatusNotSupported;
  return done(what + fake::strf(" status=%d", *status), kSuccess);
}

}  // extern "C"
