// The diagnostic build's account of an op's phases on the device (stream_phase_times.h).
#include "stream_phase_times.h"

#ifdef ZC_STREAM_PHASE_TIMES
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "diagnostic_quantiles.h"

namespace zc {
namespace {

using QueryFn = CUresult (*)(CUevent);
using ElapsedFn = CUresult (*)(float*, CUevent, CUevent);

struct Mark {
  std::string label;
  CUevent ev = nullptr;
};

struct MarkedOp {
  CUcontext ctx = nullptr;
  std::string shape;  // "in place, 16 MiB a chunk": ops of one shape are summarised together
  std::vector<Mark> marks;
};

struct Phases {
  std::mutex mu;
  QueryFn query = nullptr;
  ElapsedFn elapsed = nullptr;
  std::vector<CUevent> free_events;
  std::deque<MarkedOp> pending;
  MarkedOp* open = nullptr;                       // the op being issued, or none (captured)
  std::map<CUcontext, CUevent> last_end;          // per GPU: the previous read op's last mark
  std::vector<std::string> order;                 // labels in first-seen order
  std::map<std::string, std::vector<double>> us;  // label -> microseconds after the op's first mark
};

Phases& phases() {
  static auto* p = new Phases;
  return *p;
}

const char* stream_name(DirectStream s) {
  static const char* names[] = {"user", "push", "pull", "local"};
  return names[static_cast<int>(s)];
}

std::string op_shape(const std::vector<DirectOp>& plan) {
  bool local_copy = false;
  uint64_t chunk = 0;
  for (const DirectOp& op : plan)
    if (op.kind == DirectOpKind::kCopy) {
      chunk = op.bytes;
      local_copy |= op.stream == DirectStream::kLocal;
    }
  char buf[64];
  snprintf(buf, sizeof buf, "%s %.1fMiB", local_copy ? "oop" : "ip", chunk / 1048576.0);
  return buf;
}

std::string step_label(const std::vector<DirectOp>& plan, size_t i, int index) {
  const DirectOp& op = plan[i];
  char buf[96];
  // Indexed by DirectOpKind: the flag operations of a step go in one batch (ce_exec.cc).
  static const char* const kWhat[] = {"flags", "flags", "flags", "copy", "record", "wait-event"};
  static_assert(sizeof kWhat / sizeof kWhat[0] == static_cast<int>(DirectOpKind::kWaitEvent) + 1);
  const char* what = kWhat[static_cast<int>(op.kind)];
  snprintf(buf, sizeof buf, "%02d %s %s", index, stream_name(op.stream), what);
  return buf;
}

void note(Phases& p, const std::string& label, double v) {
  auto it = p.us.find(label);
  if (it == p.us.end()) {
    p.order.push_back(label);
    it = p.us.emplace(label, std::vector<double>{}).first;
  }
  it->second.push_back(v);
}

// Reads the finished ops (in issue order: a later op cannot finish before an earlier one of the
// same communicator) and returns their events to the pool.
void drain(Phases& p) {
  while (!p.pending.empty()) {
    MarkedOp& op = p.pending.front();
    if (op.marks.empty() || p.query(op.marks.back().ev) != CUDA_SUCCESS) return;
    const CUevent first = op.marks.front().ev;
    for (size_t k = 1; k < op.marks.size(); ++k) {
      float ms = 0;
      if (p.elapsed(&ms, first, op.marks[k].ev) == CUDA_SUCCESS)
        note(p, op.shape + " " + op.marks[k].label, ms * 1000.0f);
    }
    auto prev = p.last_end.find(op.ctx);
    if (prev != p.last_end.end()) {
      float ms = 0;
      if (p.elapsed(&ms, prev->second, first) == CUDA_SUCCESS)
        note(p, op.shape + " -- gap after the previous op", ms * 1000.0f);
      p.free_events.push_back(prev->second);
    }
    p.last_end[op.ctx] = op.marks.back().ev;
    for (size_t k = 0; k + 1 < op.marks.size(); ++k) p.free_events.push_back(op.marks[k].ev);
    p.pending.pop_front();
  }
}

void report() {
  Phases& p = phases();
  std::lock_guard<std::mutex> lock(p.mu);
  drain(p);
  for (const std::string& label : p.order)
    print_quantiles("stream-phase", label.c_str(), p.us[label]);
}

bool resolve(Phases& p) {
  if (p.query) return true;
  void* h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY);
  if (!h) return false;
  p.query = reinterpret_cast<QueryFn>(dlsym(h, "cuEventQuery"));
  p.elapsed = reinterpret_cast<ElapsedFn>(dlsym(h, "cuEventElapsedTime"));
  if (!p.query || !p.elapsed) return false;
  atexit(report);
  return true;
}

}  // namespace

void phase_begin(const CudaDriver& cu, const std::vector<DirectOp>& plan) {
  Phases& p = phases();
  std::lock_guard<std::mutex> lock(p.mu);
  p.open = nullptr;
  for (const DirectOp& op : plan)
    if (op.kind == DirectOpKind::kWaitSignal) return;  // captured: events would become nodes
  if (!resolve(p)) return;
  drain(p);
  p.pending.emplace_back();
  p.open = &p.pending.back();
  p.open->shape = op_shape(plan);
  cu.cuCtxGetCurrent(&p.open->ctx);
}

void phase_after(const CudaDriver& cu, const std::vector<DirectOp>& plan, size_t i, CUstream s) {
  Phases& p = phases();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.open) return;
  const DirectOp& op = plan[i];
  // Marks where a phase ends: the user's stream, the push stream's steps (the critical path of
  // "each pushes"), and the pull stream's copies (that of "later does both").
  const bool marked = op.stream == DirectStream::kUser || op.stream == DirectStream::kPush ||
                      (op.stream == DirectStream::kPull && op.kind == DirectOpKind::kCopy);
  if (!marked) return;
  CUevent ev = nullptr;
  if (!p.free_events.empty()) {
    ev = p.free_events.back();
    p.free_events.pop_back();
  } else if (cu.cuEventCreate(&ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    return;
  }
  if (cu.cuEventRecord(ev, s) != CUDA_SUCCESS) {
    p.free_events.push_back(ev);
    return;
  }
  p.open->marks.push_back({step_label(plan, i, static_cast<int>(p.open->marks.size())), ev});
}

void phase_end() {
  Phases& p = phases();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.open && p.open->marks.empty()) p.pending.pop_back();
  p.open = nullptr;
}

}  // namespace zc
#endif
