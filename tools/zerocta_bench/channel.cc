#include "channel.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

namespace zcb {

namespace {

Channel* g_fatal_channel = nullptr;

bool write_all(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool read_all(int fd, void* data, size_t len) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

bool Channel::send(MsgType type, const void* payload, size_t len) {
  // One buffer, one write: under PIPE_BUF the kernel keeps it whole even with several threads.
  std::vector<char> buf(sizeof(MsgHeader) + len);
  MsgHeader h{type, static_cast<uint32_t>(len)};
  memcpy(buf.data(), &h, sizeof(h));
  if (len) memcpy(buf.data() + sizeof(h), payload, len);
  std::lock_guard<std::mutex> lock(send_mu_);
  return write_all(out_fd_, buf.data(), buf.size());
}

bool Channel::receive(MsgType type, void* payload, size_t len) {
  MsgHeader h{};
  if (!read_all(in_fd_, &h, sizeof(h))) return false;
  if (h.type != type || h.len != len) return false;
  return read_all(in_fd_, payload, len);
}

uint64_t Channel::agree_max(uint64_t value) {
  std::lock_guard<std::mutex> lock(agree_mu_);
  AgreeMsg m{value};
  if (!send(kMsgAgree, &m, sizeof(m))) fatal("lost the parent during a barrier");
  AgreeMsg r{};
  if (!receive(kMsgAgreed, &r, sizeof(r))) fatal("lost the parent during a barrier");
  return r.value;
}

void set_fatal_channel(Channel* ch) { g_fatal_channel = ch; }

void fatal(const char* fmt, ...) {
  ErrorMsg m{};
  m.rank = g_fatal_channel ? g_fatal_channel->rank() : -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m.text, sizeof(m.text), fmt, ap);
  va_end(ap);
  fprintf(stderr, "zerocta-bench: rank %d: %s\n", m.rank, m.text);
  fflush(stderr);
  if (g_fatal_channel) g_fatal_channel->send(kMsgError, &m, sizeof(m));
  // _exit: no static destructors, no NCCL teardown that could hang on a broken peer.
  _exit(1);
}

}  // namespace zcb
