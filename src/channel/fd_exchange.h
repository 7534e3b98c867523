// The fd exchange: how ranks of one communicator that live in different processes of one
// host hand each other exported cuMem handles (POSIX file descriptors) without waiting for
// the other process's application thread.
//
// Glossary:
//   service  one per process, started on first use: a detached thread ("zerocta-fd") that
//            answers requests on an abstract-namespace UNIX stream socket. It makes socket
//            syscalls only (never CUDA, never NCCL), so it cannot deadlock with the driver.
//   address  the socket's abstract name, "zerocta-<uid>-<pid>-<16 hex>", without the
//            leading NUL; always shorter than kFdAddressMax, so it fits a char[48].
//   token    a 64-bit number (never 0) that names one published descriptor; the service
//            keeps its own close-on-exec duplicate of it until it is withdrawn. A token with
//            kFdBlobToken set names a published blob instead: the 64 bytes of a FABRIC handle
//            (cuMem memory of an IMEX node exports no descriptor), handed over inline.
//
// Trust: both ends check SO_PEERCRED. The service serves only connections of its own
// effective uid; the client accepts only a service of its own effective uid and, when asked,
// of the expected pid.
//
// Wire format (both ends are on one host, so fields are in host byte order): a 16-byte
// header {magic, version, kind, count, reserved = 0} followed by `count` items. A request
// carries up to kFdMaxPerMessage 64-bit tokens; its reply carries one 32-bit status per
// token and, through SCM_RIGHTS, one descriptor per "found" status, in token order. A status
// request is the same without descriptors: which tokens are still published. A hello (count
// 0) is answered by a hello (count 0). A blob request carries tokens too; its reply carries one
// status per token, then kFdBlobBytes per token (zeros for an unknown one), no descriptor.
// Anything else, including descriptors sent to the service, closes the connection.
//
// fork(): in a child forked after the service started, fd_service() returns nullptr (the
// thread does not exist there) and the child's copies of the service's descriptors are
// closed; fd_fetch and fd_probe work in any process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace zc {

// Size of an address buffer, including the terminating NUL.
constexpr size_t kFdAddressMax = 48;
// Tokens per request message and descriptors per reply message (the kernel's SCM_MAX_FD).
constexpr size_t kFdMaxPerMessage = 253;
// The service closes a connection that has not completed a request for this long.
constexpr int kFdServiceIdleMs = 2000;
// A published blob's size (a CUmemFabricHandle), and the bit its tokens carry.
constexpr size_t kFdBlobBytes = 64;
constexpr uint64_t kFdBlobToken = uint64_t{1} << 63;
struct FdBlob {
  uint8_t bytes[kFdBlobBytes];
};

// The wire format, shared by both ends (and by tests that speak it by hand).
namespace fd_wire {
constexpr uint32_t kMagic = 0x4446435a;  // "ZCFD" in little-endian memory
constexpr uint16_t kVersion = 1;
enum Kind : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kRequest = 3,
  kReply = 4,
  kStatusRequest = 5,
  kStatusReply = 6,
  kBlobRequest = 7,
  kBlobReply = 8,
};
enum Status : uint32_t { kFound = 1, kUnknown = 2 };
struct Header {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint32_t count;     // items after the header: tokens (uint64_t) or statuses (uint32_t)
  uint32_t reserved;  // 0
};
static_assert(sizeof(Header) == 16, "the header is 16 bytes on the wire");
}  // namespace fd_wire

struct FdServiceState;

class FdService {
 public:
  FdService(const FdService&) = delete;
  FdService& operator=(const FdService&) = delete;

  // The abstract socket name, without the leading NUL; NUL-terminated, < kFdAddressMax.
  const char* address() const;
  // Keeps a close-on-exec duplicate of `fd` and returns its token (never 0); 0 when `fd`
  // cannot be duplicated or in a forked child.
  uint64_t publish(int fd);
  // Keeps a copy of `blob` and returns its token (kFdBlobToken set); 0 in a forked child.
  uint64_t publish_blob(const FdBlob& blob);
  // Closes the kept duplicate (forgets the blob); later requests for `token` answer
  // "unknown". Unknown tokens are ignored.
  void withdraw(uint64_t token);

 private:
  friend FdService* fd_service();
  explicit FdService(FdServiceState* state) : state_(state) {}
  FdServiceState* const state_;
};

// This process's service, started on first call; never freed. nullptr when it could not be
// started (socket error) or in a child forked after it started.
FdService* fd_service();

// Client side, from any thread and any process (makes no CUDA call). Connects to `address`,
// checks the service's credentials (same effective uid; pid == expected_pid when
// expected_pid > 0), asks for `tokens` (split into messages of at most kFdMaxPerMessage on
// one connection) and sets *fds to one close-on-exec descriptor per token, -1 for a token
// the service does not know; the caller closes them. On failure returns false, sets *why
// (a static string) when why is not null, and leaves n entries of -1 in *fds (nothing to
// close). Returns within timeout_ms (> 0) in total.
bool fd_fetch(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
              std::vector<int>* fds, int timeout_ms, const char** why);

// fd_fetch with at most `batch` (1 .. kFdMaxPerMessage) descriptors received at once: one
// message per `batch` tokens on one connection, each handed to `take` before the next is asked
// for. take(first, fds, count) gets the descriptors of tokens [first, first + count) (-1 for a
// token the service does not know) and owns them from then on (it closes them, typically once
// imported); it returns false to stop. So a process near its descriptor limit imports a buffer
// of many allocations a batch at a time (fd_headroom.h). Credentials and failure as in fd_fetch.
using FdBatchTaker = std::function<bool(size_t first, const int* fds, size_t count)>;
bool fd_fetch_batches(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
                      size_t batch, const FdBatchTaker& take, int timeout_ms, const char** why);

// The blobs of `tokens` (each with kFdBlobToken) from the service at `address`: (*found)[i]
// says whether token i is published, (*blobs)[i] holds its bytes then. Credentials, splitting
// and failure as in fd_fetch.
bool fd_fetch_blobs(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
                    std::vector<FdBlob>* blobs, std::vector<bool>* found, int timeout_ms,
                    const char** why);

// Which of `tokens` the service at `address` still publishes: (*published)[i] says token i's
// descriptor is there. Credentials and failure as in fd_fetch (*published is then all false).
// Lets a process that imported a peer's allocation learn that the peer freed it.
bool fd_published(const char* address, int expected_pid, const uint64_t* tokens, size_t n,
                  std::vector<bool>* published, int timeout_ms, const char** why);

// Reachability check: connect, credentials as in fd_fetch, one hello round trip, within
// timeout_ms (> 0).
bool fd_probe(const char* address, int expected_pid, int timeout_ms);

}  // namespace zc
