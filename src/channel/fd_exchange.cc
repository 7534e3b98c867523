// The fd exchange service and its client (fd_exchange.h). The service thread makes socket
// syscalls and takes one mutex, nothing else; the client is plain blocking-with-deadline
// socket code on a non-blocking socket.
#include "fd_exchange.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "detached_thread.h"
#include "log.h"
#include "monotonic_clock.h"

namespace zc {

namespace {

using fd_wire::Header;

constexpr size_t kMaxRequestBytes = sizeof(Header) + kFdMaxPerMessage * sizeof(uint64_t);
constexpr size_t kMaxReplyBytes =
    sizeof(Header) + kFdMaxPerMessage * (sizeof(uint32_t) + kFdBlobBytes);
// Room for one full SCM_RIGHTS message; the service's receive buffer takes a few, only to
// close what a misbehaving client sends.
constexpr size_t kFdControlBytes = CMSG_SPACE(kFdMaxPerMessage * sizeof(int));
constexpr size_t kStrayControlBytes = CMSG_SPACE(8 * sizeof(int));
constexpr size_t kMaxConnections = 64;
constexpr int kListenBacklog = 128;
constexpr int kBindAttempts = 4;

// "zerocta-" + uid (10 digits) + "-" + pid (up to 11 characters) + "-" + 16 hex + NUL.
static_assert(8 + 10 + 1 + 11 + 1 + 16 + 1 <= kFdAddressMax, "an address fits kFdAddressMax");

void sleep_ms(int64_t ms) {
  if (ms <= 0) return;
  timespec ts{time_t(ms / 1000), long(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

uint64_t random64() {
  uint64_t r = 0;
  if (getrandom(&r, sizeof(r), GRND_NONBLOCK) == ssize_t(sizeof(r))) return r;
  // No entropy yet (early boot): uniqueness is all the address needs.
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  r = uint64_t(ts.tv_sec) * 1000000007ull ^ uint64_t(ts.tv_nsec) << 20 ^ uint64_t(getpid());
  r ^= uint64_t(reinterpret_cast<uintptr_t>(&r));
  return r * 0x9e3779b97f4a7c15ull;
}

void put_header(uint8_t* buf, uint16_t kind, uint32_t count) {
  const Header h{fd_wire::kMagic, fd_wire::kVersion, kind, count, 0};
  memcpy(buf, &h, sizeof(h));
}

// Copies the header out of `buf` and checks the fields every message shares.
bool read_header(const uint8_t* buf, Header* h) {
  memcpy(h, buf, sizeof(*h));
  return h->magic == fd_wire::kMagic && h->version == fd_wire::kVersion && h->reserved == 0;
}

socklen_t abstract_sockaddr(const char* name, size_t len, sockaddr_un* sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  memcpy(sa->sun_path + 1, name, len);  // sun_path[0] == '\0': the abstract namespace
  return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + len);
}

bool peer_credentials(int fd, ucred* cred) {
  socklen_t len = sizeof(*cred);
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) == 0 && len == sizeof(*cred);
}

void close_descriptors(const int* fds, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (fds[i] >= 0) close(fds[i]);
}

// Appends the descriptors of every SCM_RIGHTS message in `msg` to `out`, up to `room` in
// all; the rest are closed. Returns false if more than that came, or any other control
// message.
bool take_descriptors(msghdr* msg, std::vector<int>* out, size_t room) {
  bool clean = true;
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      clean = false;
      continue;
    }
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (out->size() < room) {
        out->push_back(fd);
      } else {
        close(fd);
        clean = false;
      }
    }
  }
  return clean;
}

