#include <pthread.h>

#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "comm_state.h"

namespace zc {
namespace {

// A reader-writer lock that prefers writers: every collective looks its communicator up, and
// glibc's default (std::shared_mutex) lets a stream of lookups starve communicator creation
// and destruction for milliseconds (tests/unit/registry_concurrency_test.cc measures it).
class RwLock {
 public:
  RwLock() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  void lock() { pthread_rwlock_wrlock(&lock_); }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

struct Registry {
  RwLock mu;
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
  std::shared_lock<RwLock> lock(r.mu);
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
  std::unique_lock<RwLock> lock(r.mu);
  r.map[comm] = std::move(st);
}

std::shared_ptr<CommState> comm_remove(ncclComm_t comm) {
  Registry& r = registry();
  std::unique_lock<RwLock> lock(r.mu);
  auto it = r.map.find(comm);
  if (it == r.map.end()) return nullptr;
  auto s = it->second;
  r.map.erase(it);
  return s;
}

}  // namespace zc
