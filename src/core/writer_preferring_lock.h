#pragma once

#include <pthread.h>

namespace zc {

// A reader-writer lock that prefers writers: once a writer waits, new readers queue behind it.
// Every collective looks its communicator up under the shared side, and glibc's default
// (std::shared_mutex, reader-preferring) lets a stream of lookups starve communicator creation
// and destruction for milliseconds. Meets the SharedMutex requirements, so std::unique_lock and
// std::shared_lock work with it.
class WriterPreferringLock {
 public:
  WriterPreferringLock() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&lock_, &attr);
    pthread_rwlockattr_destroy(&attr);
  }
  WriterPreferringLock(const WriterPreferringLock&) = delete;
  WriterPreferringLock& operator=(const WriterPreferringLock&) = delete;
  ~WriterPreferringLock() { pthread_rwlock_destroy(&lock_); }

  void lock() { pthread_rwlock_wrlock(&lock_); }
  bool try_lock() { return pthread_rwlock_trywrlock(&lock_) == 0; }
  void unlock() { pthread_rwlock_unlock(&lock_); }
  void lock_shared() { pthread_rwlock_rdlock(&lock_); }
  bool try_lock_shared() { return pthread_rwlock_tryrdlock(&lock_) == 0; }
  void unlock_shared() { pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_;
};

}  // namespace zc