// Sends all of buf (and `nfds` descriptors with its first byte). With deadline < 0 it never
// waits: what the socket does not take at once is a failure (the service's case).
bool send_all(int fd, const uint8_t* buf, size_t len, const int* fds, size_t nfds, int64_t deadline,
              const char** why) {
  alignas(cmsghdr) uint8_t control[kFdControlBytes];
  size_t sent = 0;
  while (sent < len) {
    iovec iov{const_cast<uint8_t*>(buf + sent), len - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (sent == 0 && nfds > 0) {
      memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
      memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    const ssize_t r = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      sent += size_t(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && deadline >= 0) {
      const int64_t left = deadline - monotonic_ms();
      if (left <= 0) {
        *why = "timed out";
        return false;
      }
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, int(std::min<int64_t>(left, 1000)));
      continue;
    }
    *why = "send failed";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// The service.

struct Conn {
  int fd;
  int64_t deadline_ms;  // closed when no request completes by then
  size_t have;          // bytes of buf holding a partial request
  uint8_t buf[kMaxRequestBytes];
};

}  // namespace

struct FdServiceState {
  char address[kFdAddressMax] = {};
  int listen_fd = -1;
  std::atomic<bool> disabled{false};  // set in a forked child
  // Guards table and next_token, and every change of conns (so that the fork child handler,
  // holding it, finds a consistent list). The service thread reads conns without it.
  std::mutex mu;
  std::unordered_map<uint64_t, int> table;  // token -> the kept duplicate
  std::unordered_map<uint64_t, FdBlob> blobs;  // token (kFdBlobToken set) -> the blob
  uint64_t next_token = 0;
  std::vector<Conn> conns;
};

namespace {

// Start-up and fork handling. Both mutexes are taken by the fork prepare handler, so a fork
// never copies a half-started service or a half-changed table.
pthread_mutex_t g_start_mu = PTHREAD_MUTEX_INITIALIZER;
bool g_started = false;             // guarded by g_start_mu
FdService* g_service = nullptr;     // guarded by g_start_mu; never freed
FdServiceState* g_state = nullptr;  // guarded by g_start_mu; never freed

void fork_prepare() {
  pthread_mutex_lock(&g_start_mu);
  if (g_state != nullptr) g_state->mu.lock();
}

void fork_parent() {
  if (g_state != nullptr) g_state->mu.unlock();
  pthread_mutex_unlock(&g_start_mu);
}

// The thread does not exist in the child: the service is off there, and the child's copies
// of its descriptors are closed (a connection the parent closes must reach EOF at the peer).
void fork_child() {
  if (FdServiceState* s = g_state) {
    s->disabled.store(true, std::memory_order_relaxed);
    if (s->listen_fd >= 0) close(s->listen_fd);
    s->listen_fd = -1;
    for (const Conn& c : s->conns) close(c.fd);
    s->conns.clear();
    for (const auto& entry : s->table) close(entry.second);
    s->table.clear();
    s->blobs.clear();
    s->mu.unlock();
  }
  pthread_mutex_unlock(&g_start_mu);
}

// Registered when the library loads, so no fork can ever run before the handlers exist.
const int g_atfork_registered = pthread_atfork(fork_prepare, fork_parent, fork_child);

void close_conn(FdServiceState* s, size_t i) {
  std::lock_guard<std::mutex> lock(s->mu);
  close(s->conns[i].fd);
  s->conns.erase(s->conns.begin() + ptrdiff_t(i));
}

// Answers one request (`count` tokens at `body`, of `kind`): the statuses and, for a request,
// the found descriptors, for a blob request the blobs, in one message sent without waiting; a
// status request is found by either table. The table lock is held until the kernel has taken
// its references, so a concurrent withdraw cannot close (and reuse) a descriptor being sent.
bool serve_request(FdServiceState* s, int fd, const uint8_t* body, uint32_t count, uint16_t kind) {
  uint8_t reply[kMaxReplyBytes];
  int fds[kFdMaxPerMessage];
  size_t nfds = 0;
  const bool with_fds = kind == fd_wire::kRequest, with_blobs = kind == fd_wire::kBlobRequest;
  put_header(reply,
             with_fds ? fd_wire::kReply : with_blobs ? fd_wire::kBlobReply : fd_wire::kStatusReply,
             count);
  uint8_t* blob_at = reply + sizeof(Header) + count * sizeof(uint32_t);
  const char* why = nullptr;
  std::lock_guard<std::mutex> lock(s->mu);
  for (uint32_t i = 0; i < count; ++i) {
    uint64_t token;
    memcpy(&token, body + i * sizeof(uint64_t), sizeof(token));
    const auto it = s->table.find(token);
    const auto blob = s->blobs.find(token);
    uint32_t status = fd_wire::kUnknown;
    if (with_blobs) {
      memset(blob_at + i * kFdBlobBytes, 0, kFdBlobBytes);
      if (blob != s->blobs.end()) {
        status = fd_wire::kFound;
        memcpy(blob_at + i * kFdBlobBytes, blob->second.bytes, kFdBlobBytes);
      }
    } else if (it != s->table.end()) {
      status = fd_wire::kFound;
      if (with_fds) fds[nfds++] = it->second;
    } else if (!with_fds && blob != s->blobs.end()) {
      status = fd_wire::kFound;
    }
    memcpy(reply + sizeof(Header) + i * sizeof(uint32_t), &status, sizeof(status));
  }
  const size_t bytes =
      sizeof(Header) + count * (sizeof(uint32_t) + (with_blobs ? kFdBlobBytes : 0));
  return send_all(fd, reply, bytes, fds, nfds, -1, &why);
}

// Reads what the connection has and answers every complete message. Returns false when the
// connection must be closed: EOF, an error, a malformed message, descriptors sent to us, or
// a reply the socket would not take at once.
bool serve_readable(FdServiceState* s, Conn* c) {
  iovec iov{c->buf + c->have, sizeof(c->buf) - c->have};
  alignas(cmsghdr) uint8_t control[kStrayControlBytes];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t r = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  if (msg.msg_controllen > 0 || (msg.msg_flags & MSG_CTRUNC) != 0) {
    std::vector<int> stray;
    take_descriptors(&msg, &stray, kFdMaxPerMessage);
    close_descriptors(stray.data(), stray.size());
    return false;
  }
  if (r == 0) return false;
  c->have += size_t(r);
  while (c->have >= sizeof(Header)) {
    Header h;
    if (!read_header(c->buf, &h)) return false;
    size_t need = sizeof(Header);
    if (h.kind == fd_wire::kHello) {
      if (h.count != 0) return false;
    } else if (h.kind == fd_wire::kRequest || h.kind == fd_wire::kStatusRequest ||
               h.kind == fd_wire::kBlobRequest) {
      if (h.count > kFdMaxPerMessage) return false;
      need += h.count * sizeof(uint64_t);
    } else {
      return false;
    }
    if (c->have < need) break;  // need <= sizeof(c->buf), so the next read has room
    bool ok;
    if (h.kind == fd_wire::kHello) {
      uint8_t hello[sizeof(Header)];
      const char* why = nullptr;
      put_header(hello, fd_wire::kHelloReply, 0);
      ok = send_all(c->fd, hello, sizeof(hello), nullptr, 0, -1, &why);
    } else {
      ok = serve_request(s, c->fd, c->buf + sizeof(Header), h.count, h.kind);
    }
    if (!ok) return false;
    memmove(c->buf, c->buf + need, c->have - need);
    c->have -= need;
    c->deadline_ms = monotonic_ms() + kFdServiceIdleMs;
  }
  return true;
}

void accept_connections(FdServiceState* s) {
  for (int i = 0; i < 16; ++i) {
    const int fd = accept4(s->listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the connection stays queued; do not spin on it.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) sleep_ms(10);
      return;
    }
    ucred cred;
    if (!peer_credentials(fd, &cred) || cred.uid != geteuid()) {
      close(fd);  // another user: no answer at all
      continue;
    }
    if (s->conns.size() >= kMaxConnections) {
      // Make room by dropping the connection that has waited longest without a request.
      size_t oldest = 0;
      for (size_t k = 1; k < s->conns.size(); ++k)
        if (s->conns[k].deadline_ms < s->conns[oldest].deadline_ms) oldest = k;
      close_conn(s, oldest);
    }
    std::lock_guard<std::mutex> lock(s->mu);
    s->conns.emplace_back();
    Conn& c = s->conns.back();
    c.fd = fd;
    c.deadline_ms = monotonic_ms() + kFdServiceIdleMs;
    c.have = 0;
  }
}

void* service_main(void* arg) {
  FdServiceState* s = static_cast<FdServiceState*>(arg);
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, nullptr);  // already blocked at creation; keep it so
  std::vector<pollfd> pfds;
  pfds.reserve(kMaxConnections + 1);
  for (;;) {
    const int64_t now = monotonic_ms();
    int timeout = -1;
    for (size_t i = s->conns.size(); i-- > 0;) {
      const int64_t left = s->conns[i].deadline_ms - now;
      if (left <= 0) {
        close_conn(s, i);
        continue;
      }
      if (timeout < 0 || left < timeout) timeout = int(std::min<int64_t>(left, 1 << 30));
    }
    pfds.clear();
    pfds.push_back(pollfd{s->listen_fd, POLLIN, 0});
    for (const Conn& c : s->conns) pfds.push_back(pollfd{c.fd, POLLIN, 0});
    const int ready = poll(pfds.data(), nfds_t(pfds.size()), timeout);
    if (ready < 0) {
      if (errno != EINTR) sleep_ms(10);
      continue;
    }
    if (ready == 0) continue;
    // Connections first, from the back, so that closing one keeps earlier indices valid.
    for (size_t i = s->conns.size(); i-- > 0;) {
      if (pfds[i + 1].revents == 0) continue;
      if (!serve_readable(s, &s->conns[i])) close_conn(s, i);
    }
    if ((pfds[0].revents & POLLIN) != 0) accept_connections(s);
  }
  return nullptr;
}

// Binds a fresh abstract address and starts the thread; nullptr (after a warning) if any
// step fails. The state is never freed: the detached thread may run until the process ends.
FdServiceState* start_service() {
  FdServiceState* s = new FdServiceState();
  s->next_token = random64();
  const char* step = "socket";
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  bool bound = false;
  for (int attempt = 0; fd >= 0 && !bound && attempt < kBindAttempts; ++attempt) {
    step = "bind";
    const int len =
        snprintf(s->address, sizeof(s->address), "zerocta-%u-%d-%016llx", unsigned(geteuid()),
                 int(getpid()), static_cast<unsigned long long>(random64()));
    if (len <= 0 || size_t(len) >= sizeof(s->address)) break;
    sockaddr_un sa;
    const socklen_t sl = abstract_sockaddr(s->address, size_t(len), &sa);
    bound = bind(fd, reinterpret_cast<const sockaddr*>(&sa), sl) == 0;
    if (!bound && errno != EADDRINUSE) break;
  }
  if (bound) step = "listen";
  bool ok = bound && listen(fd, kListenBacklog) == 0;
  if (ok) {
    step = "pthread_create";
    s->listen_fd = fd;
    const int rc = start_detached_thread(service_main, s, "zerocta-fd");
    if (rc != 0) errno = rc;
    ok = rc == 0;
  }
  if (!ok) {
    ZC_WARN("fd exchange: cannot start the service: %s failed: %s", step, strerror(errno));
    if (fd >= 0) close(fd);
    delete s;
    return nullptr;
  }
  ZC_INFO("fd exchange: service listening on @%s", s->address);
  return s;
}

// ---------------------------------------------------------------------------------------
// The client.

// Waits until `fd` is ready for `events` or the deadline passes.
bool wait_ready(int fd, short events, int64_t deadline, const char** why) {
  for (;;) {
    const int64_t left = deadline - monotonic_ms();
    if (left <= 0) {
      *why = "timed out";
      return false;
    }
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, int(std::min<int64_t>(left, 1000)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) {
      *why = "poll failed";
      return false;
    }
  }
}

// Reads exactly `len` bytes before the deadline. Descriptors that come along are appended
// to *fds (at most kFdMaxPerMessage; more is a protocol error), also on failure.
bool recv_exact(int fd, uint8_t* buf, size_t len, int64_t deadline, std::vector<int>* fds,
                const char** why) {
  alignas(cmsghdr) uint8_t control[kFdControlBytes];
  size_t have = 0;
  while (have < len) {
    if (!wait_ready(fd, POLLIN, deadline, why)) return false;
    iovec iov{buf + have, len - have};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      *why = "receive failed";
      return false;
    }
    const bool clean = take_descriptors(&msg, fds, kFdMaxPerMessage);
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      *why = "descriptors truncated (out of descriptors?)";
      return false;
    }
    if (!clean) {
      *why = "unexpected control message";
      return false;
    }
    if (r == 0) {
      *why = "service closed the connection";
      return false;
    }
    have += size_t(r);
  }
  return true;
}

