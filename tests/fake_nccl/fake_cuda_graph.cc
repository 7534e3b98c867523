// The fake CUDA driver's stream capture, graphs and user objects (libcuda.so.1; the streams and
// the operations themselves are fake_cuda_mem.cc's). Handed out by cuGetProcAddress with
// FAKE_CUDA_CE=1, by base name, as the 12.0 ABI (cuStreamBeginCapture is
// cuStreamBeginCapture_v2, cuStreamGetCaptureInfo is cuStreamGetCaptureInfo_v2, cuGraphInstantiate
// is cuGraphInstantiateWithFlags), and exported under those names for drivers that link them.
//
// Capture:
//   cuStreamBeginCapture(s, mode)   a new capture (ids from 2 on) into a new graph; the mode is
//                                   logged, not enforced. NULL/legacy stream: STREAM_CAPTURE_
//                                   UNSUPPORTED; a stream already capturing: ILLEGAL_STATE.
//   While a stream is in a capture, its operations (cuMemcpyAsync, cuMemsetD32Async,
//   cuStreamWrite/WaitValue32/64, cuEventRecord, cuStreamWaitEvent) are recorded into the
//   capture's graph, arguments and all, and not run: their lines end in " captured=<id>".
//   Nothing touches memory until a launch (addresses are checked then).
//   Joining: cuEventRecord(e, s) on a capturing s marks e as recorded in that capture;
//   cuStreamWaitEvent(s2, e) then makes s2 join it (" joined"): its later operations go to the
//   same graph, which keeps one list in issue order. A stream of another capture waiting for
//   e: STREAM_CAPTURE_ISOLATION. An eager cuEventRecord clears the mark.
//   Refused on a capturing stream, invalidating its capture (as in CUDA): cuMemcpyBatchAsync
//   and cuGraphLaunch (STREAM_CAPTURE_UNSUPPORTED); cuStreamSynchronize and cuStreamQuery too,
//   but only in an explicit capture. Once invalidated, a capture refuses every operation
//   (STREAM_CAPTURE_INVALIDATED) and cuStreamIsCapturing answers INVALIDATED.
//   cuStreamEndCapture(origin, &g)  ends the capture for the origin and every stream that
//                                   joined it; another stream of it: STREAM_CAPTURE_UNMATCHED.
//                                   An invalidated capture (or the first one ended after
//                                   FAKE_CUDA_INVALIDATE_CAPTURE=1 is set; once per process)
//                                   answers STREAM_CAPTURE_INVALIDATED with g = NULL, and its
//                                   graph is destroyed (its user-object references dropped).
//   cuStreamIsCapturing, cuStreamGetCaptureInfo (12.0 signature; every out pointer may be NULL;
//   no dependencies are reported) tell a stream's capture.
//   FAKE_CUDA_CAPTURING=1: besides, every stream but NULL and the legacy one is in one implicit
//   process-wide capture (id 1, graph#0) that is never ended: its operations are logged as
//   captured=1 and never run, its graph takes user objects but is never launched or destroyed
//   (and fake_cuda_live does not count it).
//
// Graphs: cuGraphInstantiate copies a graph's operations into an exec, which takes its own
// references to the graph's user objects (as CUDA does). cuGraphLaunch(exec, s) runs the
// operations in order in the calling thread with the executors of eager operations (copies copy,
// writes store, waits poll under FAKE_CUDA_WAIT_MS alike), each logged as issued plus
// " replay=exec#N", then "cuGraphLaunch exec#N ops=K". cuGraphExecDestroy and cuGraphDestroy
// release their references; a graph still capturing cannot be instantiated or destroyed
// (ILLEGAL_STATE).
//
// User objects: cuUserObjectCreate (flags must be CU_USER_OBJECT_NO_DESTRUCTOR_SYNC, else
// INVALID_VALUE, as in CUDA), cuUserObjectRetain/Release, cuGraphRetainUserObject (flags 0: new
// references owned by the graph; CU_GRAPH_USER_OBJECT_MOVE: count of the caller's references
// move to it) and cuGraphReleaseUserObject. Releasing or moving more references than the caller
// (or the graph) holds is INVALID_VALUE here, where CUDA leaves it undefined. When an object's
// count reaches 0 its destructor runs on a thread of its own, joined before the call that
// dropped the last reference returns (so tests stay deterministic); a cu* call of the fake from
// that thread fails with NOT_PERMITTED and logs "called from a user-object destructor", as the
// real driver forbids CUDA calls there.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fake_cuda_internal.h"
#include "fake_log.h"

