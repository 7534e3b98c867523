// The worker's end of its two pipes to the parent, plus fatal(): report an error to the parent
// and exit. A rank that fails must not leave its peers waiting silently, so every error path
// in a worker goes through fatal(); the parent then kills the whole rank group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "protocol.h"

namespace zcb {

class Channel {
 public:
  Channel(int in_fd, int out_fd, int rank) : in_fd_(in_fd), out_fd_(out_fd), rank_(rank) {}

  // Sends one message (thread-safe). Returns false if the parent is gone.
  bool send(MsgType type, const void* payload, size_t len);
  // Blocks for the next parent->worker message, which must be of `type` and `len` bytes.
  // Returns false on EOF, a short read or an unexpected message.
  bool receive(MsgType type, void* payload, size_t len);

  // Barrier over every process of this path that also returns the max of `value` over them.
  uint64_t agree_max(uint64_t value);

  int rank() const { return rank_; }

 private:
  int in_fd_;
  int out_fd_;
  int rank_;
  std::mutex send_mu_;
  std::mutex agree_mu_;
};

// The channel fatal() reports through (set once by the worker's main).
void set_fatal_channel(Channel* ch);

// Sends "rank R: <message>" as an ErrorMsg (also to stderr) and _exit(1)s.
[[noreturn]] void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace zcb
