#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "comm_state.h"
#include "writer_preferring_lock.h"

namespace zc {
namespace {

struct Registry {
  // Writer-preferring: lookups from every collective must not starve creation and teardown.
  WriterPreferringLock mu;
  std::unordered_map<ncclComm_t, std::shared_ptr<CommState>> map;
};

Registry& registry() {
  // Never destroyed: wrappers may run during exit from other threads.
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

std::shared_ptr<CommState> comm_lookup(ncclComm_t comm) {
  Registry& r = registry();
  std::shared_lock<WriterPreferringLock> lock(r.mu);
  auto it = r.map.find(comm);
  return it == r.map.end() ? nullptr : it->second;
}

std::shared_ptr<CommState> comm_add(ncclComm_t comm) {
  auto s = std::make_shared<CommState>();
  comm_insert(comm, s);
  return s;
}

void comm_insert(ncclComm_t comm, std::shared_ptr<CommState> st) {
  st->comm = comm;
  Registry& r = registry();
  std::unique_lock<WriterPreferringLock> lock(r.mu);
  r.map[comm] = std::move(st);
}

std::shared_ptr<CommState> comm_remove(ncclComm_t comm) {
  Registry& r = registry();
  std::unique_lock<WriterPreferringLock> lock(r.mu);
  auto it = r.map.find(comm);
  if (it == r.map.end()) return nullptr;
  auto s = it->second;
  r.map.erase(it);
  return s;
}

}  // namespace zc