namespace {

constexpr uint64_t kImplicitCapture = 1;  // FAKE_CUDA_CAPTURING=1's

struct FakeUserObject {
  int id = 0;
  void* ptr = nullptr;
  CUhostFn destroy = nullptr;
  unsigned count = 0;  // every reference
  unsigned owned = 0;  // those graphs and execs hold: the caller holds count - owned
};
using Refs = std::map<FakeUserObject*, unsigned>;  // the references a graph or exec owns

struct FakeGraph {
  int id = 0;
  uint64_t capture = 0;  // the capture still recording into it (0: none)
  std::vector<FakeOp> ops;
  Refs refs;
};
struct FakeExec {
  int id = 0;
  std::vector<FakeOp> ops;
  Refs refs;
};
struct Capture {
  FakeGraph* graph = nullptr;
  const void* origin = nullptr;
  bool invalidated = false;
};

// The tables are never destroyed: a thread of the program may still call in at exit.
std::mutex g_mu;  // guards everything below
auto& g_graphs = *new std::set<FakeGraph*>;
auto& g_execs = *new std::set<FakeExec*>;
auto& g_objects = *new std::set<FakeUserObject*>;
auto& g_captures = *new std::map<uint64_t, Capture>;       // explicit captures in progress, by id
auto& g_stream_in = *new std::map<const void*, uint64_t>;  // stream -> its explicit capture
auto& g_event_in = *new std::map<const void*, uint64_t>;   // event -> capture it was recorded in
FakeGraph* g_implicit_graph = nullptr;                     // made at first use, never destroyed
int g_next_graph = 1, g_next_exec = 1, g_next_object = 1;
uint64_t g_next_capture = 2;
std::atomic<bool> g_invalidation_used{false};

thread_local bool t_in_destructor = false;
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult done(const std::string& what, CUresult r) { return fake_cuda_done(what, r); }
std::string id_text(uint64_t id) { return fake::strf("%llu", static_cast<unsigned long long>(id)); }

bool legacy(const void* s) { return s == nullptr || s == CU_STREAM_LEGACY; }

// The helpers below expect their caller to hold g_mu, but for the *_name ones (which lock it)
// and run_destructors (which must run without it).

// The capture `s` is in: its explicit one, else the implicit one, else 0.
uint64_t capture_of(const void* s) {
  auto it = g_stream_in.find(s);
  if (it != g_stream_in.end()) return it->second;
  return !legacy(s) && fake_cuda_env_is_1("FAKE_CUDA_CAPTURING") ? kImplicitCapture : 0;
}

bool invalidated(uint64_t capture) {
  auto it = g_captures.find(capture);
  return it != g_captures.end() && it->second.invalidated;
}

FakeGraph* graph_of(uint64_t capture) {
  if (capture != kImplicitCapture) return g_captures.at(capture).graph;
  if (g_implicit_graph == nullptr) {
    g_implicit_graph = new FakeGraph;
    g_implicit_graph->capture = kImplicitCapture;
    g_graphs.insert(g_implicit_graph);
  }
  return g_implicit_graph;
}

template <typename T, typename Handle>
T* known(const std::set<T*>& set, Handle h) {
  T* p = reinterpret_cast<T*>(h);
  return set.count(p) ? p : nullptr;
}

// Drops `n` references to `o`, `owned` by a graph or exec or not; an object whose count reaches
// 0 leaves the table and goes to `dying`, for run_destructors once g_mu is released.
void drop(FakeUserObject* o, unsigned n, bool owned, std::vector<FakeUserObject*>* dying) {
  o->count -= n;
  if (owned) o->owned -= n;
  if (o->count == 0) {
    g_objects.erase(o);
    dying->push_back(o);
  }
}
std::vector<FakeUserObject*> drop_all(const Refs& refs) {
  std::vector<FakeUserObject*> dying;
  for (const auto& [o, n] : refs) drop(o, n, true, &dying);
  return dying;
}

// Without g_mu: a destructor's own (refused) cu* calls name streams and such under locks.
// `by`: the entry point that dropped the last references (its own line comes after).
void run_destructors(const std::vector<FakeUserObject*>& dying, const char* by) {
  for (FakeUserObject* o : dying) {
    done(fake::strf("userObjectDestructor userobj#%d ptr=", o->id) + fake::hex_ptr(o->ptr) +
             " by=" + by,
         CUDA_SUCCESS);
    std::thread([o] {
      t_in_destructor = true;
      o->destroy(o->ptr);
    }).join();
    delete o;
  }
}

std::string graph_name(CUgraph g) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (FakeGraph* p = known(g_graphs, g)) return fake::strf("graph#%d", p->id);
  return fake::hex_ptr(g);
}
std::string exec_name(CUgraphExec e) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (FakeExec* p = known(g_execs, e)) return fake::strf("exec#%d", p->id);
  return fake::hex_ptr(e);
}
std::string object_name(CUuserObject o) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (FakeUserObject* p = known(g_objects, o)) return fake::strf("userobj#%d", p->id);
  return fake::hex_ptr(o);
}

