// How many more file descriptors this process may open, and what the route leaves of them.
//
// The route's own descriptors: the fd service keeps a duplicate per exported allocation
// (fd_exchange.h), and an import receives one per allocation, closed as soon as it is imported
// (the driver keeps no descriptor per imported or mapped allocation). A process near its
// RLIMIT_NOFILE (a soft limit of 1024 on many distributions) must never see an op fail, let
// alone a communicator poisoned, for want of them:
//   post     a rank with fewer than kFdOpReserve free descriptors posts its buffers as
//            unreachable until twice as many are free (ce_allgather.cc): when it is the first
//            to arrive, the op goes to NCCL on every rank; a later rank takes part as any rank
//            whose buffers cannot be reached (it does both copies of its pairs, or stages),
//            which needs imports only (and a stage's one export, made from the reserve);
//   exports  none is made with fewer than kFdOpReserve free, nor beyond fd_export_cap() kept by
//            the service (peer_memory.cc): a buffer that cannot be exported is unreachable, as
//            above, and the exports of freed allocations go within a housekeeping period;
//   imports  fetched kFdImportBatch at a time at most, fewer when fewer are free, each batch
//            imported and its descriptors closed before the next (peer_memory.cc): what stays
//            of kFdOpReserve after a post is enough for them.
// Each shortage, and the end of it, is one INFO line per process.
#pragma once

#include <cstdint>

namespace zc {

// Descriptors an import receives at once at most: 32 allocations (640 MiB of PyTorch's 20 MiB
// segments) per round trip to the owner's service, a small share of any limit.
constexpr int64_t kFdImportBatch = 32;
// Descriptors an import leaves free beside its batch: the connection to the owner's service
// and the driver's own transient ones.
constexpr int64_t kFdImportSpare = 4;
// Free descriptors a rank needs to post its buffers as reachable (and to export one more
// allocation): two import batches, so that whatever role the arrival order gives it, its
// imports fit in what is left.
constexpr int64_t kFdOpReserve = 2 * kFdImportBatch;

// The soft RLIMIT_NOFILE minus the descriptors open now (/proc/self/fd), counted afresh when it
// is low or the last count is old (fd_headroom.cc); INT64_MAX when it cannot be told (no limit,
// no /proc).
int64_t fd_headroom();
// `n` descriptors this process opened for good since (an export's duplicate): the next answer of
// fd_headroom counts them even when it does not count afresh.
void fd_headroom_opened(int64_t n);
// Descriptors the fd service may keep for exports: half the soft limit, the other half left to
// the application (NCCL's sockets, data loaders) and to imports.
uint64_t fd_export_cap();
// Whether this rank may post its buffers as reachable in an op (kFdOpReserve free; twice that
// to end a shortage); logs the start and the end of a shortage.
bool fd_room_for_op();
// How many descriptors an import may receive at once now: kFdImportBatch, fewer when the
// headroom is small, 0 when not even one fits beside kFdImportSpare.
int64_t fd_import_batch();
// An export was refused: the service keeps fd_export_cap() of them, or too few descriptors are
// free. Logged as a shortage (once until one succeeds again: fd_export_made).
void fd_export_refused(uint64_t kept);
void fd_export_made();

}  // namespace zc
