// The fake CUDA driver's modules and kernel launches (libcuda.so.1): enough for the library's
// reduce-scatter reduction (src/route/chunk_sum.h), whose kernels it loads from an embedded
// fatbin and launches by name. Handed out by cuGetProcAddress with FAKE_CUDA_CE=1 (fake_cuda.cc),
// by base name.
//
//   cuModuleLoadData(&m, image)   any image (the fake reads none of it): a module ("module#1")
//                                 of the current context's device; INVALID_CONTEXT without one
//   cuModuleGetFunction(&f, m, name)  exactly chunk_sum.cu's entry points zc_chunk_sum_f32,
//                                 zc_chunk_sum_f16 and zc_chunk_sum_bf16; NOT_FOUND for any
//                                 other name, INVALID_HANDLE for a module not (or no longer)
//                                 loaded
//   cuModuleUnload(m)             its functions are gone with it
//   cuLaunchKernel(f, grid, block, shmem, stream, params, extra)
//                                 a stream operation like cuMemcpyAsync (fake_cuda_mem.cc): run
//                                 at once in the calling thread, after everything issued before
//                                 it on the stream and before everything after it; recorded in a
//                                 capture's graph and run at each launch of it (" replay=exec#N").
//                                 The argument's bytes are read from params[0] at the call, as
//                                 CUDA copies a kernel's arguments then; the memory it names is
//                                 read when the launch runs. Like a copy, it does not wait for
//                                 a flag wait its stream passed unsatisfied (fake_cuda_mem.cc:
//                                 FAKE_CUDA_WAIT_MS makes such waits poll first). What it
//                                 computes is chunk_sum.cu's sum bit for bit
//                                 (fake_chunk_sum.cc), whatever the grid and block.
//
// A launch is refused where a GPU would fail or compute garbage, so that a test sees the
// library's mistake rather than wrong bytes: at the call, a function not loaded, a module of
// another device than the stream's (INVALID_HANDLE), empty or oversized dimensions or no params
// (INVALID_VALUE), `extra` (NOT_SUPPORTED: the fake takes the argument from params only), a source
// count the kernel cannot take (nsrc outside 1..8, or below 2 for a pre-multiplied sum:
// INVALID_VALUE, " bad_args"); when it runs, a module unloaded since (a graph's replay),
// pointers not aligned to the element (MISALIGNED_ADDRESS) or memory it may not read or write
// (ILLEGAL_ADDRESS, as for copies). Each call logs "cuda <name> ..." (a launch: its function,
// dimensions, stream and argument).
#include <cuda.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <mutex>
#include <set>
#include <string>

#include "fake_chunk_sum.h"
#include "fake_cuda_internal.h"
#include "fake_log.h"