FakeOp op_of(FakeOp::Kind kind, const std::string& what) {
  FakeOp op;
  op.kind = kind;
  op.what = what;
  return op;
}

// A refusal that spoils the capture, as an unsupported call during capture does in CUDA.
FakeCudaRecorded refuse(uint64_t capture, CUresult code, const char* why) {
  auto it = g_captures.find(capture);
  if (it != g_captures.end()) it->second.invalidated = true;
  FakeCudaRecorded rec;
  rec.run = false;
  rec.result = code;
  rec.note = " captured=" + id_text(capture) + why;
  return rec;
}

}  // namespace

FAKE_HIDDEN FakeCudaRecorded fake_cuda_record(CUstream stream, const FakeOp& op) {
  std::lock_guard<std::mutex> lock(g_mu);
  uint64_t capture = capture_of(stream);
  std::string joined;
  switch (op.kind) {
    case FakeOp::Kind::kUncapturable:
      if (capture != 0)
        return refuse(capture, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, " unsupported");
      break;
    case FakeOp::Kind::kSync:
      if (capture != 0 && capture != kImplicitCapture)
        return refuse(capture, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, " unsupported");
      return FakeCudaRecorded{};  // the implicit capture lets it run (it never did otherwise)
    case FakeOp::Kind::kEventRecord:
      if (capture != 0)
        g_event_in[op.event] = capture;
      else
        g_event_in.erase(op.event);
      break;
    case FakeOp::Kind::kWaitEvent: {
      auto e = g_event_in.find(op.event);
      const uint64_t from = e == g_event_in.end() ? 0 : e->second;
      if (from != 0 && capture != 0 && from != capture)
        return refuse(capture, CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                      (" isolation event_capture=" + id_text(from)).c_str());
      if (from != 0 && capture == 0) {
        if (legacy(stream)) return refuse(from, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, " legacy");
        g_stream_in[stream] = capture = from;
        joined = " joined";
      }
      break;
    }
    default:
      break;
  }
  if (capture == 0) return FakeCudaRecorded{};
  FakeCudaRecorded rec;
  rec.run = false;
  rec.note = " captured=" + id_text(capture) + joined;
  if (invalidated(capture)) {
    rec.result = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    rec.note += " invalidated";
    return rec;
  }
  // The implicit capture's graph is never launched: nothing of its operations is kept.
  if (capture != kImplicitCapture) graph_of(capture)->ops.push_back(op);
  return rec;
}

FAKE_HIDDEN void fake_cuda_forget(const void* stream_or_event) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stream_in.erase(stream_or_event);
  g_event_in.erase(stream_or_event);
}

FAKE_HIDDEN int fake_cuda_graph_live(const std::string& kind) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (kind == "graph") return static_cast<int>(g_graphs.size() - (g_implicit_graph ? 1 : 0));
  if (kind == "exec") return static_cast<int>(g_execs.size());
  if (kind == "userobj") return static_cast<int>(g_objects.size());
  return -1;
}

FAKE_HIDDEN bool fake_cuda_in_user_object_destructor() { return t_in_destructor; }

