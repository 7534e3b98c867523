#include "real_nccl.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "config.h"
#include "log.h"

namespace zc {
namespace {

struct TextRange {
  uintptr_t lo = 0, hi = 0;
};
constexpr int kMaxRanges = 8;

struct State {
  RealNccl fns{};
  std::atomic<bool> resolved{false};
  int version = 0;
  RuntimeTier tier = RuntimeTier::kUnresolved;
  std::string where;
  std::once_flag version_once;
  TextRange text[kMaxRanges];
  std::atomic<int> ntext{0};
};

State& state() {
  static State s;
  return s;
}

std::mutex g_resolve_mu;

// Our own object's base, to refuse a "real NCCL" that is in fact us (ZEROCTA_NCCL_LIBRARY
// pointing at libzerocta.so, or a preload listed twice).
uintptr_t own_base() {
  Dl_info info{};
  dladdr(reinterpret_cast<void*>(&own_base), &info);
  return reinterpret_cast<uintptr_t>(info.dli_fbase);
}

struct PhdrQuery {
  uintptr_t base;
  TextRange* out;
  int n;
};

int collect_text(struct dl_phdr_info* info, size_t, void* data) {
  auto* q = static_cast<PhdrQuery*>(data);
  if (info->dlpi_addr != q->base) return 0;
  for (int i = 0; i < info->dlpi_phnum && q->n < kMaxRanges; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      q->out[q->n].lo = info->dlpi_addr + ph.p_vaddr;
      q->out[q->n].hi = info->dlpi_addr + ph.p_vaddr + ph.p_memsz;
      q->n++;
    }
  }
  return 1;
}

void* find_handle() {
  // 1. Already loaded under its soname, wherever it came from (PyTorch's wheel, the system).
  if (void* h = dlopen("libnccl.so.2", RTLD_NOLOAD | RTLD_LAZY)) return h;
  // 2. Next in the global lookup order after us.
  if (void* f = dlsym(RTLD_NEXT, "ncclGetVersion")) {
    Dl_info info{};
    if (dladdr(f, &info) && info.dli_fname) {
      if (void* h = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY)) return h;
    }
  }
  // 3. The library the user named, loaded only if nothing else is there.
  const std::string& path = config().nccl_library;
  if (!path.empty()) {
    if (void* h = dlopen(path.c_str(), RTLD_NOLOAD | RTLD_LAZY)) return h;
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    static std::atomic<bool> warned{false};  // the search repeats on every call; say it once
    const char* why = dlerror();
    if (!warned.exchange(true))
      ZC_WARN("ZEROCTA_NCCL_LIBRARY=\"%s\" could not be loaded: %s", path.c_str(), why);
  }
  return nullptr;
}

bool resolve_locked(State& s) {
  void* h = find_handle();
  if (!h) return false;
  void* probe = dlsym(h, "ncclGetVersion");
  Dl_info info{};
  if (!probe || !dladdr(probe, &info)) return false;
  if (reinterpret_cast<uintptr_t>(info.dli_fbase) == own_base()) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      ZC_WARN(
          "the NCCL library found is libzerocta itself; check LD_PRELOAD and "
          "ZEROCTA_NCCL_LIBRARY");
    return false;
  }
#define ZC_NCCL_FN(ret, name, params, args, kind) \
  s.fns.name = reinterpret_cast<ret(*) params>(dlsym(h, #name));
#include "nccl_api.def"
#undef ZC_NCCL_FN
  PhdrQuery q{reinterpret_cast<uintptr_t>(info.dli_fbase), s.text, 0};
  dl_iterate_phdr(collect_text, &q);
  s.ntext.store(q.n);
  s.where = info.dli_fname ? info.dli_fname : "?";
  return true;
}

}  // namespace

const RealNccl* real_nccl() {
  State& s = state();
  if (s.resolved.load(std::memory_order_acquire)) return &s.fns;
  std::lock_guard<std::mutex> lock(g_resolve_mu);
  if (s.resolved.load(std::memory_order_relaxed)) return &s.fns;
  if (!resolve_locked(s)) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      ZC_WARN(
          "no NCCL library is loaded in this process (set ZEROCTA_NCCL_LIBRARY=/path/"
          "libnccl.so.2); NCCL calls fail with ncclSystemError");
    return nullptr;
  }
  s.resolved.store(true, std::memory_order_release);
  return &s.fns;
}

namespace {

// The version is asked for only when a decision needs it, so that a disabled shim or a
// pure pass-through configuration makes exactly the calls the application makes.
void probe_version(State& s) {
  int v = 0;
  if (s.fns.ncclGetVersion) s.fns.ncclGetVersion(&v);
  s.version = v;
  const char* where = s.where.c_str();
  if (v < 22800) {
    s.tier = RuntimeTier::kForwardOnly;
    ZC_WARN("NCCL %d at %s is older than 2.28: forwarding every call unchanged", v, where);
  } else if (v < 22900) {
    s.tier = RuntimeTier::kFull;
    ZC_INFO("using NCCL %d at %s", v, where);
  } else {
    s.tier = RuntimeTier::kPolicyOnly;
    ZC_WARN(
        "NCCL %d at %s is newer than the tested 2.28: applying the CTA policy only, "
        "every collective is forwarded unchanged",
        v, where);
  }
}

}  // namespace

int real_nccl_version() {
  if (!real_nccl()) return 0;
  State& s = state();
  std::call_once(s.version_once, [&s] { probe_version(s); });
  return s.version;
}

RuntimeTier runtime_tier() {
  if (!real_nccl()) return RuntimeTier::kUnresolved;
  State& s = state();
  std::call_once(s.version_once, [&s] { probe_version(s); });
  return s.tier;
}

bool address_in_real_nccl(const void* addr) {
  const State& s = state();
  auto a = reinterpret_cast<uintptr_t>(addr);
  int n = s.ntext.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (a >= s.text[i].lo && a < s.text[i].hi) return true;
  return false;
}

void warn_missing_function(const char* name) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (warned.insert(name).second)
    ZC_WARN("the NCCL library in use has no %s; the call returns ncclInternalError", name);
}

}  // namespace zc
