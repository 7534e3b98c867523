#include "parked_routes.h"

#include <mutex>
#include <utility>
#include <vector>

#include "captured_ops.h"
#include "cuda_driver.h"
#include "log.h"
#include "op_exchange.h"

namespace zc {
namespace {

struct Parked {
  std::shared_ptr<CaptureLife> life;
  std::vector<CUevent> drained;  // recorded on each stream at the teardown
  int device = -1;
  OpExchange* ops = nullptr;  // owned by life
  uint64_t seq = 0;
};

std::mutex g_mu;
std::vector<Parked>* g_parked = new std::vector<Parked>;  // never freed: used until exit

// Whether every event has passed; an event that cannot be asked counts as passed (its stream's
// context is gone, and with it the work).
bool drained(const CudaDriver& cu, const Parked& p) {
  for (CUevent e : p.drained)
    if (cu.cuEventQuery(e) == CUDA_ERROR_NOT_READY) return false;
  return true;
}

void destroy_events(const CudaDriver& cu, Parked* p) {
  for (CUevent e : p->drained)
    if (e) cu.cuEventDestroy(e);
  p->drained.clear();
}

}  // namespace

void free_when_drained(std::shared_ptr<CaptureLife> life, const CUstream* streams, CUevent* events,
                       int n, CUevent recorded, int device, OpExchange* ops, uint64_t seq) {
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  Parked p{std::move(life), {}, device, ops, seq};
  ScopedDevice on(device);
  bool unknown = false;  // a stream whose end cannot be told: parked until exit
  for (int k = 0; k < n; ++k) {
    if (!streams[k]) continue;
    CUevent e = events[k];
    events[k] = nullptr;  // the parked entry's now
    if (!e || cu->cuEventRecord(e, streams[k]) != CUDA_SUCCESS) unknown = true;
    if (e) p.drained.push_back(e);
  }
  if (recorded) p.drained.push_back(recorded);
  if (!unknown && drained(*cu, p)) {
    destroy_events(*cu, &p);
    return;  // p.life goes here, and with its last reference what it holds
  }
  if (unknown) p.drained.push_back(nullptr);
  ZC_INFO(
      "route: dev %d: the route's streams still hold queued work at its teardown; what they "
      "address stays mapped until it has run (its waits are released)",
      device);
  std::lock_guard<std::mutex> lock(g_mu);
  g_parked->push_back(std::move(p));
}

void collect_drained_routes() {
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  std::vector<Parked> done;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_parked->empty()) return;
    for (auto it = g_parked->begin(); it != g_parked->end();) {
      bool can_ask = true;
      for (CUevent e : it->drained) can_ask &= e != nullptr;
      if (can_ask && drained(*cu, *it)) {
        done.push_back(std::move(*it));
        it = g_parked->erase(it);
      } else {
        if (it->ops) it->ops->release_all(it->seq);
        ++it;
      }
    }
  }
  for (Parked& p : done) {
    ScopedDevice on(p.device);
    destroy_events(*cu, &p);
    p.life.reset();
  }
}

void release_parked_flags() {
  std::lock_guard<std::mutex> lock(g_mu);
  for (Parked& p : *g_parked)
    if (p.ops) p.ops->release_all(p.seq);
}

int parked_routes() {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<int>(g_parked->size());
}

}  // namespace zc