// Connects to the service at `address` and checks its credentials; -1 (with *why) on
// failure. A full backlog (EAGAIN) is retried until the deadline.
int connect_service(const char* address, int expected_pid, int64_t deadline, const char** why) {
  const size_t len = address == nullptr ? 0 : strnlen(address, kFdAddressMax);
  if (len == 0 || len >= kFdAddressMax) {
    *why = "malformed address";
    return -1;
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *why = "socket failed";
    return -1;
  }
  sockaddr_un sa;
  const socklen_t sl = abstract_sockaddr(address, len, &sa);
  int64_t backoff = 1;
  while (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sl) != 0) {
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {
      const int64_t left = deadline - monotonic_ms();
      if (left > 0) {
        sleep_ms(std::min(backoff, left));
        backoff = std::min<int64_t>(backoff * 2, 10);
        continue;
      }
      *why = "timed out";
    } else {
      *why = errno == ECONNREFUSED ? "no service at the address" : "connect failed";
    }
    close(fd);
    return -1;
  }
  ucred cred;
  if (!peer_credentials(fd, &cred)) {
    *why = "cannot read the service's credentials";
  } else if (cred.uid != geteuid()) {
    *why = "service belongs to another user";
  } else if (expected_pid > 0 && cred.pid != expected_pid) {
    *why = "service is not the expected process";
  } else {
    return fd;
  }
  close(fd);
  return -1;
}