extern "C" {

// ---- Capture ----

CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode) {
  std::string what = "cuStreamBeginCapture stream=" + fake_cuda_stream_name(stream) +
                     fake::strf(" mode=%d", static_cast<int>(mode));
  FAKE_CUDA_ENTRY("cuStreamBeginCapture", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!fake_cuda_need_context(what, &r)) return r;
  if (legacy(stream)) return done(what + " legacy_stream", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  std::lock_guard<std::mutex> lock(g_mu);
  if (const uint64_t already = capture_of(stream))
    return done(what + " already_capturing=" + id_text(already), CUDA_ERROR_ILLEGAL_STATE);
  auto* g = new FakeGraph;
  g->id = g_next_graph++;
  g->capture = g_next_capture++;
  g_graphs.insert(g);
  g_captures[g->capture] = Capture{g, stream, false};
  g_stream_in[stream] = g->capture;
  return done(what + " capture=" + id_text(g->capture) + fake::strf(" graph=graph#%d", g->id),
              CUDA_SUCCESS);
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph_out) {
  std::string what = "cuStreamEndCapture stream=" + fake_cuda_stream_name(stream);
  FAKE_CUDA_ENTRY("cuStreamEndCapture", what, CUDA_ERROR_UNKNOWN);
  if (graph_out == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::unique_lock<std::mutex> lock(g_mu);
  auto in = g_stream_in.find(stream);
  if (in == g_stream_in.end()) {
    const bool implicit = capture_of(stream) == kImplicitCapture;
    return done(what + (implicit ? " implicit_capture" : " not_capturing"),
                CUDA_ERROR_ILLEGAL_STATE);
  }
  const uint64_t id = in->second;
  const Capture cap = g_captures.at(id);
  if (cap.origin != stream)
    return done(what + " capture=" + id_text(id) + " not_its_origin",
                CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  for (auto* m : {&g_stream_in, &g_event_in})
    for (auto it = m->begin(); it != m->end();) it = it->second == id ? m->erase(it) : ++it;
  g_captures.erase(id);
  FakeGraph* g = cap.graph;
  g->capture = 0;
  what += " capture=" + id_text(id) + fake::strf(" graph=graph#%d ops=%zu", g->id, g->ops.size());
  const bool by_env = !cap.invalidated && fake_cuda_env_is_1("FAKE_CUDA_INVALIDATE_CAPTURE") &&
                      !g_invalidation_used.exchange(true);
  if (cap.invalidated || by_env) {
    *graph_out = nullptr;
    g_graphs.erase(g);
    const std::vector<FakeUserObject*> dying = drop_all(g->refs);
    lock.unlock();
    delete g;
    run_destructors(dying, "cuStreamEndCapture");
    return done(what + (by_env ? " invalidated_by_env" : " invalidated"),
                CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }
  *graph_out = reinterpret_cast<CUgraph>(g);
  return done(what, CUDA_SUCCESS);
}

CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  std::string what = "cuStreamIsCapturing stream=" + fake_cuda_stream_name(stream);
  FAKE_CUDA_ENTRY("cuStreamIsCapturing", what, CUDA_ERROR_UNKNOWN);
  if (status == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  const uint64_t capture = capture_of(stream);
  if (capture == 0) {
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return done(what + " status=none", CUDA_SUCCESS);
  }
  const bool bad = invalidated(capture);
  *status = bad ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return done(
      what + (bad ? " status=invalidated" : " status=active") + " capture=" + id_text(capture),
      CUDA_SUCCESS);
}

// The 12.0 signature; cuda.h of CUDA 13 maps cuStreamGetCaptureInfo to _v3 (below).
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, CUstreamCaptureStatus* status_out,
                                   cuuint64_t* id_out, CUgraph* graph_out,
                                   const CUgraphNode** deps_out, size_t* num_deps_out) {
  std::string what = "cuStreamGetCaptureInfo stream=" + fake_cuda_stream_name(stream);
  FAKE_CUDA_ENTRY("cuStreamGetCaptureInfo", what, CUDA_ERROR_UNKNOWN);
  std::lock_guard<std::mutex> lock(g_mu);
  const uint64_t capture = capture_of(stream);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  if (capture != 0) {
    status = invalidated(capture) ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    graph = reinterpret_cast<CUgraph>(graph_of(capture));
    what += " capture=" + id_text(capture) +
            fake::strf(" graph=graph#%d", reinterpret_cast<FakeGraph*>(graph)->id);
  }
  if (status_out) *status_out = status;
  if (id_out) *id_out = capture;
  if (graph_out) *graph_out = graph;
  if (deps_out) *deps_out = nullptr;
  if (num_deps_out) *num_deps_out = 0;
  return done(what + fake::strf(" status=%d", static_cast<int>(status)), CUDA_SUCCESS);
}

CUresult cuStreamGetCaptureInfo_v3(CUstream stream, CUstreamCaptureStatus* status_out,
                                   cuuint64_t* id_out, CUgraph* graph_out,
                                   const CUgraphNode** deps_out,
                                   const CUgraphEdgeData** edge_data_out, size_t* num_deps_out) {
  if (edge_data_out) *edge_data_out = nullptr;
  return cuStreamGetCaptureInfo_v2(stream, status_out, id_out, graph_out, deps_out, num_deps_out);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  std::string what = "cuThreadExchangeStreamCaptureMode";
  FAKE_CUDA_ENTRY("cuThreadExchangeStreamCaptureMode", what, CUDA_ERROR_UNKNOWN);
  if (mode == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  const CUstreamCaptureMode old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return done(
      what + fake::strf(" set=%d old=%d", static_cast<int>(t_capture_mode), static_cast<int>(old)),
      CUDA_SUCCESS);
}

// ---- Graphs ----

// cuda.h names it cuGraphInstantiateWithFlags, the 12.0 ABI of cuGraphInstantiate.
CUresult cuGraphInstantiate(CUgraphExec* exec_out, CUgraph graph, unsigned long long flags) {
  std::string what =
      "cuGraphInstantiate graph=" + graph_name(graph) + fake::strf(" flags=%llu", flags);
  FAKE_CUDA_ENTRY("cuGraphInstantiate", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!fake_cuda_need_context(what, &r)) return r;
  if (exec_out == nullptr) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  FakeGraph* g = known(g_graphs, graph);
  if (g == nullptr) return done(what + " unknown_graph", CUDA_ERROR_INVALID_HANDLE);
  if (g->capture != 0) return done(what + " still_capturing", CUDA_ERROR_ILLEGAL_STATE);
  auto* e = new FakeExec;
  e->id = g_next_exec++;
  e->ops = g->ops;
  e->refs = g->refs;
  for (const auto& [o, n] : e->refs) {
    o->count += n;
    o->owned += n;
  }
  g_execs.insert(e);
  *exec_out = reinterpret_cast<CUgraphExec>(e);
  return done(what + fake::strf(" exec=exec#%d ops=%zu", e->id, e->ops.size()), CUDA_SUCCESS);
}

// The operations run in the calling thread, from a copy taken at the call: a wait may poll for
// FAKE_CUDA_WAIT_MS, and no lock of the fake's is held meanwhile.
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  std::vector<FakeOp> ops;
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (FakeExec* e = known(g_execs, exec)) {
      found = true;
      ops = e->ops;
    }
  }
  const std::string name = exec_name(exec);
  std::string what = "cuGraphLaunch " + name + fake::strf(" ops=%zu", ops.size()) +
                     " stream=" + fake_cuda_stream_name(stream);
  FAKE_CUDA_ENTRY("cuGraphLaunch", what, CUDA_ERROR_UNKNOWN);
  CUresult r;
  if (!fake_cuda_need_context(what, &r)) return r;
  if (!found) return done(what + " unknown_exec", CUDA_ERROR_INVALID_HANDLE);
  const FakeCudaRecorded rec = fake_cuda_record(stream, op_of(FakeOp::Kind::kUncapturable, what));
  if (!rec.run) return done(what + rec.note, rec.result);
  for (size_t i = 0; i < ops.size(); ++i)
    if ((r = fake_cuda_run(ops[i], " replay=" + name)) != CUDA_SUCCESS)
      return done(what + fake::strf(" failed_at=%zu", i), r);
  return done(what, CUDA_SUCCESS);
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  std::string what = "cuGraphExecDestroy " + exec_name(exec);
  FAKE_CUDA_ENTRY("cuGraphExecDestroy", what, CUDA_ERROR_UNKNOWN);
  std::unique_lock<std::mutex> lock(g_mu);
  FakeExec* e = known(g_execs, exec);
  if (e == nullptr) return done(what + " unknown_exec", CUDA_ERROR_INVALID_HANDLE);
  g_execs.erase(e);
  const std::vector<FakeUserObject*> dying = drop_all(e->refs);
  lock.unlock();
  delete e;
  run_destructors(dying, "cuGraphExecDestroy");
  return done(what, CUDA_SUCCESS);
}

CUresult cuGraphDestroy(CUgraph graph) {
  std::string what = "cuGraphDestroy " + graph_name(graph);
  FAKE_CUDA_ENTRY("cuGraphDestroy", what, CUDA_ERROR_UNKNOWN);
  std::unique_lock<std::mutex> lock(g_mu);
  FakeGraph* g = known(g_graphs, graph);
  if (g == nullptr) return done(what + " unknown_graph", CUDA_ERROR_INVALID_HANDLE);
  if (g->capture != 0) return done(what + " still_capturing", CUDA_ERROR_ILLEGAL_STATE);
  g_graphs.erase(g);
  const std::vector<FakeUserObject*> dying = drop_all(g->refs);
  lock.unlock();
  delete g;
  run_destructors(dying, "cuGraphDestroy");
  return done(what, CUDA_SUCCESS);
}

// ---- User objects ----

CUresult cuUserObjectCreate(CUuserObject* object_out, void* ptr, CUhostFn destroy,
                            unsigned int initial_refcount, unsigned int flags) {
  std::string what = "cuUserObjectCreate ptr=" + fake::hex_ptr(ptr) +
                     fake::strf(" refcount=%u flags=%u", initial_refcount, flags);
  FAKE_CUDA_ENTRY("cuUserObjectCreate", what, CUDA_ERROR_UNKNOWN);
  if (object_out == nullptr || destroy == nullptr || initial_refcount == 0)
    return done(what, CUDA_ERROR_INVALID_VALUE);
  if (flags != CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)
    return done(what + " flags_not_no_destructor_sync", CUDA_ERROR_INVALID_VALUE);
  auto* o = new FakeUserObject;
  o->ptr = ptr;
  o->destroy = destroy;
  o->count = initial_refcount;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    o->id = g_next_object++;
    g_objects.insert(o);
  }
  *object_out = reinterpret_cast<CUuserObject>(o);
  return done(what + fake::strf(" object=userobj#%d", o->id), CUDA_SUCCESS);
}

CUresult cuUserObjectRetain(CUuserObject object, unsigned int count) {
  std::string what = "cuUserObjectRetain " + object_name(object) + fake::strf(" count=%u", count);
  FAKE_CUDA_ENTRY("cuUserObjectRetain", what, CUDA_ERROR_UNKNOWN);
  if (count == 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  FakeUserObject* o = known(g_objects, object);
  if (o == nullptr) return done(what + " unknown_object", CUDA_ERROR_INVALID_HANDLE);
  o->count += count;
  return done(what + fake::strf(" refs=%u", o->count), CUDA_SUCCESS);
}

CUresult cuUserObjectRelease(CUuserObject object, unsigned int count) {
  std::string what = "cuUserObjectRelease " + object_name(object) + fake::strf(" count=%u", count);
  FAKE_CUDA_ENTRY("cuUserObjectRelease", what, CUDA_ERROR_UNKNOWN);
  if (count == 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::unique_lock<std::mutex> lock(g_mu);
  FakeUserObject* o = known(g_objects, object);
  if (o == nullptr) return done(what + " unknown_object", CUDA_ERROR_INVALID_HANDLE);
  if (count > o->count - o->owned)
    return done(what + fake::strf(" caller_holds=%u", o->count - o->owned),
                CUDA_ERROR_INVALID_VALUE);
  std::vector<FakeUserObject*> dying;
  drop(o, count, false, &dying);
  what += fake::strf(" refs=%u", o->count);
  lock.unlock();
  run_destructors(dying, "cuUserObjectRelease");
  return done(what, CUDA_SUCCESS);
}

CUresult cuGraphRetainUserObject(CUgraph graph, CUuserObject object, unsigned int count,
                                 unsigned int flags) {
  std::string what = "cuGraphRetainUserObject " + graph_name(graph) + " " + object_name(object) +
                     fake::strf(" count=%u flags=%u", count, flags);
  FAKE_CUDA_ENTRY("cuGraphRetainUserObject", what, CUDA_ERROR_UNKNOWN);
  if (count == 0 || (flags != 0 && flags != CU_GRAPH_USER_OBJECT_MOVE))
    return done(what, CUDA_ERROR_INVALID_VALUE);
  std::lock_guard<std::mutex> lock(g_mu);
  FakeGraph* g = known(g_graphs, graph);
  FakeUserObject* o = known(g_objects, object);
  if (g == nullptr || o == nullptr)
    return done(what + " unknown_handle", CUDA_ERROR_INVALID_HANDLE);
  if (flags == CU_GRAPH_USER_OBJECT_MOVE) {
    if (count > o->count - o->owned)
      return done(what + fake::strf(" caller_holds=%u", o->count - o->owned),
                  CUDA_ERROR_INVALID_VALUE);
  } else {
    o->count += count;
  }
  o->owned += count;
  g->refs[o] += count;
  return done(what + fake::strf(" refs=%u graph_refs=%u", o->count, g->refs[o]), CUDA_SUCCESS);
}

CUresult cuGraphReleaseUserObject(CUgraph graph, CUuserObject object, unsigned int count) {
  std::string what = "cuGraphReleaseUserObject " + graph_name(graph) + " " + object_name(object) +
                     fake::strf(" count=%u", count);
  FAKE_CUDA_ENTRY("cuGraphReleaseUserObject", what, CUDA_ERROR_UNKNOWN);
  if (count == 0) return done(what, CUDA_ERROR_INVALID_VALUE);
  std::unique_lock<std::mutex> lock(g_mu);
  FakeGraph* g = known(g_graphs, graph);
  FakeUserObject* o = known(g_objects, object);
  if (g == nullptr || o == nullptr)
    return done(what + " unknown_handle", CUDA_ERROR_INVALID_HANDLE);
  auto held = g->refs.find(o);
  const unsigned graph_holds = held == g->refs.end() ? 0 : held->second;
  if (count > graph_holds)
    return done(what + fake::strf(" graph_holds=%u", graph_holds), CUDA_ERROR_INVALID_VALUE);
  if ((held->second -= count) == 0) g->refs.erase(held);
  std::vector<FakeUserObject*> dying;
  drop(o, count, true, &dying);
  what += fake::strf(" refs=%u", o->count);
  lock.unlock();
  run_destructors(dying, "cuGraphReleaseUserObject");
  return done(what, CUDA_SUCCESS);
}

}  // extern "C"

// This file's entry points by base name, as cuGetProcAddress hands them out (the 12.0 ABI).
FAKE_HIDDEN void* fake_cuda_graph_lookup(const char* symbol) {
  struct Entry {
    const char* name;
    void* fn;
  };
  static const Entry kTable[] = {
      {"cuStreamBeginCapture", reinterpret_cast<void*>(&cuStreamBeginCapture)},
      {"cuStreamEndCapture", reinterpret_cast<void*>(&cuStreamEndCapture)},
      {"cuStreamIsCapturing", reinterpret_cast<void*>(&cuStreamIsCapturing)},
      {"cuStreamGetCaptureInfo", reinterpret_cast<void*>(&cuStreamGetCaptureInfo_v2)},
      {"cuThreadExchangeStreamCaptureMode",
       reinterpret_cast<void*>(&cuThreadExchangeStreamCaptureMode)},
      {"cuGraphInstantiate", reinterpret_cast<void*>(&cuGraphInstantiate)},
      {"cuGraphInstantiateWithFlags", reinterpret_cast<void*>(&cuGraphInstantiate)},
      {"cuGraphLaunch", reinterpret_cast<void*>(&cuGraphLaunch)},
      {"cuGraphExecDestroy", reinterpret_cast<void*>(&cuGraphExecDestroy)},
      {"cuGraphDestroy", reinterpret_cast<void*>(&cuGraphDestroy)},
      {"cuUserObjectCreate", reinterpret_cast<void*>(&cuUserObjectCreate)},
      {"cuUserObjectRetain", reinterpret_cast<void*>(&cuUserObjectRetain)},
      {"cuUserObjectRelease", reinterpret_cast<void*>(&cuUserObjectRelease)},
      {"cuGraphRetainUserObject", reinterpret_cast<void*>(&cuGraphRetainUserObject)},
      {"cuGraphReleaseUserObject", reinterpret_cast<void*>(&cuGraphReleaseUserObject)},
  };
  for (const Entry& e : kTable)
    if (strcmp(e.name, symbol) == 0) return e.fn;
  return nullptr;
}
