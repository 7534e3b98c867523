#include <shared_mutex>
#include <unordered_map>

#include "comm_state.h"

namespace zc {
namespace {

struct Registry {
  std::shared_mutex mu;
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
  std::shared_lock<std::shared_mutex> lock(r.mu);
  auto it = r.map.find(comm);
  return it == r.map.end() ? nullptr : it->second;
}

std::shared_ptr<CommState> comm_add(ncclComm_t comm) {
  auto s = std::make_shared<CommState>();
  s->comm = comm;
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mu);
  r.map[comm] = s;
  return s;
}

std::shared_ptr<CommState> comm_remove(ncclComm_t comm) {
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mu);
  auto it = r.map.find(comm);
  if (it == r.map.end()) return nullptr;
  auto s = it->second;
  r.map.erase(it);
  return s;
}

}  // namespace zc