// One request/reply round trip for `count` tokens: statuses[i] for each, and with `fds` the
// found descriptors, fds[i] (-1 for the others), or with `blobs` the blobs (blobs[i]).
bool exchange_batch(int fd, const uint64_t* tokens, uint32_t count, uint32_t* statuses, int* fds,
                    FdBlob* blobs, int64_t deadline, const char** why) {
  uint8_t request[kMaxRequestBytes];
  put_header(request,
             fds ? fd_wire::kRequest : blobs ? fd_wire::kBlobRequest : fd_wire::kStatusRequest,
             count);
  memcpy(request + sizeof(Header), tokens, count * sizeof(uint64_t));
  if (!send_all(fd, request, sizeof(Header) + count * sizeof(uint64_t), nullptr, 0, deadline, why))
    return false;
  uint8_t reply[kMaxReplyBytes];
  std::vector<int> got;
  got.reserve(count);
  Header h;
  const uint16_t want =
      fds ? fd_wire::kReply : blobs ? fd_wire::kBlobReply : fd_wire::kStatusReply;
  bool ok = recv_exact(fd, reply, sizeof(Header), deadline, &got, why);
  if (ok && (!read_header(reply, &h) || h.kind != want || h.count != count)) {
    *why = "malformed reply";
    ok = false;
  }
  if (ok)
    ok = recv_exact(fd, reply + sizeof(Header),
                    count * (sizeof(uint32_t) + (blobs ? kFdBlobBytes : 0)), deadline, &got, why);
  size_t next = 0;
  for (uint32_t i = 0; ok && i < count; ++i) {
    memcpy(&statuses[i], reply + sizeof(Header) + i * sizeof(uint32_t), sizeof(uint32_t));
    const bool found = statuses[i] == fd_wire::kFound;
    if ((!found && statuses[i] != fd_wire::kUnknown) || (found && fds && next == got.size())) {
      *why = "malformed reply";
      ok = false;
    } else if (found && fds) {
      fds[i] = got[next++];
    } else if (blobs) {
      memcpy(blobs[i].bytes, reply + sizeof(Header) + count * sizeof(uint32_t) + i * kFdBlobBytes,
             kFdBlobBytes);
    }
  }
  if (ok && next != got.size()) {
    *why = "malformed reply";
    ok = false;
  }
  if (!ok) close_descriptors(got.data() + next, got.size() - next);
  return ok;
}

