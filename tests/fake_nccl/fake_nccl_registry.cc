#include <cuda.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "fake_nccl_internal.h"

namespace fake {
namespace {

struct Entry {
  Kind kind;
  int id;
};

std::mutex g_mu;
std::map<const void*, Entry>& objects() {
  static auto* m = new std::map<const void*, Entry>();  // never destroyed: used at exit
  return *m;
}
int g_next_id[4] = {1, 1, 1, 1};
const char* const kKindNames[] = {"comm", "mem", "reg", "win"};

std::atomic<int> g_next_unique_id{1};
constexpr char kIdPrefix[] = "fakeid:";

}  // namespace

void register_object(Kind kind, const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  objects()[p] = Entry{kind, g_next_id[static_cast<int>(kind)]++};
}

bool unregister_object(Kind kind, const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = objects().find(p);
  if (it == objects().end() || it->second.kind != kind) return false;
  objects().erase(it);
  return true;
}

bool is_registered(Kind kind, const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = objects().find(p);
  return it != objects().end() && it->second.kind == kind;
}

std::string name_of(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = objects().find(p);
  if (it == objects().end()) return hex_ptr(p);
  return strf("%s#%d", kKindNames[static_cast<int>(it->second.kind)], it->second.id);
}

Comm* new_comm(int nranks, int rank, int device, const ncclConfig_t* config) {
  auto* c = new Comm;
  c->nranks = nranks;
  c->rank = rank;
  c->device = device;
  if (config != nullptr && config_magic_ok(config)) {
    const auto* b = reinterpret_cast<const unsigned char*>(config);
    c->config.assign(b, b + config->size);
  }
  register_object(Kind::kComm, c);
  return c;
}

Comm* find_comm(ncclComm_t comm) {
  if (!is_registered(Kind::kComm, comm)) return nullptr;
  return reinterpret_cast<Comm*>(comm);
}

// A destroyed comm leaves the registry but its memory is kept: tests abort a comm while
// another thread is inside a call on it (find_comm then ensure_ready read it), which must not
// become a use-after-free in the fake itself.
void delete_comm(ncclComm_t comm) { unregister_object(Kind::kComm, comm); }

bool should_fail(const char* fn) {
  const char* env = getenv("FAKE_NCCL_FAIL");
  return env != nullptr && strcmp(env, fn) == 0;
}

ncclResult_t finish(const std::string& line, ncclResult_t result) {
  log_line(line + strf(" -> %d", static_cast<int>(result)));
  nccl_debug_line(line + strf(" -> %d", static_cast<int>(result)));
  return result;
}

bool config_magic_ok(const ncclConfig_t* config) {
  return config != nullptr && config->size >= 12 && config->magic == 0xcafebeef;
}

std::string describe_config(const ncclConfig_t* config) {
  if (config == nullptr) return "config=NULL";
  // The struct is read by its own `size`, like NCCL does; the dump is capped so that a garbage
  // size cannot make the log unbounded.
  size_t size = config->size;
  size_t dump = size > 4096 ? 4096 : size;
  const auto* b = reinterpret_cast<const unsigned char*>(config);
  std::string cta = "na", blocking = "na";
  int v;
  if (size >= 64) {
    memcpy(&v, b + 60, sizeof v);
    cta = strf("%d", v);
  }
  if (size >= 20) {
    memcpy(&v, b + 16, sizeof v);
    blocking = strf("%d", v);
  }
  // magic and version only where `size` covers them: NCCL copies exactly `size` bytes.
  unsigned magic = 0, version = 0;
  if (size >= 12) memcpy(&magic, b + 8, sizeof magic);
  if (size >= 16) memcpy(&version, b + 12, sizeof version);
  return "config=" + hex_ptr(config) +
         strf(" config_size=%zu magic=%#x version=%u cta=%s blocking=%s hex=", size, magic, version,
              cta.c_str(), blocking.c_str()) +
         hex_bytes(b, dump);
}

std::string describe_id(const ncclUniqueId& id) {
  if (strncmp(id.internal, kIdPrefix, sizeof(kIdPrefix) - 1) == 0 &&
      memchr(id.internal, '\0', sizeof(id.internal)) != nullptr)
    return std::string(id.internal);
  return hex_bytes(id.internal, 16);
}

// FAKE_NCCL_COMM_ID=<text> (like NCCL_COMM_ID): every id is "fakeid:<text>", so several
// communicators (or processes) can be created from the same id. Blanks become '_' so that
// the id stays one token of the log.
void fill_unique_id(ncclUniqueId* id) {
  memset(id, 0, sizeof(*id));
  const char* fixed = getenv("FAKE_NCCL_COMM_ID");
  if (fixed != nullptr && *fixed != '\0') {
    snprintf(id->internal, sizeof(id->internal), "%s%s", kIdPrefix, fixed);
    for (char* p = id->internal; *p != '\0'; ++p)
      if (isspace(static_cast<unsigned char>(*p))) *p = '_';
    return;
  }
  snprintf(id->internal, sizeof(id->internal), "%s%d", kIdPrefix, g_next_unique_id++);
}

int current_device() {
  // Like the real NCCL (through cudart), initialise the driver before asking it anything.
  static std::once_flag once;
  std::call_once(once, [] { cuInit(0); });
  CUcontext ctx = nullptr;
  if (cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == nullptr) return -1;
  // The fake driver's contexts are 0x1000 + device.
  return static_cast<int>(reinterpret_cast<uintptr_t>(ctx) - 0x1000);
}

std::string int_list(const int* values, int n) {
  if (values == nullptr) return "NULL";
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += strf(i ? ",%d" : "%d", values[i]);
  return s + "]";
}

}  // namespace fake
