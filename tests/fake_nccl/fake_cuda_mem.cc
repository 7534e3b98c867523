// The fake CUDA driver's copy-engine API (libcuda.so.1, see fake_cuda.cc): what the shim's
// copy-engine route needs to set up and run, on host memory, across processes. Stream capture,
// graphs and user objects are fake_cuda_graph.cc's; the stream operations they record and replay
// run here, through one executor per kind of operation.
//
// cuGetProcAddress_v2 hands these out only with FAKE_CUDA_CE=1 (fake_cuda.cc); without it the
// route stays unavailable (CudaDriver::ce_ok false), as many tests expect.
//
// Memory ("a device pointer is a host pointer"):
//   cuMemCreate                      a memfd of that size (sparse: costs nothing untouched);
//                                    the size must be a multiple of the granularity
//   cuMemExportToShareableHandle     POSIX_FD: a close-on-exec dup of the memfd; FABRIC: 64
//                                    bytes naming the exporter's pid and a descriptor of the
//                                    memfd it keeps while the allocation is mapped (or its
//                                    handle lives); each only if cuMemCreate asked for it (as on
//                                    an IMEX node, where PyTorch's segments may be FABRIC-only)
//   cuMemImportFromShareableHandle   a new allocation handle around a dup of the received fd,
//                                    or of /proc/PID/fd/N opened from a FABRIC handle
//   cuMemAddressReserve              PROT_NONE address space, aligned to the granularity
//   cuMemMap                         the memfd mapped MAP_SHARED|MAP_FIXED there, still
//                                    PROT_NONE (as in CUDA: no access before cuMemSetAccess)
//   cuMemSetAccess                   mprotect read-write (or read-only / none)
//   cuMemUnmap / cuMemAddressFree / cuMemRelease   the reverse; freeing a range that is still
//                                    mapped, or an unknown handle/range, is an error
//   cuMemGetAllocationGranularity    FAKE_CUDA_GRANULARITY bytes (default 2 MiB, as on an
//                                    H100/H200; memfds are sparse, so it costs nothing)
//   cuMemAlloc / cuMemFree           aligned host memory
//   cuPointerGetAttribute            memory type, legacy-IPC capability (cuMemAlloc memory),
//                                    and for mapped cuMem memory its mapping base and size,
//                                    block id (one per cuMemCreate/import) and handle types
//   cuPointerGetAttributes           the same, several at once (defaults for unknown memory)
//   cuMemRetainAllocationHandle      a new handle (own dup of the memfd) for a mapped address
//   cuMemGetAccess                   what cuMemSetAccess granted the device asked about
//   cuCtxEnablePeerAccess            remembered per (current device, peer context); a second
//                                    call answers PEER_ACCESS_ALREADY_ENABLED
//   cuMemHostRegister / Unregister / GetDevicePointer   ranges remembered; the device pointer
//                                    of registered host memory is its host address
// So memory one process exports is really shared with the process that imports it
// (FAKE_CUDA_IMPORT_UNSHARED=1 breaks that on purpose: an import maps fresh zeroed memory).
//
// Work on streams runs at once, in the calling thread, on those host addresses:
// cuMemsetD32Async, cuMemcpyAsync, cuMemcpyHtoD/DtoH, cuMemcpyBatchAsync (refused on the legacy
// NULL stream, as the real driver does), cuStreamWriteValue32/64 (which store exactly 4 or 8
// bytes: a 32-bit write to the low half of a 64-bit word leaves the high half),
// cuStreamBatchMemOp (its waits and writes, each logged as the single call it stands for), and
// cuLaunchKernel of the library's reduction kernels (fake_cuda_kernel.cc's executor). An
// address inside a reservation of this fake must be mapped with the needed access, by one mapping
// or several back to back (else CUDA_ERROR_ILLEGAL_ADDRESS instead of a crash); any other address
// is taken for host memory of the caller. Flags of 32/64-bit operations must be 4/8-byte aligned.
// cuStreamWaitValue32/64 (GEQ as a wrapping signed difference, EQ, AND: (*addr & value) != 0,
// NOR: ~(*addr | value) != 0) cannot block a fake stream: a satisfied wait logs "satisfied"; an
// unsatisfied one logs "not_satisfied" and returns CUDA_SUCCESS, unless FAKE_CUDA_WAIT_MS=<ms>
// is set: then it polls the flag (a peer process may still write it) for up to that long
// ("satisfied_after_ms=N"). The first wait that times out stops every later wait of the
// process from waiting (one hang costs the budget once); every such wait logs "not_satisfied".
// A test can thus read a route that diverged between ranks off the log.
// On a stream in a capture (fake_cuda_graph.cc) these operations, cuEventRecord and
// cuStreamWaitEvent are recorded instead (" captured=<id>"; arguments are checked, memory is
// not touched) and run by each cuGraphLaunch with the same executors (" replay=exec#N"), waits
// included; cuMemcpyBatchAsync is refused there (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
//
// Streams and events are fake handles ("stream#3", "event#7"); destroying an unknown (or
// already destroyed) one is CUDA_ERROR_INVALID_HANDLE. cuStreamQuery/cuStreamSynchronize
// succeed (but not on a stream in an explicit capture). Calls that need a context
// (stream/event creation, copies, memsets, stream memory operations, cuMemAlloc) fail with
// CUDA_ERROR_INVALID_CONTEXT when the calling thread has none current.
//
// Devices: cuDeviceGetUuid derives the UUID from the host's device number (the ordinal, or
// FAKE_CUDA_ISOLATED) and FAKE_CUDA_UUID_SEED (another seed = GPUs of another host);
// cuDeviceCanAccessPeer answers 1 for two distinct devices, 0 with FAKE_CUDA_NO_P2P=1.
//
// FAKE_CUDA_FAIL=<name>[,<name>...] makes those entry points (base names, e.g. cuMemCreate)
// fail: CUDA_ERROR_OUT_OF_MEMORY for cuMemCreate/cuMemAlloc, CUDA_ERROR_UNKNOWN otherwise.
// FAKE_CUDA_DELAY=<name>:<ms>[,...] makes them sleep that long first (race windows). Every
// entry point of the fake refuses a call from a user object's destructor
// (CUDA_ERROR_NOT_PERMITTED, "called from a user-object destructor").
//
// Every call logs "cuda <name> ... pid=<pid> -> <result>" (" thread=zerocta-hk" or
// " thread=zerocta-push" before " pid=" when the shim's housekeeping thread or push issuer made
// it). fake_cuda_live(kind) (exported,
// for drivers) counts what this process still holds: "alloc", "reserve", "map", "stream",
// "event", "memalloc", "hostreg", fake_cuda_graph.cc's "graph", "exec", "userobj", and
// fake_cuda_kernel.cc's "module".
#include <cuda.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "fake_cuda_internal.h"
#include "fake_log.h"

namespace {

constexpr size_t kDefaultGranularity = size_t{2} << 20;

std::mutex g_mu;  // guards everything below

// The handle types the fake exports (CUmemCreate's requestedHandleTypes, masked).
constexpr uint64_t kExportTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC;

// A FABRIC handle of this fake: magic, the exporter's pid and a descriptor there of the memfd.
struct FakeFabric {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t size;
};
static_assert(sizeof(FakeFabric) <= sizeof(CUmemFabricHandle), "fits a fabric handle");
constexpr char kFabricMagic[8] = {'F', 'A', 'K', 'E', 'F', 'A', 'B', '1'};

struct Alloc {
  int fd = -1;
  size_t size = 0;
  uint64_t handle_types = 0;  // of kExportTypes
  uint64_t block_id = 0;  // what cuPointerGetAttribute(MEMORY_BLOCK_ID) says of its mappings
};
uint64_t g_next_block_id = 1;
std::map<CUmemGenericAllocationHandle, Alloc>& allocs() {
  static auto* m = new std::map<CUmemGenericAllocationHandle, Alloc>;  // used at exit too
  return *m;
}
CUmemGenericAllocationHandle g_next_handle = 0x1001;

std::map<uintptr_t, size_t>& reservations() {  // base -> size
  static auto* m = new std::map<uintptr_t, size_t>;
  return *m;
}

struct Mapping {
  size_t size = 0;
  int prot = PROT_NONE;      // the host protection: every device's access together
  uint64_t read_devices = 0;   // devices cuMemSetAccess granted read access (bit = ordinal)
  uint64_t write_devices = 0;  // ... and write access
  int fd = -1;  // a dup of the allocation's memfd, for cuMemRetainAllocationHandle
  uint64_t handle_types = 0;
  uint64_t block_id = 0;
};
std::map<uintptr_t, Mapping>& mappings() {  // base -> mapping
  static auto* m = new std::map<uintptr_t, Mapping>;
  return *m;
}

size_t size_of(size_t n) { return n; }
size_t size_of(const Mapping& m) { return m.size; }

std::map<uintptr_t, size_t>& mem_allocs() {  // cuMemAlloc
  static auto* m = new std::map<uintptr_t, size_t>;
  return *m;
}

std::map<uintptr_t, size_t>& host_registrations() {  // cuMemHostRegister: base -> size
  static auto* m = new std::map<uintptr_t, size_t>;
  return *m;
}

std::set<std::pair<int, const void*>>& peer_access() {  // (device, peer context)
  static auto* s = new std::set<std::pair<int, const void*>>;
  return *s;
}

// The entry of `m` whose [base, base + size) holds p (callers hold g_mu).
template <typename Map>
auto containing(Map& m, uintptr_t p) -> decltype(m.begin()) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p < it->first + size_of(it->second) ? it : m.end();
}