// Called after each message of ask_service with the tokens it covered, [start, start + count);
// false stops the exchange.
using AfterMessage = std::function<bool(size_t start, uint32_t count)>;

// Asks the service at `address` about `n` tokens, in messages of at most `per_message` (<=
// kFdMaxPerMessage) on one connection: statuses, and with `fds` the descriptors (fd_fetch),
// with `blobs` the blobs. `after` (if set) sees each message's results before the next is sent.
bool ask_service(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
                 uint32_t* statuses, int* fds, FdBlob* blobs, int timeout_ms, const char** why,
                 size_t per_message = kFdMaxPerMessage, const AfterMessage& after = nullptr) {
  const int64_t deadline = monotonic_ms() + timeout_ms;
  const int fd = connect_service(address, expected_pid, deadline, why);
  bool ok = fd >= 0;
  for (size_t start = 0; ok && start < n; start += per_message) {
    const uint32_t count = uint32_t(std::min(n - start, per_message));
    ok = exchange_batch(fd, tokens + start, count, statuses + start, fds ? fds + start : nullptr,
                        blobs ? blobs + start : nullptr, deadline, why);
    if (ok && after && !after(start, count)) {
      *why = "stopped by its caller";
      ok = false;
    }
  }
  if (fd >= 0) close(fd);
  return ok;
}

}  // namespace

