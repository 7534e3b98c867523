// What the fake CUDA driver's files share (none of it is exported):
//   fake_cuda.cc        devices, contexts, cuGetProcAddress
//   fake_cuda_mem.cc    memory, streams, events, and the stream operations with the one
//                       executor per kind of operation (run now, or replayed by a graph)
//   fake_cuda_graph.cc  stream capture, graphs and their launches, user objects
//   fake_cuda_kernel.cc modules and kernel launches (the library's reduction kernels, which
//                       fake_chunk_sum.cc computes)
#pragma once

#include <cuda.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fake_log.h"

// ---- fake_cuda.cc ----
FAKE_HIDDEN int fake_cuda_current_device();  // -1: no current context on this thread
FAKE_HIDDEN int fake_cuda_device_count();
FAKE_HIDDEN bool fake_cuda_initialized();

// ---- fake_cuda_mem.cc ----
// "cuda <what> pid=<pid> -> <r>" in the log (" thread=zerocta-hk" before " pid=" for a call of
// the shim's housekeeping thread); returns r.
FAKE_HIDDEN CUresult fake_cuda_done(const std::string& what, CUresult r);
// False (the call already answered into *r) when the driver is not initialized or the thread
// has no current context.
FAKE_HIDDEN bool fake_cuda_need_context(const std::string& what, CUresult* r);
FAKE_HIDDEN std::string fake_cuda_stream_name(CUstream s);  // "stream#3", "legacy", ...
FAKE_HIDDEN bool fake_cuda_env_is_1(const char* name);
FAKE_HIDDEN void* fake_cuda_ce_lookup(const char* symbol);  // this file's entry points
// The device whose context `s` belongs to: a stream's own, else (NULL, legacy, per-thread) the
// calling thread's current one (-1: none).
FAKE_HIDDEN int fake_cuda_stream_device(CUstream s);
// CUDA_SUCCESS if [p, p + n) may be accessed with `prot` (PROT_READ/PROT_WRITE); else logs `what`
// with the address and answers CUDA_ERROR_ILLEGAL_ADDRESS.
FAKE_HIDDEN CUresult fake_cuda_access_error(const std::string& what, uintptr_t p, size_t n,
                                            int prot);

// Why an entry point must not go on (code CUDA_SUCCESS: it may). Every entry point asks first:
// a call from a user object's destructor is refused (the real driver forbids CUDA calls
// there), then FAKE_CUDA_DELAY sleeps and FAKE_CUDA_FAIL injects `injected`.
struct FakeCudaRefusal {
  CUresult code;
  const char* why;  // appended to the call's log line
};
FAKE_HIDDEN FakeCudaRefusal fake_cuda_enter(const char* name, CUresult injected);
// The one prologue of every entry point; `done` is the calling file's logger.
#define FAKE_CUDA_ENTRY(name, what, injected)                           \
  if (const FakeCudaRefusal refusal_ = fake_cuda_enter(name, injected); \
      refusal_.code != CUDA_SUCCESS)                                    \
  return done(std::string(what) + refusal_.why, refusal_.code)

// A stream operation as issued: run at once, or recorded into a capture's graph and run at
// every launch of that graph, by the same executor (fake_cuda_run).
struct FakeOp {
  enum class Kind {
    kCopy,          // cuMemcpyAsync: count bytes from src to dst
    kMemsetD32,     // cuMemsetD32Async: count words of value at dst
    kWrite32,       // cuStreamWriteValue32: value at dst
    kWrite64,       // cuStreamWriteValue64
    kWait32,        // cuStreamWaitValue32: until the word at dst satisfies value and flags
    kWait64,        // cuStreamWaitValue64
    kEventRecord,   // cuEventRecord of event (a capture's join point; nothing to run)
    kWaitEvent,     // cuStreamWaitEvent on event (nothing to run: the fake's work is done)
    kUncapturable,  // no capture may hold it (cuMemcpyBatchAsync, cuGraphLaunch): never recorded
    kSync,          // cuStreamSynchronize/cuStreamQuery: refused on an explicit capture
    kLaunch,        // cuLaunchKernel of function with the argument bytes params
  };
  Kind kind = Kind::kCopy;
  std::string what;  // the issuing call as logged, e.g. "cuMemcpyAsync dst=... stream=stream#3"
  CUdeviceptr dst = 0, src = 0;
  size_t count = 0;
  uint64_t value = 0;
  unsigned flags = 0;
  const void* event = nullptr;
  CUfunction function = nullptr;
  std::vector<unsigned char> params;  // copied at the call, as CUDA copies a kernel's arguments
};
// Runs `op` now, in the calling thread, and logs op.what + tail + its outcome.
FAKE_HIDDEN CUresult fake_cuda_run(const FakeOp& op, const std::string& tail);
// Issues `op` on `stream` as every stream operation is: recorded if the stream is in a capture,
// else run now (and its outcome logged).
FAKE_HIDDEN CUresult fake_cuda_issue(CUstream stream, const FakeOp& op);

// ---- fake_cuda_graph.cc ----
// What the capture machinery made of an issued operation: run it now (run), or it was
// recorded into a capture's graph, or refused, with `result` and `note` for its log line.
struct FakeCudaRecorded {
  bool run = true;
  CUresult result = CUDA_SUCCESS;
  std::string note;  // " captured=<id>", with the reason of a refusal
};
FAKE_HIDDEN FakeCudaRecorded fake_cuda_record(CUstream stream, const FakeOp& op);
// A destroyed stream or event leaves its capture (its address may come back for a new one).
FAKE_HIDDEN void fake_cuda_forget(const void* stream_or_event);
// Graphs, execs and user objects not yet destroyed ("graph", "exec", "userobj"); -1 for any
// other kind.
FAKE_HIDDEN int fake_cuda_graph_live(const std::string& kind);
FAKE_HIDDEN bool fake_cuda_in_user_object_destructor();
FAKE_HIDDEN void* fake_cuda_graph_lookup(const char* symbol);  // this file's entry points

// ---- fake_cuda_kernel.cc ----
// Runs a kLaunch operation (the launch's own executor; op.what + its outcome logged as `what`).
FAKE_HIDDEN CUresult fake_cuda_run_launch(const FakeOp& op, const std::string& what);
FAKE_HIDDEN int fake_cuda_module_live();                       // modules not yet unloaded
FAKE_HIDDEN void* fake_cuda_kernel_lookup(const char* symbol);  // this file's entry points