struct FakeStream {
  int id;
  int device;
};
struct FakeEvent {
  int id;
};
std::set<const void*>& streams() {
  static auto* s = new std::set<const void*>;
  return *s;
}
std::set<const void*>& events() {
  static auto* s = new std::set<const void*>;
  return *s;
}
int g_next_stream = 1, g_next_event = 1;

std::atomic<bool> g_wait_budget_spent{false};

bool env_is_1(const char* name) {
  const char* v = getenv(name);
  return v != nullptr && strcmp(v, "1") == 0;
}

long env_long(const char* name, long fallback) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long n = strtol(v, &end, 0);
  return end != nullptr && *end == '\0' ? n : fallback;
}

size_t granularity() {
  long g = env_long("FAKE_CUDA_GRANULARITY", static_cast<long>(kDefaultGranularity));
  return g > 0 ? static_cast<size_t>(g) : kDefaultGranularity;
}

// " pid=<pid>", after " thread=zerocta-hk" for a call of the shim's housekeeping thread (its
// driver calls are the thread's own, not an op's: tests that count an op's calls leave them out)
// and " thread=zerocta-push" for one of its push issuer (an op's pushes it issues later).
std::string pid_text() {
  char name[16] = "";
  prctl(PR_GET_NAME, name, 0, 0, 0);
  const bool ours = strcmp(name, "zerocta-hk") == 0 || strcmp(name, "zerocta-push") == 0;
  return fake::strf("%s%s pid=%d", ours ? " thread=" : "", ours ? name : "",
                    static_cast<int>(getpid()));
}

CUresult done(const std::string& what, CUresult r) {
  fake::log_line("cuda " + what + pid_text() + fake::strf(" -> %d", static_cast<int>(r)));
  return r;
}

std::string stream_name(CUstream s) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (streams().count(s))
    return fake::strf("stream#%d", static_cast<const FakeStream*>(static_cast<const void*>(s))->id);
  if (s == nullptr) return "null";
  if (s == CU_STREAM_LEGACY) return "legacy";
  if (s == CU_STREAM_PER_THREAD) return "per_thread";
  return fake::hex_ptr(s);
}

std::string event_name(CUevent e) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (events().count(e))
    return fake::strf("event#%d", static_cast<const FakeEvent*>(static_cast<const void*>(e))->id);
  return fake::hex_ptr(e);
}

std::string addr(CUdeviceptr p) { return fake::strf("0x%llx", static_cast<unsigned long long>(p)); }

bool need_context(const std::string& what, CUresult* r) {
  if (!fake_cuda_initialized()) {
    *r = done(what, CUDA_ERROR_NOT_INITIALIZED);
    return false;
  }
  if (fake_cuda_current_device() < 0) {
    *r = done(what + " no_context", CUDA_ERROR_INVALID_CONTEXT);
    return false;
  }
  return true;
}

bool valid_device(int dev) { return dev >= 0 && dev < fake_cuda_device_count(); }

// Whether [p, p + n) may be accessed with `prot`: ranges outside every reservation of ours are
// the caller's host memory; ranges inside one must be covered by mappings that follow one
// another (as on a GPU: a copy may span allocations mapped back to back), each with that access.
bool accessible(uintptr_t p, size_t n, int prot) {
  if (n == 0) return true;
  std::lock_guard<std::mutex> lock(g_mu);
  auto& res = reservations();
  auto r = res.upper_bound(p);
  bool in_reservation = false;
  if (r != res.begin()) {
    auto prev = std::prev(r);
    if (p < prev->first + prev->second) in_reservation = true;
  }
  if (!in_reservation && r != res.end() && r->first < p + n) in_reservation = true;
  if (!in_reservation) return true;
  auto& maps = mappings();
  auto m = maps.upper_bound(p);
  if (m == maps.begin()) return false;
  --m;
  for (uintptr_t at = p; m != maps.end() && at >= m->first && at < m->first + m->second.size;
       ++m) {
    if ((m->second.prot & prot) != prot) return false;
    at = m->first + m->second.size;
    if (at >= p + n) return true;
  }
  return false;
}

CUresult access_error(const std::string& what, uintptr_t p, size_t n, int prot) {
  if (accessible(p, n, prot)) return CUDA_SUCCESS;
  return done(
      what + fake::strf(" illegal_address=0x%llx+%zu", static_cast<unsigned long long>(p), n),
      CUDA_ERROR_ILLEGAL_ADDRESS);
}

// The wait conditions of cuStreamWaitValue32/64 (the low two bits of the flags; the others,
// such as CU_STREAM_WAIT_VALUE_FLUSH, change nothing here). GEQ compares as a wrapping signed
// difference, so a counter that wrapped still counts as ahead.
template <typename T>
bool wait_satisfied(T seen, T value, unsigned flags) {
  switch (flags & 0x3) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return static_cast<std::make_signed_t<T>>(seen - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
      return seen == value;
    case CU_STREAM_WAIT_VALUE_AND:
      return (seen & value) != 0;
    default:  // NOR
      return ~(seen | value) != 0;
  }
}

long long now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// FAKE_CUDA_FAIL: a comma-separated list of base names.
bool failing(const char* name) {
  const char* v = getenv("FAKE_CUDA_FAIL");
  if (v == nullptr || *v == '\0') return false;
  const size_t len = strlen(name);
  for (const char* p = v; *p != '\0';) {
    const char* comma = strchr(p, ',');
    const size_t n = comma ? static_cast<size_t>(comma - p) : strlen(p);
    if (n == len && strncmp(p, name, n) == 0) return true;
    if (!comma) break;
    p = comma + 1;
  }
  return false;
}

// FAKE_CUDA_DELAY=<name>:<ms>[,<name>:<ms>...]: those entry points sleep first (to widen a
// race window of the caller's).
void delay(const char* name) {
  const char* v = getenv("FAKE_CUDA_DELAY");
  if (v == nullptr || *v == '\0') return;
  const size_t len = strlen(name);
  for (const char* p = v; *p != '\0';) {
    const char* colon = strchr(p, ':');
    if (colon == nullptr) return;
    if (static_cast<size_t>(colon - p) == len && strncmp(p, name, len) == 0) {
      usleep(static_cast<useconds_t>(atol(colon + 1)) * 1000);
      return;
    }
    const char* comma = strchr(colon, ',');
    if (!comma) return;
    p = comma + 1;
  }
}

// ---- The executors: one per kind of stream operation, for eager ops and graph replays ----

CUresult run_copy(const std::string& what, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  CUresult r;
  if ((r = access_error(what, src, bytes, PROT_READ)) != CUDA_SUCCESS) return r;
  if ((r = access_error(what, dst, bytes, PROT_WRITE)) != CUDA_SUCCESS) return r;
  memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
  return done(what, CUDA_SUCCESS);
}

CUresult run_memset_d32(const std::string& what, CUdeviceptr dst, uint32_t value, size_t count) {
  CUresult r;
  if ((r = access_error(what, dst, count * 4, PROT_WRITE)) != CUDA_SUCCESS) return r;
  auto* p = reinterpret_cast<uint32_t*>(dst);
  for (size_t i = 0; i < count; ++i) __atomic_store_n(p + i, value, __ATOMIC_RELEASE);
  return done(what, CUDA_SUCCESS);
}

// Stores exactly sizeof(T) bytes: a 32-bit write to half of a 64-bit word leaves the other half.
template <typename T>
CUresult run_write(const std::string& what, CUdeviceptr flag, T value) {
  CUresult r;
  if ((r = access_error(what, flag, sizeof(T), PROT_WRITE)) != CUDA_SUCCESS) return r;
  __atomic_store_n(reinterpret_cast<T*>(flag), value, __ATOMIC_RELEASE);
  return done(what, CUDA_SUCCESS);
}