const char* FdService::address() const { return state_->address; }

uint64_t FdService::publish(int fd) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->disabled.load(std::memory_order_relaxed)) return 0;
  const int kept = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (kept < 0) return 0;
  uint64_t token;
  do {
    token = state_->next_token++ & ~kFdBlobToken;
  } while (token == 0 || state_->table.count(token) != 0);
  state_->table.emplace(token, kept);
  return token;
}

uint64_t FdService::publish_blob(const FdBlob& blob) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->disabled.load(std::memory_order_relaxed)) return 0;
  uint64_t token;
  do {
    token = state_->next_token++ | kFdBlobToken;
  } while (state_->blobs.count(token) != 0);
  state_->blobs.emplace(token, blob);
  return token;
}

void FdService::withdraw(uint64_t token) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->blobs.erase(token);
  const auto it = state_->table.find(token);
  if (it == state_->table.end()) return;
  close(it->second);
  state_->table.erase(it);
}

FdService* fd_service() {
  (void)g_atfork_registered;
  pthread_mutex_lock(&g_start_mu);
  if (!g_started) {
    g_started = true;
    g_state = start_service();
    if (g_state != nullptr) g_service = new FdService(g_state);
  }
  FdService* service = g_service;
  if (g_state != nullptr && g_state->disabled.load(std::memory_order_relaxed)) service = nullptr;
  pthread_mutex_unlock(&g_start_mu);
  return service;
}