namespace {

// chunk_sum.cu's entry points, in FakeChunkType's order.
constexpr const char* kEntryPoints[] = {"zc_chunk_sum_f32", "zc_chunk_sum_f16",
                                        "zc_chunk_sum_bf16"};
constexpr int kFunctions = static_cast<int>(std::size(kEntryPoints));

// Launch limits of every GPU the library runs on.
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxGridX = 0x7fffffffu, kMaxGridYZ = 65535;

struct FakeModule;
struct FakeFunction {
  const FakeModule* module;
  FakeChunkType type;
};
struct FakeModule {
  int id = 0;
  int device = -1;  // whose context it was loaded into
  FakeFunction functions[kFunctions];
};

// The tables are never destroyed: a thread of the program may still call in at exit.
std::mutex g_mu;  // guards everything below
auto& g_modules = *new std::set<const FakeModule*>;
int g_next_module = 1;

CUresult done(const std::string& what, CUresult r) { return fake_cuda_done(what, r); }

// A loaded function as a launch sees it; found false for a handle of no loaded module.
struct FunctionInfo {
  bool found = false;
  FakeChunkType type = FakeChunkType::kF32;
  int device = -1;
};

FunctionInfo function_info(CUfunction f) {
  std::lock_guard<std::mutex> lock(g_mu);
  // Compared as addresses only: a handle of an unloaded module is never read.
  for (const FakeModule* m : g_modules)
    for (const FakeFunction& fn : m->functions)
      if (static_cast<const void*>(&fn) == static_cast<const void*>(f))
        return {true, fn.type, m->device};
  return {};
}

std::string module_name(CUmodule m) {
  std::lock_guard<std::mutex> lock(g_mu);
  const auto* p = reinterpret_cast<const FakeModule*>(m);
  return g_modules.count(p) ? fake::strf("module#%d", p->id) : fake::hex_ptr(m);
}

std::string function_name(CUfunction f) {
  const FunctionInfo info = function_info(f);
  return info.found ? kEntryPoints[static_cast<int>(info.type)] : fake::hex_ptr(f);
}

// The argument as the log shows it.
std::string args_text(const FakeChunkSumArgs& a) {
  std::string text = fake::strf(" count=%llu nsrc=%d premul=%d scale=0x%x dst=", a.count, a.nsrc,
                                a.premul, a.scale_bits) +
                     fake::hex_ptr(a.dst) + " src=";
  for (int k = 0; k < a.nsrc && k < kFakeChunkSumMaxSources; ++k)
    text += (k ? "," : "") + fake::hex_ptr(a.src[k]);
  bool scales = false;
  for (int k = 0; k < a.nsrc && k < kFakeChunkSumMaxSources; ++k)
    scales |= a.scale_at[k] != nullptr;
  if (!scales) return text;
  text += " scale_at=";
  for (int k = 0; k < a.nsrc && k < kFakeChunkSumMaxSources; ++k)
    text += (k ? "," : "") + fake::hex_ptr(a.scale_at[k]);
  return text;
}

// Why the kernel cannot take `a` (nullptr: it can).
const char* bad_args(const FakeChunkSumArgs& a, size_t element) {
  if (a.nsrc < 1 + (a.premul != 0) || a.nsrc > kFakeChunkSumMaxSources) return " bad_args=nsrc";
  if (a.count > SIZE_MAX / element) return " bad_args=count";
  return nullptr;
}

// Why the launch dimensions are not a GPU's (nullptr: they are).
const char* bad_dimensions(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                           unsigned bz) {
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) return " empty_dimension";
  if (gx > kMaxGridX || gy > kMaxGridYZ || gz > kMaxGridYZ) return " grid_too_large";
  if (static_cast<unsigned long long>(bx) * by * bz > kMaxThreadsPerBlock)
    return " too_many_threads";
  return nullptr;
}

}  // namespace

FAKE_HIDDEN CUresult fake_cuda_run_launch(const FakeOp& op, const std::string& what) {
  const FunctionInfo info = function_info(op.function);
  if (!info.found) return done(what + " unloaded_module", CUDA_ERROR_INVALID_HANDLE);
  FakeChunkSumArgs a;
  memcpy(&a, op.params.data(), sizeof a);
  const size_t element = fake_chunk_type_bytes(info.type);
  const size_t bytes = a.count * element;
  bool aligned = reinterpret_cast<uintptr_t>(a.dst) % element == 0;
  for (int k = 0; k < a.nsrc; ++k)
    aligned = aligned && reinterpret_cast<uintptr_t>(a.src[k]) % element == 0;
  if (!aligned) return done(what + " misaligned", CUDA_ERROR_MISALIGNED_ADDRESS);
  CUresult r;
  for (int k = 0; k < a.nsrc; ++k)
    if ((r = fake_cuda_access_error(what, reinterpret_cast<uintptr_t>(a.src[k]), bytes,
                                    PROT_READ)) != CUDA_SUCCESS)
      return r;
  if ((r = fake_cuda_access_error(what, reinterpret_cast<uintptr_t>(a.dst), bytes, PROT_WRITE)) !=
      CUDA_SUCCESS)
    return r;
  fake_chunk_sum(info.type, a);
  return done(what, CUDA_SUCCESS);
}

FAKE_HIDDEN int fake_cuda_module_live() {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<int>(g_modules.size());
}

extern "C" {

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  std::string what = "cuModuleLoadData image=" + fake::hex_ptr(image);
  FAKE_CUDA_ENTRY("cuModuleLoadData", what, CUDA_ERROR_NO_BINARY_FOR_GPU);
  CUresult r;
  if (!fake_cuda_need_context(what, &r)) return r;
  if (module == nullptr || image == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  auto* m = new FakeModule;
  m->device = fake_cuda_current_device();
  for (int t = 0; t < kFunctions; ++t) m->functions[t] = {m, static_cast<FakeChunkType>(t)};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    m->id = g_next_module++;
    g_modules.insert(m);
  }
  *module = reinterpret_cast<CUmodule>(m);
  return done(what + fake::strf(" dev=%d module=module#%d", m->device, m->id), CUDA_SUCCESS);
}

CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  std::string what =
      "cuModuleGetFunction module=" + module_name(module) + " name=" + (name ? name : "(null)");
  FAKE_CUDA_ENTRY("cuModuleGetFunction", what, CUDA_ERROR_UNKNOWN);
  if (function == nullptr || name == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  auto* m = reinterpret_cast<FakeModule*>(module);
  if (!g_modules.count(m)) return done(what + " unknown_module", CUDA_ERROR_INVALID_HANDLE);
  for (int t = 0; t < kFunctions; ++t)
    if (strcmp(name, kEntryPoints[t]) == 0) {
      *function = reinterpret_cast<CUfunction>(&m->functions[t]);
      return done(what, CUDA_SUCCESS);
    }
  return done(what + " no_such_function", CUDA_ERROR_NOT_FOUND);
}

CUresult cuModuleUnload(CUmodule module) {
  std::string what = "cuModuleUnload module=" + module_name(module);
  FAKE_CUDA_ENTRY("cuModuleUnload", what, CUDA_ERROR_UNKNOWN);
  const auto* m = reinterpret_cast<const FakeModule*>(module);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_modules.erase(m) == 0) return done(what + " unknown_module", CUDA_ERROR_INVALID_HANDLE);
  }
  delete m;
  return done(what, CUDA_SUCCESS);
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                        CUstream stream, void** params, void** extra) {
  std::string what =
      "cuLaunchKernel fn=" + function_name(f) +
      fake::strf(" grid=%ux%ux%u block=%ux%ux%u shmem=%u", gx, gy, gz, bx, by, bz, shmem) +
      " stream=" + fake_cuda_stream_name(stream);
  FAKE_CUDA_ENTRY("cuLaunchKernel", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!fake_cuda_need_context(what, &r)) return r;
  const FunctionInfo info = function_info(f);
  if (!info.found) return done(what + " unknown_function", CUDA_ERROR_INVALID_HANDLE);
  const int stream_device = fake_cuda_stream_device(stream);
  if (stream_device != info.device)
    return done(what + fake::strf(" function_dev=%d stream_dev=%d", info.device, stream_device),
                CUDA_ERROR_INVALID_HANDLE);
  if (const char* why = bad_dimensions(gx, gy, gz, bx, by, bz))
    return done(what + why, CUDA_ERROR_INVALID_VALUE);
  if (extra != nullptr) return done(what + " extra_unsupported", CUDA_ERROR_NOT_SUPPORTED);
  if (params == nullptr || params[0] == nullptr)
    return done(what + " no_params", CUDA_ERROR_INVALID_VALUE);
  FakeOp op;
  op.kind = FakeOp::Kind::kLaunch;
  op.function = f;
  op.params.resize(sizeof(FakeChunkSumArgs));
  memcpy(op.params.data(), params[0], op.params.size());
  FakeChunkSumArgs a;
  memcpy(&a, op.params.data(), sizeof a);
  what += args_text(a);
  if (const char* why = bad_args(a, fake_chunk_type_bytes(info.type)))
    return done(what + why, CUDA_ERROR_INVALID_VALUE);
  op.what = what;
  return fake_cuda_issue(stream, op);
}

}  // extern "C"

// This file's entry points by base name, as cuGetProcAddress hands them out.
FAKE_HIDDEN void* fake_cuda_kernel_lookup(const char* symbol) {
  struct Entry {
    const char* name;
    void* fn;
  };
  static const Entry kTable[] = {
      {"cuModuleLoadData", reinterpret_cast<void*>(&cuModuleLoadData)},
      {"cuModuleGetFunction", reinterpret_cast<void*>(&cuModuleGetFunction)},
      {"cuModuleUnload", reinterpret_cast<void*>(&cuModuleUnload)},
      {"cuLaunchKernel", reinterpret_cast<void*>(&cuLaunchKernel)},
  };
  for (const Entry& e : kTable)
    if (strcmp(e.name, symbol) == 0) return e.fn;
  return nullptr;
}