// A fake stream cannot block: a satisfied wait logs "satisfied"; an unsatisfied one is skipped
// ("not_satisfied"), after polling for up to FAKE_CUDA_WAIT_MS while the process's wait budget
// is not spent.
template <typename T>
CUresult run_wait(const std::string& what, CUdeviceptr flag, T value, unsigned flags) {
  CUresult r;
  if ((r = access_error(what, flag, sizeof(T), PROT_READ)) != CUDA_SUCCESS) return r;
  const auto* p = reinterpret_cast<const T*>(flag);
  T seen = __atomic_load_n(p, __ATOMIC_ACQUIRE);
  if (wait_satisfied(seen, value, flags)) return done(what + " satisfied", CUDA_SUCCESS);
  const long budget = env_long("FAKE_CUDA_WAIT_MS", 0);
  if (budget > 0 && !g_wait_budget_spent.load()) {
    const long long start = now_ms();
    while (now_ms() - start < budget) {
      usleep(50);
      seen = __atomic_load_n(p, __ATOMIC_ACQUIRE);
      if (wait_satisfied(seen, value, flags))
        return done(what + fake::strf(" satisfied_after_ms=%lld", now_ms() - start), CUDA_SUCCESS);
    }
    g_wait_budget_spent.store(true);
  }
  return done(what + fake::strf(" not_satisfied seen=%llu", static_cast<unsigned long long>(seen)),
              CUDA_SUCCESS);
}

// Flag waits a stream passed unsatisfied when they were issued, as a GPU's stream would not:
// they travel with events recorded after them to the streams that wait for those events, and a
// synchronization of such a stream polls them first (cuStreamSynchronize, below). So an
// application that synchronizes its stream before it reads or frees its buffers sees what a
// GPU would show it, also when a flag is written later by another thread (the shim's push
// issuer) or process.
std::mutex g_pending_mu;
std::map<const void*, std::vector<FakeOp>>& pending_of() {  // stream or event -> its waits
  static auto* m = new std::map<const void*, std::vector<FakeOp>>;
  return *m;
}

bool op_satisfied(const FakeOp& op) {
  if (op.kind == FakeOp::Kind::kWait64)
    return wait_satisfied(__atomic_load_n(reinterpret_cast<const uint64_t*>(op.dst), __ATOMIC_ACQUIRE),
                          op.value, op.flags);
  return wait_satisfied(__atomic_load_n(reinterpret_cast<const uint32_t*>(op.dst), __ATOMIC_ACQUIRE),
                        static_cast<uint32_t>(op.value), op.flags);
}

// Adds `w` to `waits` unless an equal wait is there (streams hand their waits back and forth
// through events: without this the lists would double at every round trip).
void add_wait(std::vector<FakeOp>* waits, const FakeOp& w) {
  for (const FakeOp& o : *waits)
    if (o.kind == w.kind && o.dst == w.dst && o.value == w.value && o.flags == w.flags) return;
  waits->push_back(w);
}

// After `op` ran on `stream`: what the stream, or the event it recorded, now waits for.
void carry_pending(CUstream stream, const FakeOp& op) {
  std::lock_guard<std::mutex> lock(g_pending_mu);
  std::vector<FakeOp>& mine = pending_of()[stream];
  mine.erase(std::remove_if(mine.begin(), mine.end(), op_satisfied), mine.end());
  switch (op.kind) {
    case FakeOp::Kind::kWait32:
    case FakeOp::Kind::kWait64:
      if (!op_satisfied(op)) add_wait(&mine, op);
      break;
    case FakeOp::Kind::kEventRecord:
      pending_of()[op.event] = mine;
      break;
    case FakeOp::Kind::kWaitEvent:
      for (const FakeOp& w : pending_of()[op.event]) add_wait(&mine, w);
      break;
    default:
      break;
  }
}

// A destroyed stream's or event's waits (its handle may be reused).
void forget_pending(const void* handle) {
  std::lock_guard<std::mutex> lock(g_pending_mu);
  pending_of().erase(handle);
}

std::atomic<bool> g_sync_budget_spent{false};

// Polls the waits `stream` carries until they are satisfied, up to FAKE_CUDA_SYNC_WAIT_MS
// (default 3000; the first that runs out stops every later one of the process); "" or what it
// appends to the synchronization's log line.
std::string drain_pending(CUstream stream) {
  std::vector<FakeOp> waits;
  {
    std::lock_guard<std::mutex> lock(g_pending_mu);
    auto it = pending_of().find(stream);
    if (it == pending_of().end() || it->second.empty()) return "";
    waits.swap(it->second);
  }
  const long budget = env_long("FAKE_CUDA_SYNC_WAIT_MS", 3000);
  const long long start = now_ms();
  for (const FakeOp& w : waits)
    while (!op_satisfied(w)) {
      if (g_sync_budget_spent.load() || now_ms() - start >= budget) {
        g_sync_budget_spent.store(true);
        return " pending_not_satisfied";
      }
      usleep(50);
    }
  return fake::strf(" pending_satisfied_after_ms=%lld", now_ms() - start);
}

// An operation issued on `stream`: recorded if the stream is in a capture, else run now.
CUresult issue(CUstream stream, const FakeOp& op) {
  const FakeCudaRecorded rec = fake_cuda_record(stream, op);
  if (!rec.run) return done(op.what + rec.note, rec.result);
  const CUresult r = fake_cuda_run(op, "");
  if (r == CUDA_SUCCESS) carry_pending(stream, op);
  return r;
}

FakeOp op_of(FakeOp::Kind kind, std::string what) {
  FakeOp op;
  op.kind = kind;
  op.what = std::move(what);
  return op;
}

}  // namespace

FAKE_HIDDEN FakeCudaRefusal fake_cuda_enter(const char* name, CUresult injected) {
  if (fake_cuda_in_user_object_destructor())
    return {CUDA_ERROR_NOT_PERMITTED, " called from a user-object destructor"};
  delay(name);
  if (failing(name)) return {injected, " injected_failure"};
  return {CUDA_SUCCESS, ""};
}

FAKE_HIDDEN CUresult fake_cuda_run(const FakeOp& op, const std::string& tail) {
  const std::string what = op.what + tail;
  switch (op.kind) {
    case FakeOp::Kind::kCopy:
      return run_copy(what, op.dst, op.src, op.count);
    case FakeOp::Kind::kMemsetD32:
      return run_memset_d32(what, op.dst, static_cast<uint32_t>(op.value), op.count);
    case FakeOp::Kind::kWrite32:
      return run_write<uint32_t>(what, op.dst, static_cast<uint32_t>(op.value));
    case FakeOp::Kind::kWrite64:
      return run_write<uint64_t>(what, op.dst, op.value);
    case FakeOp::Kind::kWait32:
      return run_wait<uint32_t>(what, op.dst, static_cast<uint32_t>(op.value), op.flags);
    case FakeOp::Kind::kWait64:
      return run_wait<uint64_t>(what, op.dst, op.value, op.flags);
    case FakeOp::Kind::kLaunch:
      return fake_cuda_run_launch(op, what);
    default:  // event records and waits, synchronizations: the work is already done
      return done(what, CUDA_SUCCESS);
  }
}

FAKE_HIDDEN CUresult fake_cuda_done(const std::string& what, CUresult r) { return done(what, r); }
FAKE_HIDDEN bool fake_cuda_need_context(const std::string& what, CUresult* r) {
  return need_context(what, r);
}
FAKE_HIDDEN std::string fake_cuda_stream_name(CUstream s) { return stream_name(s); }
FAKE_HIDDEN int fake_cuda_stream_device(CUstream s) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (streams().count(s))
      return static_cast<const FakeStream*>(static_cast<const void*>(s))->device;
  }
  return fake_cuda_current_device();
}
FAKE_HIDDEN CUresult fake_cuda_access_error(const std::string& what, uintptr_t p, size_t n,
                                            int prot) {
  return access_error(what, p, n, prot);
}
FAKE_HIDDEN CUresult fake_cuda_issue(CUstream stream, const FakeOp& op) { return issue(stream, op); }
FAKE_HIDDEN bool fake_cuda_env_is_1(const char* name) { return env_is_1(name); }

extern "C" {

// ---- Devices ----

CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice dev) {
  std::string what = fake::strf("cuDeviceGetUuid dev=%d", dev);
  FAKE_CUDA_ENTRY("cuDeviceGetUuid", what, CUDA_ERROR_UNKNOWN);
  if (!fake_cuda_initialized()) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (uuid == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev)) return done(what, CUDA_ERROR_INVALID_DEVICE);
  const uint32_t seed = static_cast<uint32_t>(env_long("FAKE_CUDA_UUID_SEED", 0));
  // The host's device behind the ordinal: with FAKE_CUDA_ISOLATED=K the one visible is K.
  const uint32_t ordinal = static_cast<uint32_t>(env_long("FAKE_CUDA_ISOLATED", dev));
  const unsigned char head[4] = {'f', 'g', 'p', 'u'}, tail[4] = {0xd1, 0xce, 0xc0, 0xde};
  memcpy(uuid->bytes, head, 4);
  memcpy(uuid->bytes + 4, &seed, 4);
  memcpy(uuid->bytes + 8, &ordinal, 4);
  memcpy(uuid->bytes + 12, tail, 4);
  return done(what + " uuid=" + fake::hex_bytes(uuid->bytes, 16), CUDA_SUCCESS);
}