bool fd_fetch(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
              std::vector<int>* fds, int timeout_ms, const char** why) {
  const char* reason = "invalid argument";
  if (fds != nullptr) fds->assign(n, -1);
  bool ok = fds != nullptr && (tokens != nullptr || n == 0) && timeout_ms > 0;
  if (ok && n > 0) {
    std::vector<uint32_t> statuses(n);
    ok = ask_service(address, expected_pid, tokens, n, statuses.data(), fds->data(), nullptr,
                     timeout_ms, &reason);
    if (!ok) {
      close_descriptors(fds->data(), fds->size());
      fds->assign(n, -1);
    }
  }
  if (!ok && why != nullptr) *why = reason;
  return ok;
}

bool fd_fetch_batches(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
                      size_t batch, const FdBatchTaker& take, int timeout_ms, const char** why) {
  const char* reason = "invalid argument";
  bool ok = take && (tokens != nullptr || n == 0) && timeout_ms > 0 && batch > 0 &&
            batch <= kFdMaxPerMessage;
  if (ok && n > 0) {
    std::vector<uint32_t> statuses(n);
    std::vector<int> fds(n, -1);
    size_t taken = 0;  // descriptors [0, taken) are the taker's
    ok = ask_service(address, expected_pid, tokens, n, statuses.data(), fds.data(), nullptr,
                     timeout_ms, &reason, batch, [&](size_t start, uint32_t count) {
                       taken = start + count;
                       return take(start, fds.data() + start, count);
                     });
    if (!ok) close_descriptors(fds.data() + taken, n - taken);
  }
  if (!ok && why != nullptr) *why = reason;
  return ok;
}

bool fd_published(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
                  std::vector<bool>* published, int timeout_ms, const char** why) {
  const char* reason = "invalid argument";
  if (published != nullptr) published->assign(n, false);
  bool ok = published != nullptr && (tokens != nullptr || n == 0) && timeout_ms > 0;
  if (ok && n > 0) {
    std::vector<uint32_t> statuses(n);
    ok = ask_service(address, expected_pid, tokens, n, statuses.data(), nullptr, nullptr,
                     timeout_ms, &reason);
    for (size_t i = 0; ok && i < n; ++i) (*published)[i] = statuses[i] == fd_wire::kFound;
  }
  if (!ok && why != nullptr) *why = reason;
  return ok;
}

bool fd_fetch_blobs(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
                    std::vector<FdBlob>* blobs, std::vector<bool>* found, int timeout_ms,
                    const char** why) {
  const char* reason = "invalid argument";
  if (found != nullptr) found->assign(n, false);
  if (blobs != nullptr) blobs->assign(n, FdBlob{});
  bool ok = blobs != nullptr && found != nullptr && (tokens != nullptr || n == 0) &&
            timeout_ms > 0;
  if (ok && n > 0) {
    std::vector<uint32_t> statuses(n);
    ok = ask_service(address, expected_pid, tokens, n, statuses.data(), nullptr, blobs->data(),
                     timeout_ms, &reason);
    for (size_t i = 0; ok && i < n; ++i) (*found)[i] = statuses[i] == fd_wire::kFound;
  }
  if (!ok && why != nullptr) *why = reason;
  return ok;
}

bool fd_probe(const char* address, int expected_pid, int timeout_ms) {
  if (timeout_ms <= 0) return false;
  const int64_t deadline = monotonic_ms() + timeout_ms;
  const char* why = nullptr;
  const int fd = connect_service(address, expected_pid, deadline, &why);
  if (fd < 0) return false;
  uint8_t hello[sizeof(Header)];
  put_header(hello, fd_wire::kHello, 0);
  std::vector<int> got;
  Header h;
  bool ok = send_all(fd, hello, sizeof(hello), nullptr, 0, deadline, &why) &&
            recv_exact(fd, hello, sizeof(hello), deadline, &got, &why) && got.empty() &&
            read_header(hello, &h) && h.kind == fd_wire::kHelloReply && h.count == 0;
  close_descriptors(got.data(), got.size());
  close(fd);
  return ok;
}

}  // namespace zc