CUresult cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  std::string what = fake::strf("cuDeviceCanAccessPeer dev=%d peer=%d", dev, peer);
  FAKE_CUDA_ENTRY("cuDeviceCanAccessPeer", what, CUDA_ERROR_UNKNOWN);
  if (!fake_cuda_initialized()) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (can == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(dev) || !valid_device(peer)) return done(what, CUDA_ERROR_INVALID_DEVICE);
  *can = dev != peer && !env_is_1("FAKE_CUDA_NO_P2P") ? 1 : 0;
  return done(what + fake::strf(" can=%d", *can), CUDA_SUCCESS);
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  static const std::map<int, const char*> kNames = {
      {CUDA_SUCCESS, "CUDA_SUCCESS (fake)"},
      {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE (fake)"},
      {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY (fake)"},
      {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED (fake)"},
      {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE (fake)"},
      {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT (fake)"},
      {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE (fake)"},
      {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND (fake)"},
      {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS (fake)"},
      {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS (fake)"},
      {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU (fake)"},
      {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED (fake)"},
      {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED (fake)"},
      {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE (fake)"},
      {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (fake)"},
      {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (fake)"},
      {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED (fake)"},
      {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION (fake)"},
      {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN (fake)"},
  };
  std::string what = fake::strf("cuGetErrorString error=%d", static_cast<int>(error));
  FAKE_CUDA_ENTRY("cuGetErrorString", what, CUDA_ERROR_UNKNOWN);
  if (text == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  auto it = kNames.find(static_cast<int>(error));
  if (it == kNames.end()) {
    *text = nullptr;
    return done(what, CUDA_ERROR_INVALID_VALUE);
  }
  *text = it->second;
  return done(what, CUDA_SUCCESS);
}

// ---- Streams and events ----

CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  std::string what = fake::strf("cuStreamCreate flags=%u", flags);
  FAKE_CUDA_ENTRY("cuStreamCreate", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (stream == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  auto* s = new FakeStream{0, fake_cuda_current_device()};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    s->id = g_next_stream++;
    streams().insert(s);
  }
  *stream = reinterpret_cast<CUstream>(s);
  return done(what + fake::strf(" dev=%d stream=stream#%d", s->device, s->id), CUDA_SUCCESS);
}

CUresult cuStreamDestroy(CUstream stream) {
  std::string what = "cuStreamDestroy stream=" + stream_name(stream);
  FAKE_CUDA_ENTRY("cuStreamDestroy", what, CUDA_ERROR_UNKNOWN);
  bool known;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    known = streams().erase(stream) != 0;
  }
  if (!known) return done(what + " unknown_stream", CUDA_ERROR_INVALID_HANDLE);
  fake_cuda_forget(stream);
  forget_pending(stream);
  delete reinterpret_cast<FakeStream*>(stream);
  return done(what, CUDA_SUCCESS);
}

// The fake's streams have nothing outstanding but the waits they passed unsatisfied
// (drain_pending); synchronizing a stream in an explicit capture is refused (and invalidates
// the capture), as in CUDA.
CUresult cuStreamSynchronize(CUstream stream) {
  std::string what = "cuStreamSynchronize stream=" + stream_name(stream);
  FAKE_CUDA_ENTRY("cuStreamSynchronize", what, CUDA_ERROR_UNKNOWN);
  return issue(stream, op_of(FakeOp::Kind::kSync, what + drain_pending(stream)));
}

CUresult cuStreamQuery(CUstream stream) {
  std::string what = "cuStreamQuery stream=" + stream_name(stream);
  FAKE_CUDA_ENTRY("cuStreamQuery", what, CUDA_ERROR_UNKNOWN);
  return issue(stream, op_of(FakeOp::Kind::kSync, what));
}

CUresult cuEventCreate(CUevent* event, unsigned int flags) {
  std::string what = fake::strf("cuEventCreate flags=%u", flags);
  FAKE_CUDA_ENTRY("cuEventCreate", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (event == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  auto* e = new FakeEvent{0};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    e->id = g_next_event++;
    events().insert(e);
  }
  *event = reinterpret_cast<CUevent>(e);
  return done(what + fake::strf(" event=event#%d", e->id), CUDA_SUCCESS);
}

CUresult cuEventDestroy(CUevent event) {
  std::string what = "cuEventDestroy event=" + event_name(event);
  FAKE_CUDA_ENTRY("cuEventDestroy", what, CUDA_ERROR_UNKNOWN);
  bool known;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    known = events().erase(event) != 0;
  }
  if (!known) return done(what + " unknown_event", CUDA_ERROR_INVALID_HANDLE);
  fake_cuda_forget(event);
  forget_pending(event);
  delete reinterpret_cast<FakeEvent*>(event);
  return done(what, CUDA_SUCCESS);
}

// Work on fake streams runs when it is issued: every event a stream recorded has passed, unless
// FAKE_CUDA_BUSY_EVENTS=1 (read at each call) makes every event answer "not ready", as events
// behind a kernel that never ends do.
CUresult cuEventQuery(CUevent event) {
  std::string what = "cuEventQuery event=" + event_name(event);
  FAKE_CUDA_ENTRY("cuEventQuery", what, CUDA_ERROR_UNKNOWN);
  bool known;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    known = events().count(event) != 0;
  }
  if (!known) return done(what, CUDA_ERROR_INVALID_HANDLE);
  const char* busy = getenv("FAKE_CUDA_BUSY_EVENTS");
  return done(what, busy && strcmp(busy, "1") == 0 ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

// Recorded on a capturing stream, the event marks a point of that capture: a stream that waits
// for it joins the capture (fake_cuda_graph.cc).
CUresult cuEventRecord(CUevent event, CUstream stream) {
  std::string what = "cuEventRecord event=" + event_name(event) + " stream=" + stream_name(stream);
  FAKE_CUDA_ENTRY("cuEventRecord", what, CUDA_ERROR_UNKNOWN);
  bool known;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    known = events().count(event) != 0;
  }
  if (!known) return done(what + " unknown_event", CUDA_ERROR_INVALID_HANDLE);
  FakeOp op = op_of(FakeOp::Kind::kEventRecord, what);
  op.event = event;
  return issue(stream, op);
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags) {
  std::string what = "cuStreamWaitEvent stream=" + stream_name(stream) +
                     " event=" + event_name(event) + fake::strf(" flags=%u", flags);
  FAKE_CUDA_ENTRY("cuStreamWaitEvent", what, CUDA_ERROR_UNKNOWN);
  bool known;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    known = events().count(event) != 0;
  }
  if (!known) return done(what + " unknown_event", CUDA_ERROR_INVALID_HANDLE);
  FakeOp op = op_of(FakeOp::Kind::kWaitEvent, what);
  op.event = event;
  return issue(stream, op);
}

// ---- Copies, memsets, stream memory operations (run at once, or recorded in a capture) ----
// Arguments are checked when the operation is issued; addresses when it runs.

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  std::string what = "cuMemcpyAsync dst=" + addr(dst) + " src=" + addr(src) +
                     fake::strf(" bytes=%zu", bytes) + " stream=" + stream_name(stream);
  FAKE_CUDA_ENTRY("cuMemcpyAsync", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (bytes > 0 && (dst == 0 || src == 0)) return done(what, CUDA_ERROR_INVALID_VALUE);
  FakeOp op = op_of(FakeOp::Kind::kCopy, what);
  op.dst = dst;
  op.src = src;
  op.count = bytes;
  return issue(stream, op);
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  std::string what = "cuMemcpyHtoD dst=" + addr(dst) + " src=" + fake::hex_ptr(src) +
                     fake::strf(" bytes=%zu", bytes);
  FAKE_CUDA_ENTRY("cuMemcpyHtoD", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (bytes > 0 && (dst == 0 || src == nullptr)) return done(what, CUDA_ERROR_INVALID_VALUE);
  return run_copy(what, dst, reinterpret_cast<CUdeviceptr>(src), bytes);
}

CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  std::string what = "cuMemcpyDtoH dst=" + fake::hex_ptr(dst) + " src=" + addr(src) +
                     fake::strf(" bytes=%zu", bytes);
  FAKE_CUDA_ENTRY("cuMemcpyDtoH", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (bytes > 0 && (dst == nullptr || src == 0)) return done(what, CUDA_ERROR_INVALID_VALUE);
  if ((r = access_error(what, src, bytes, PROT_READ)) != CUDA_SUCCESS) return r;
  memmove(dst, reinterpret_cast<const void*>(src), bytes);
  std::string seen;
  if (bytes == 4) {  // a flag or a marker: show it
    uint32_t v;
    memcpy(&v, dst, 4);
    seen = fake::strf(" value=0x%x", v);
  }
  return done(what + seen, CUDA_SUCCESS);
}

// No capture may hold it (the real batch API is not capturable): refused on a capturing stream.
CUresult cuMemcpyBatchAsync(CUdeviceptr* dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                            CUmemcpyAttributes* attrs, size_t* attrsIdxs, size_t numAttrs,
                            CUstream stream) {
  std::string what = fake::strf("cuMemcpyBatchAsync count=%zu numAttrs=%zu", count, numAttrs) +
                     " stream=" + stream_name(stream);
  FAKE_CUDA_ENTRY("cuMemcpyBatchAsync", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (dsts == nullptr || srcs == nullptr || sizes == nullptr || count == 0 || attrs == nullptr ||
      attrsIdxs == nullptr || numAttrs == 0 || numAttrs > count || attrsIdxs[0] != 0)
    return done(what + " bad_arguments", CUDA_ERROR_INVALID_VALUE);
  for (size_t a = 0; a < numAttrs; ++a)
    if (attrs[a].srcAccessOrder == CU_MEMCPY_SRC_ACCESS_ORDER_INVALID ||
        attrs[a].srcAccessOrder > CU_MEMCPY_SRC_ACCESS_ORDER_ANY)
      return done(what + " bad_src_access_order", CUDA_ERROR_INVALID_VALUE);
  // "Must not be legacy NULL stream" (cuda.h).
  if (stream == nullptr || stream == CU_STREAM_LEGACY)
    return done(what + " legacy_stream", CUDA_ERROR_INVALID_VALUE);
  const FakeCudaRecorded rec = fake_cuda_record(stream, op_of(FakeOp::Kind::kUncapturable, what));
  if (!rec.run) return done(what + rec.note, rec.result);
  for (size_t i = 0; i < count; ++i) {
    if ((r = access_error(what, srcs[i], sizes[i], PROT_READ)) != CUDA_SUCCESS) return r;
    if ((r = access_error(what, dsts[i], sizes[i], PROT_WRITE)) != CUDA_SUCCESS) return r;
  }
  for (size_t i = 0; i < count; ++i) {
    memmove(reinterpret_cast<void*>(dsts[i]), reinterpret_cast<const void*>(srcs[i]), sizes[i]);
    what += " [" + addr(dsts[i]) + "<-" + addr(srcs[i]) + fake::strf(" %zu]", sizes[i]);
  }
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  std::string what = "cuMemsetD32Async dst=" + addr(dst) +
                     fake::strf(" value=0x%x count=%zu", value, count) +
                     " stream=" + stream_name(stream);
  FAKE_CUDA_ENTRY("cuMemsetD32Async", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (dst % 4 != 0) return done(what + " misaligned", CUDA_ERROR_INVALID_VALUE);
  FakeOp op = op_of(FakeOp::Kind::kMemsetD32, what);
  op.dst = dst;
  op.value = value;
  op.count = count;
  return issue(stream, op);
}

CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t count) {
  std::string what =
      "cuMemsetD8 dst=" + addr(dst) + fake::strf(" value=0x%x count=%zu", value, count);
  FAKE_CUDA_ENTRY("cuMemsetD8", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if ((r = access_error(what, dst, count, PROT_WRITE)) != CUDA_SUCCESS) return r;
  memset(reinterpret_cast<void*>(dst), value, count);
  return done(what, CUDA_SUCCESS);
}

// The fake's streams run every operation when it is issued: nothing is ever outstanding.
CUresult cuCtxSynchronize() {
  FAKE_CUDA_ENTRY("cuCtxSynchronize", "cuCtxSynchronize", CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context("cuCtxSynchronize", &r)) return r;
  return done("cuCtxSynchronize", CUDA_SUCCESS);
}

}  // extern "C"

namespace {

// The operation cuStreamWriteValue32/64 or cuStreamWaitValue32/64 stands for (alone, or as one
// element of a cuStreamBatchMemOp).
FakeOp value_fake_op(const char* name, FakeOp::Kind kind, CUstream stream, CUdeviceptr flag,
                     uint64_t value, unsigned flags) {
  FakeOp op = op_of(
      kind, std::string(name) + " stream=" + stream_name(stream) + " addr=" + addr(flag) +
                fake::strf(" value=%llu flags=%u", static_cast<unsigned long long>(value), flags));
  op.dst = flag;
  op.value = value;
  op.flags = flags;
  return op;
}

// cuStreamWriteValue32/64 and cuStreamWaitValue32/64: the flag must be aligned to its width.
template <typename T>
CUresult value_op(const char* name, FakeOp::Kind kind, CUstream stream, CUdeviceptr flag, T value,
                  unsigned flags) {
  const FakeOp op = value_fake_op(name, kind, stream, flag, value, flags);
  FAKE_CUDA_ENTRY(name, op.what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(op.what, &r)) return r;
  if (flag % sizeof(T) != 0) return done(op.what + " misaligned", CUDA_ERROR_INVALID_VALUE);
  return issue(stream, op);
}

}  // namespace

extern "C" {

// cuda.h names these the _v2 entry points (the 12.0 ABI), as the real driver exports them.
CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr flag, cuuint32_t value,
                              unsigned int flags) {
  return value_op<uint32_t>("cuStreamWriteValue32", FakeOp::Kind::kWrite32, stream, flag, value,
                            flags);
}

CUresult cuStreamWriteValue64(CUstream stream, CUdeviceptr flag, cuuint64_t value,
                              unsigned int flags) {
  return value_op<uint64_t>("cuStreamWriteValue64", FakeOp::Kind::kWrite64, stream, flag, value,
                            flags);
}

CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr flag, cuuint32_t value,
                             unsigned int flags) {
  return value_op<uint32_t>("cuStreamWaitValue32", FakeOp::Kind::kWait32, stream, flag, value,
                            flags);
}

CUresult cuStreamWaitValue64(CUstream stream, CUdeviceptr flag, cuuint64_t value,
                             unsigned int flags) {
  return value_op<uint64_t>("cuStreamWaitValue64", FakeOp::Kind::kWait64, stream, flag, value,
                            flags);
}

// A batch is checked whole before any of it is issued; then each operation is issued as the
// single call it stands for and logged under that call's name with " batch=k/n", so that a test
// reads the waits and writes the same way however they were issued.
CUresult cuStreamBatchMemOp(CUstream stream, unsigned int count, CUstreamBatchMemOpParams* ops,
                            unsigned int flags) {
  const std::string what = fake::strf("cuStreamBatchMemOp count=%u flags=%u", count, flags) +
                           " stream=" + stream_name(stream);
  FAKE_CUDA_ENTRY("cuStreamBatchMemOp", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (ops == nullptr || count == 0 || count >= 256 || flags != 0)
    return done(what + " bad_arguments", CUDA_ERROR_INVALID_VALUE);
  // The operations a batch may hold here, as the single calls they stand for.
  struct Single {
    CUstreamBatchMemOpType type;
    const char* name;
    FakeOp::Kind kind;
    bool wide;  // 64-bit
  };
  static const Single kSingles[] = {
      {CU_STREAM_MEM_OP_WAIT_VALUE_32, "cuStreamWaitValue32", FakeOp::Kind::kWait32, false},
      {CU_STREAM_MEM_OP_WAIT_VALUE_64, "cuStreamWaitValue64", FakeOp::Kind::kWait64, true},
      {CU_STREAM_MEM_OP_WRITE_VALUE_32, "cuStreamWriteValue32", FakeOp::Kind::kWrite32, false},
      {CU_STREAM_MEM_OP_WRITE_VALUE_64, "cuStreamWriteValue64", FakeOp::Kind::kWrite64, true}};
  std::vector<FakeOp> issued;
  for (unsigned k = 0; k < count; ++k) {
    const CUstreamBatchMemOpParams& p = ops[k];
    const Single* single = nullptr;
    for (const Single& s : kSingles)
      if (s.type == p.operation) single = &s;
    if (single == nullptr)
      return done(
          what + fake::strf(" unsupported_operation=%d at=%u", static_cast<int>(p.operation), k),
          CUDA_ERROR_INVALID_VALUE);
    const bool wait =
        single->kind == FakeOp::Kind::kWait32 || single->kind == FakeOp::Kind::kWait64;
    const CUdeviceptr at = wait ? p.waitValue.address : p.writeValue.address;
    const unsigned op_flags = wait ? p.waitValue.flags : p.writeValue.flags;
    uint64_t value = wait ? p.waitValue.value : p.writeValue.value;
    if (single->wide) value = wait ? p.waitValue.value64 : p.writeValue.value64;
    FakeOp op = value_fake_op(single->name, single->kind, stream, at, value, op_flags);
    const std::string tail = fake::strf(" batch=%u/%u", k + 1, count);
    const size_t width = single->wide ? 8 : 4;
    if (op.dst % width != 0)
      return done(what + fake::strf(" misaligned at=%u", k), CUDA_ERROR_INVALID_VALUE);
    op.what += tail;
    issued.push_back(op);
  }
  done(what, CUDA_SUCCESS);
  for (const FakeOp& op : issued)
    if ((r = issue(stream, op)) != CUDA_SUCCESS) return r;
  return CUDA_SUCCESS;
}

// ---- Memory ----

CUresult cuMemAlloc(CUdeviceptr* dptr, size_t bytes) {
  std::string what = fake::strf("cuMemAlloc bytes=%zu", bytes);
  FAKE_CUDA_ENTRY("cuMemAlloc", what, CUDA_ERROR_OUT_OF_MEMORY);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (dptr == nullptr || bytes == 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  void* p = nullptr;
  if (posix_memalign(&p, 256, bytes) != 0) return done(what, CUDA_ERROR_OUT_OF_MEMORY);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    mem_allocs()[reinterpret_cast<uintptr_t>(p)] = bytes;
  }
  *dptr = reinterpret_cast<CUdeviceptr>(p);
  return done(what + " ptr=" + addr(*dptr), CUDA_SUCCESS);
}

CUresult cuMemFree(CUdeviceptr dptr) {
  std::string what = "cuMemFree ptr=" + addr(dptr);
  FAKE_CUDA_ENTRY("cuMemFree", what, CUDA_ERROR_UNKNOWN);
  bool known;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    known = mem_allocs().erase(dptr) != 0;
  }
  if (!known) return done(what + " unknown_pointer", CUDA_ERROR_INVALID_VALUE);
  free(reinterpret_cast<void*>(dptr));
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemGetAllocationGranularity(size_t* granularity_out, const CUmemAllocationProp* prop,
                                       CUmemAllocationGranularity_flags option) {
  std::string what =
      fake::strf("cuMemGetAllocationGranularity option=%d", static_cast<int>(option));
  FAKE_CUDA_ENTRY("cuMemGetAllocationGranularity", what, CUDA_ERROR_UNKNOWN);
  if (!fake_cuda_initialized()) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (granularity_out == nullptr || prop == nullptr ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return done(what, CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(prop->location.id)) return done(what, CUDA_ERROR_INVALID_DEVICE);
  *granularity_out = granularity();
  return done(what + fake::strf(" dev=%d granularity=%zu", prop->location.id, *granularity_out),
              CUDA_SUCCESS);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                     const CUmemAllocationProp* prop, unsigned long long flags) {
  std::string what = fake::strf("cuMemCreate size=%zu flags=%llu", size, flags);
  FAKE_CUDA_ENTRY("cuMemCreate", what, CUDA_ERROR_OUT_OF_MEMORY);
  if (!fake_cuda_initialized()) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (handle == nullptr || prop == nullptr || size == 0 || size % granularity() != 0 ||
      prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return done(what, CUDA_ERROR_INVALID_VALUE);
  if (!valid_device(prop->location.id)) return done(what, CUDA_ERROR_INVALID_DEVICE);
  const int fd = memfd_create("fake-cuda-mem", MFD_CLOEXEC);
  if (fd < 0) return done(what + " memfd_create_failed", CUDA_ERROR_OUT_OF_MEMORY);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return done(what + " ftruncate_failed", CUDA_ERROR_OUT_OF_MEMORY);
  }
  Alloc a;
  a.fd = fd;
  a.size = size;
  a.handle_types = prop->requestedHandleTypes & kExportTypes;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    a.block_id = g_next_block_id++;
    *handle = g_next_handle++;
    allocs()[*handle] = a;
  }
  return done(what + fake::strf(" dev=%d handle=%llu handle_types=%llu", prop->location.id,
                                static_cast<unsigned long long>(*handle),
                                static_cast<unsigned long long>(a.handle_types)),
              CUDA_SUCCESS);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  std::string what =
      fake::strf("cuMemRelease handle=%llu", static_cast<unsigned long long>(handle));
  FAKE_CUDA_ENTRY("cuMemRelease", what, CUDA_ERROR_UNKNOWN);
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = allocs().find(handle);
    if (it != allocs().end()) {
      fd = it->second.fd;
      allocs().erase(it);
    }
  }
  if (fd < 0) return done(what + " unknown_handle", CUDA_ERROR_INVALID_VALUE);
  close(fd);  // mappings keep the memory alive, as in CUDA
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type, unsigned long long flags) {
  std::string what =
      fake::strf("cuMemExportToShareableHandle handle=%llu type=%d flags=%llu",
                 static_cast<unsigned long long>(handle), static_cast<int>(type), flags);
  FAKE_CUDA_ENTRY("cuMemExportToShareableHandle", what, CUDA_ERROR_UNKNOWN);
  if (shareable == nullptr ||
      (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && type != CU_MEM_HANDLE_TYPE_FABRIC))
    return done(what, CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  const char* problem = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = allocs().find(handle);
    if (it == allocs().end()) {
      problem = " unknown_handle";
    } else if (!(it->second.handle_types & type)) {
      problem = " not_exportable";
    } else if (type == CU_MEM_HANDLE_TYPE_FABRIC) {
      // A descriptor that lives as long as the allocation here: a mapping's, else the handle's.
      FakeFabric f{};
      memcpy(f.magic, kFabricMagic, sizeof f.magic);
      f.pid = static_cast<int32_t>(getpid());
      f.fd = it->second.fd;
      f.size = it->second.size;
      for (const auto& [base, m] : mappings())
        if (m.block_id == it->second.block_id && m.fd >= 0) f.fd = m.fd;
      CUmemFabricHandle out{};
      memcpy(out.data, &f, sizeof f);
      memcpy(shareable, &out, sizeof out);
    } else {
      fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
    }
  }
  if (problem) return done(what + problem, CUDA_ERROR_INVALID_VALUE);
  if (type == CU_MEM_HANDLE_TYPE_FABRIC) return done(what + " fabric", CUDA_SUCCESS);
  if (fd < 0) return done(what + " dup_failed", CUDA_ERROR_OUT_OF_MEMORY);
  *static_cast<int*>(shareable) = fd;
  return done(what + fake::strf(" fd=%d", fd), CUDA_SUCCESS);
}

// The descriptor a FABRIC handle names, opened here (-1 for none: not this fake's handle, or
// its exporter no longer has it).
int open_fabric(const void* handle) {
  FakeFabric f;
  memcpy(&f, handle, sizeof f);
  if (memcmp(f.magic, kFabricMagic, sizeof f.magic) != 0 || f.pid <= 0 || f.fd < 0) return -1;
  const std::string path = fake::strf("/proc/%d/fd/%d", f.pid, f.fd);
  return open(path.c_str(), O_RDWR | O_CLOEXEC);
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                        CUmemAllocationHandleType type) {
  const bool fabric = type == CU_MEM_HANDLE_TYPE_FABRIC;
  // The fd (POSIX_FD: the handle is the descriptor itself), closed at the end for FABRIC.
  const int in = fabric ? (os_handle ? open_fabric(os_handle) : -1)
                        : static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  struct Opened {
    int fd;
    ~Opened() {
      if (fd >= 0) close(fd);
    }
  } opened{fabric ? in : -1};
  std::string what =
      fake::strf("cuMemImportFromShareableHandle fd=%d type=%d", in, static_cast<int>(type));
  FAKE_CUDA_ENTRY("cuMemImportFromShareableHandle", what, CUDA_ERROR_UNKNOWN);
  if (!fake_cuda_initialized()) return done(what, CUDA_ERROR_NOT_INITIALIZED);
  if (handle == nullptr || (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && !fabric))
    return done(what, CUDA_ERROR_INVALID_VALUE);
  struct stat st;
  if (in < 0 || fstat(in, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0)
    return done(what + " not_an_allocation", CUDA_ERROR_INVALID_VALUE);
  // FAKE_CUDA_IMPORT_UNSHARED=1: a fresh allocation of that size instead (a broken import that
  // still "works": only a check of the peer's contents can tell).
  const bool unshared = env_is_1("FAKE_CUDA_IMPORT_UNSHARED");
  int fd = -1;
  if (unshared) {
    fd = memfd_create("fake-cuda-unshared", MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, st.st_size) != 0) {
      close(fd);
      fd = -1;
    }
    what += " unshared";
  } else {
    fd = fcntl(in, F_DUPFD_CLOEXEC, 0);
  }
  if (fd < 0) return done(what + " dup_failed", CUDA_ERROR_OUT_OF_MEMORY);
  Alloc a;
  a.fd = fd;
  a.size = static_cast<size_t>(st.st_size);
  a.handle_types = static_cast<uint64_t>(type);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    a.block_id = g_next_block_id++;
    *handle = g_next_handle++;
    allocs()[*handle] = a;
  }
  return done(
      what + fake::strf(" handle=%llu size=%zu", static_cast<unsigned long long>(*handle), a.size),
      CUDA_SUCCESS);
}

CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr_hint,
                             unsigned long long flags) {
  std::string what =
      fake::strf("cuMemAddressReserve size=%zu alignment=%zu flags=%llu", size, alignment, flags);
  FAKE_CUDA_ENTRY("cuMemAddressReserve", what, CUDA_ERROR_OUT_OF_MEMORY);
  const size_t g = granularity();
  if (ptr == nullptr || size == 0 || size % g != 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  (void)addr_hint;  // a hint only
  const size_t align = alignment > g ? alignment : g;
  void* raw =
      mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return done(what + " mmap_failed", CUDA_ERROR_OUT_OF_MEMORY);
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (start + align - 1) / align * align;
  if (base > start) munmap(raw, base - start);
  const uintptr_t end = start + size + align;
  if (end > base + size) munmap(reinterpret_cast<void*>(base + size), end - (base + size));
  {
    std::lock_guard<std::mutex> lock(g_mu);
    reservations()[base] = size;
  }
  *ptr = static_cast<CUdeviceptr>(base);
  return done(what + " ptr=" + addr(*ptr), CUDA_SUCCESS);
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  std::string what = "cuMemAddressFree ptr=" + addr(ptr) + fake::strf(" size=%zu", size);
  FAKE_CUDA_ENTRY("cuMemAddressFree", what, CUDA_ERROR_UNKNOWN);
  const char* problem = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = reservations().find(ptr);
    if (it == reservations().end() || it->second != size) {
      problem = " unknown_range";
    } else {
      auto m = mappings().lower_bound(ptr);
      if (m != mappings().end() && m->first < ptr + size) {
        problem = " still_mapped";
      } else {
        reservations().erase(it);
        munmap(reinterpret_cast<void*>(ptr), size);
      }
    }
  }
  if (problem) return done(what + problem, CUDA_ERROR_INVALID_VALUE);
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  std::string what = "cuMemMap ptr=" + addr(ptr) +
                     fake::strf(" size=%zu offset=%zu handle=%llu flags=%llu", size, offset,
                                static_cast<unsigned long long>(handle), flags);
  FAKE_CUDA_ENTRY("cuMemMap", what, CUDA_ERROR_OUT_OF_MEMORY);
  const char* problem = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto a = allocs().find(handle);
    auto r = reservations().upper_bound(ptr);
    const bool reserved = r != reservations().begin() && ptr >= std::prev(r)->first &&
                          ptr + size <= std::prev(r)->first + std::prev(r)->second;
    auto m = mappings().lower_bound(ptr);
    const bool overlaps =
        (m != mappings().end() && m->first < ptr + size) ||
        (m != mappings().begin() && std::prev(m)->first + std::prev(m)->second.size > ptr);
    if (a == allocs().end())
      problem = " unknown_handle";
    else if (size == 0 || offset + size > a->second.size)
      problem = " bad_size";
    else if (!reserved)
      problem = " not_reserved";
    else if (overlaps)
      problem = " already_mapped";
    else if (mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED,
                  a->second.fd, static_cast<off_t>(offset)) == MAP_FAILED)
      problem = " mmap_failed";
    else
      mappings()[ptr] = Mapping{size, PROT_NONE, 0, 0, fcntl(a->second.fd, F_DUPFD_CLOEXEC, 0),
                                a->second.handle_types, a->second.block_id};
  }
  if (problem) return done(what + problem, CUDA_ERROR_INVALID_VALUE);
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  std::string what = "cuMemUnmap ptr=" + addr(ptr) + fake::strf(" size=%zu", size);
  FAKE_CUDA_ENTRY("cuMemUnmap", what, CUDA_ERROR_UNKNOWN);
  bool known;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto m = mappings().find(ptr);
    known = m != mappings().end() && m->second.size == size;
    if (known) {
      if (m->second.fd >= 0) close(m->second.fd);
      mappings().erase(m);
      // Back to reserved, inaccessible address space.
      mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
  }
  if (!known) return done(what + " not_mapped", CUDA_ERROR_INVALID_VALUE);
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  std::string what =
      "cuMemSetAccess ptr=" + addr(ptr) + fake::strf(" size=%zu count=%zu", size, count);
  FAKE_CUDA_ENTRY("cuMemSetAccess", what, CUDA_ERROR_UNKNOWN);
  if (desc == nullptr || count == 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  int prot = PROT_NONE;
  uint64_t readers = 0, writers = 0;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(desc[i].location.id))
      return done(what + " bad_location", CUDA_ERROR_INVALID_DEVICE);
    const uint64_t bit = uint64_t{1} << desc[i].location.id;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      prot |= PROT_READ | PROT_WRITE;
      readers |= bit;
      writers |= bit;
    }
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) {
      prot |= PROT_READ;
      readers |= bit;
    }
    what += fake::strf(" dev=%d flags=%d", desc[i].location.id, static_cast<int>(desc[i].flags));
  }
  const char* problem = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto m = mappings().find(ptr);
    if (m == mappings().end() || m->second.size != size)
      problem = " not_mapped";
    else if (mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0)
      problem = " mprotect_failed";
    else {
      m->second.prot = prot;
      m->second.read_devices = readers;
      m->second.write_devices = writers;
    }
  }
  if (problem) return done(what + problem, CUDA_ERROR_INVALID_VALUE);
  return done(what, CUDA_SUCCESS);
}

// ---- Pointer queries, peer access, host registration ----

}  // extern "C"

namespace {
// One attribute of `ptr` into `data`, no log: "" or why not (appended to the caller's line).
CUresult query_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr,
                         const char** why) {
  *why = "";
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  auto m = containing(mappings(), ptr);
  auto a = containing(mem_allocs(), ptr);
  if (m == mappings().end() && a == mem_allocs().end())
    return *why = " unknown_memory", CUDA_ERROR_INVALID_VALUE;
  const bool cumem = m != mappings().end();
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<unsigned*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *static_cast<unsigned*>(data) = cumem ? 0 : 1;
      break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      if (!cumem) return *why = " not_cumem", CUDA_ERROR_INVALID_VALUE;
      *static_cast<CUdeviceptr*>(data) = m->first;
      break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      if (!cumem) return *why = " not_cumem", CUDA_ERROR_INVALID_VALUE;
      *static_cast<size_t*>(data) = m->second.size;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      if (!cumem) return *why = " not_cumem", CUDA_ERROR_INVALID_VALUE;
      *static_cast<unsigned long long*>(data) = m->second.block_id;
      break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      *static_cast<unsigned long long*>(data) =
          cumem ? m->second.handle_types : 0;
      break;
    default:
      return *why = " unsupported", CUDA_ERROR_NOT_SUPPORTED;
  }
  return CUDA_SUCCESS;
}
}  // namespace

extern "C" {

CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  std::string what = fake::strf("cuPointerGetAttribute attribute=%d", static_cast<int>(attribute)) +
                     " ptr=" + addr(ptr);
  FAKE_CUDA_ENTRY("cuPointerGetAttribute", what, CUDA_ERROR_UNKNOWN);
  const char* why = "";
  const CUresult r = query_attribute(data, attribute, ptr, &why);
  return done(what + why, r);
}

// As the real one: one call for several attributes; a pointer the driver does not know gives
// each its default (zero) rather than an error.
CUresult cuPointerGetAttributes(unsigned count, CUpointer_attribute* attributes, void** data,
                                CUdeviceptr ptr) {
  std::string what = fake::strf("cuPointerGetAttributes count=%u", count) + " ptr=" + addr(ptr);
  FAKE_CUDA_ENTRY("cuPointerGetAttributes", what, CUDA_ERROR_UNKNOWN);
  if ((count && (attributes == nullptr || data == nullptr)))
    return done(what, CUDA_ERROR_INVALID_VALUE);
  for (unsigned i = 0; i < count; ++i) {
    unsigned long long value = 0;  // wide enough for every attribute asked here
    const char* why = "";
    if (query_attribute(&value, attributes[i], ptr, &why) != CUDA_SUCCESS) value = 0;
    switch (attributes[i]) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *static_cast<unsigned*>(data[i]) = static_cast<unsigned>(value);
        break;
      default:
        memcpy(data[i], &value, sizeof value);
        break;
    }
  }
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* p) {
  std::string what = "cuMemRetainAllocationHandle ptr=" + fake::hex_ptr(p);
  FAKE_CUDA_ENTRY("cuMemRetainAllocationHandle", what, CUDA_ERROR_UNKNOWN);
  if (handle == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  auto m = containing(mappings(), reinterpret_cast<uintptr_t>(p));
  if (m == mappings().end() || m->second.fd < 0)
    return done(what + " not_mapped", CUDA_ERROR_INVALID_VALUE);
  Alloc a;
  a.fd = fcntl(m->second.fd, F_DUPFD_CLOEXEC, 0);
  a.size = m->second.size;
  a.handle_types = m->second.handle_types;
  a.block_id = m->second.block_id;
  if (a.fd < 0) return done(what + " dup_failed", CUDA_ERROR_OUT_OF_MEMORY);
  *handle = g_next_handle++;
  allocs()[*handle] = a;
  return done(what + fake::strf(" handle=%llu", static_cast<unsigned long long>(*handle)),
              CUDA_SUCCESS);
}

CUresult cuMemGetAccess(unsigned long long* flags, const CUmemLocation* location, CUdeviceptr ptr) {
  std::string what = "cuMemGetAccess ptr=" + addr(ptr);
  FAKE_CUDA_ENTRY("cuMemGetAccess", what, CUDA_ERROR_UNKNOWN);
  if (flags == nullptr || location == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  auto m = containing(mappings(), ptr);
  if (m == mappings().end()) return done(what + " not_mapped", CUDA_ERROR_INVALID_VALUE);
  // What cuMemSetAccess granted this device (the host protection serves every device alike).
  const uint64_t bit = location->type == CU_MEM_LOCATION_TYPE_DEVICE &&
                               location->id >= 0 && location->id < 64
                           ? uint64_t{1} << location->id
                           : 0;
  *flags = m->second.write_devices & bit  ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
           : m->second.read_devices & bit ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                          : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  return done(what + fake::strf(" flags=%llu", *flags), CUDA_SUCCESS);
}

CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags) {
  std::string what =
      "cuCtxEnablePeerAccess peer=" + fake::hex_ptr(peer) + fake::strf(" flags=%u", flags);
  FAKE_CUDA_ENTRY("cuCtxEnablePeerAccess", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (peer == nullptr || flags != 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!peer_access().insert({fake_cuda_current_device(), peer}).second)
    return done(what + " already_enabled", CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemHostRegister(void* p, size_t bytes, unsigned int flags) {
  std::string what =
      "cuMemHostRegister ptr=" + fake::hex_ptr(p) + fake::strf(" bytes=%zu flags=%u", bytes, flags);
  FAKE_CUDA_ENTRY("cuMemHostRegister", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!need_context(what, &r)) return r;
  if (p == nullptr || bytes == 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  const auto base = reinterpret_cast<uintptr_t>(p);
  if (containing(host_registrations(), base) != host_registrations().end())
    return done(what + " already_registered", CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  host_registrations()[base] = bytes;
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemHostUnregister(void* p) {
  std::string what = "cuMemHostUnregister ptr=" + fake::hex_ptr(p);
  FAKE_CUDA_ENTRY("cuMemHostUnregister", what, CUDA_ERROR_UNKNOWN);
  std::lock_guard<std::mutex> lock(g_mu);
  if (host_registrations().erase(reinterpret_cast<uintptr_t>(p)) == 0)
    return done(what + " not_registered", CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  return done(what, CUDA_SUCCESS);
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr* out, void* p, unsigned int flags) {
  std::string what = "cuMemHostGetDevicePointer ptr=" + fake::hex_ptr(p);
  FAKE_CUDA_ENTRY("cuMemHostGetDevicePointer", what, CUDA_ERROR_UNKNOWN);
  if (out == nullptr || flags != 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  if (containing(host_registrations(), reinterpret_cast<uintptr_t>(p)) ==
      host_registrations().end())
    return done(what + " not_registered", CUDA_ERROR_INVALID_VALUE);
  *out = reinterpret_cast<CUdeviceptr>(p);  // a device pointer is a host pointer here
  return done(what, CUDA_SUCCESS);
}

// What this process still holds, for drivers' leak checks (not a CUDA function).
__attribute__((visibility("default"))) int fake_cuda_live(const char* kind) {
  std::lock_guard<std::mutex> lock(g_mu);
  const std::string k = kind ? kind : "";
  if (k == "alloc") return static_cast<int>(allocs().size());
  if (k == "reserve") return static_cast<int>(reservations().size());
  if (k == "map") return static_cast<int>(mappings().size());
  if (k == "stream") return static_cast<int>(streams().size());
  if (k == "event") return static_cast<int>(events().size());
  if (k == "memalloc") return static_cast<int>(mem_allocs().size());
  if (k == "hostreg") return static_cast<int>(host_registrations().size());
  if (k == "module") return fake_cuda_module_live();
  return fake_cuda_graph_live(k);
}

}  // extern "C"

// The copy-engine entry points by base name, as cuGetProcAddress hands them out (the 12.0 ABI:
// cuStreamWaitValue32 is cuStreamWaitValue32_v2).
FAKE_HIDDEN void* fake_cuda_ce_lookup(const char* symbol) {
  struct Entry {
    const char* name;
    void* fn;
  };
  static const Entry kTable[] = {
      {"cuDeviceGetUuid", reinterpret_cast<void*>(&cuDeviceGetUuid)},
      {"cuDeviceCanAccessPeer", reinterpret_cast<void*>(&cuDeviceCanAccessPeer)},
      {"cuStreamCreate", reinterpret_cast<void*>(&cuStreamCreate)},
      {"cuStreamDestroy", reinterpret_cast<void*>(&cuStreamDestroy)},
      {"cuStreamSynchronize", reinterpret_cast<void*>(&cuStreamSynchronize)},
      {"cuStreamQuery", reinterpret_cast<void*>(&cuStreamQuery)},
      {"cuStreamWaitEvent", reinterpret_cast<void*>(&cuStreamWaitEvent)},
      {"cuEventCreate", reinterpret_cast<void*>(&cuEventCreate)},
      {"cuEventDestroy", reinterpret_cast<void*>(&cuEventDestroy)},
      {"cuEventRecord", reinterpret_cast<void*>(&cuEventRecord)},
      {"cuEventQuery", reinterpret_cast<void*>(&cuEventQuery)},
      {"cuMemAlloc", reinterpret_cast<void*>(&cuMemAlloc)},
      {"cuMemFree", reinterpret_cast<void*>(&cuMemFree)},
      {"cuMemcpyAsync", reinterpret_cast<void*>(&cuMemcpyAsync)},
      {"cuMemcpyDtoH", reinterpret_cast<void*>(&cuMemcpyDtoH)},
      {"cuMemcpyHtoD", reinterpret_cast<void*>(&cuMemcpyHtoD)},
      {"cuMemsetD32Async", reinterpret_cast<void*>(&cuMemsetD32Async)},
      {"cuStreamWaitValue32", reinterpret_cast<void*>(&cuStreamWaitValue32)},
      {"cuStreamWriteValue32", reinterpret_cast<void*>(&cuStreamWriteValue32)},
      {"cuStreamWaitValue64", reinterpret_cast<void*>(&cuStreamWaitValue64)},
      {"cuStreamWriteValue64", reinterpret_cast<void*>(&cuStreamWriteValue64)},
      {"cuStreamBatchMemOp", reinterpret_cast<void*>(&cuStreamBatchMemOp)},
      {"cuGetErrorString", reinterpret_cast<void*>(&cuGetErrorString)},
      {"cuMemcpyBatchAsync", reinterpret_cast<void*>(&cuMemcpyBatchAsync)},
      {"cuMemCreate", reinterpret_cast<void*>(&cuMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&cuMemRelease)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&cuMemAddressReserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&cuMemAddressFree)},
      {"cuMemMap", reinterpret_cast<void*>(&cuMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&cuMemUnmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&cuMemSetAccess)},
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&cuMemGetAllocationGranularity)},
      {"cuMemExportToShareableHandle", reinterpret_cast<void*>(&cuMemExportToShareableHandle)},
      {"cuMemImportFromShareableHandle", reinterpret_cast<void*>(&cuMemImportFromShareableHandle)},
      {"cuPointerGetAttribute", reinterpret_cast<void*>(&cuPointerGetAttribute)},
      {"cuPointerGetAttributes", reinterpret_cast<void*>(&cuPointerGetAttributes)},
      {"cuMemRetainAllocationHandle", reinterpret_cast<void*>(&cuMemRetainAllocationHandle)},
      {"cuMemGetAccess", reinterpret_cast<void*>(&cuMemGetAccess)},
      {"cuCtxEnablePeerAccess", reinterpret_cast<void*>(&cuCtxEnablePeerAccess)},
      {"cuMemHostRegister", reinterpret_cast<void*>(&cuMemHostRegister)},
      {"cuMemHostUnregister", reinterpret_cast<void*>(&cuMemHostUnregister)},
      {"cuMemHostGetDevicePointer", reinterpret_cast<void*>(&cuMemHostGetDevicePointer)},
  };
  for (const Entry& e : kTable)
    if (strcmp(e.name, symbol) == 0) return e.fn;
  return nullptr;
}
