// Fake NCCL: memory, buffer and window registration, custom reduction operators (numbered per
// rank, as NCCL numbers them per communicator).
// ncclMemAlloc hands out host memory (these tests run without a GPU).
// ncclCommWindowRegister calls the public ncclCommRegister from a thread of its own, the way
// the real NCCL calls its API from its internal threads: a shim must recognise such inner
// calls by the caller's address, not by a thread-local "inside NCCL" flag.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

#include "fake_nccl_internal.h"

using fake::finish;
using fake::name_of;
using fake::strf;

namespace {

struct Window {
  void* reg_handle = nullptr;
};

// The pre-multiplied sums made and not destroyed. Their numbers are mangled by the rank, as
// NCCL mangles them by the communicator's address (ncclUserRedOpMangle): one op's number
// differs from rank to rank.
std::mutex g_redops_mu;
std::set<int> g_redops;
int g_next_redop = 0;

int mangled_redop(int index, int rank) { return (ncclNumOps + index) ^ ((rank + 1) << 8); }

}  // namespace

namespace fake {
bool redop_exists(int op) {
  std::lock_guard<std::mutex> lock(g_redops_mu);
  return op >= 0 && (op < ncclNumOps || g_redops.count(op) != 0);
}
}  // namespace fake

ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  std::string line = strf("ncclMemAlloc size=%zu", size);
  if (fake::should_fail("ncclMemAlloc")) return finish(line, ncclInternalError);
  if (ptr == nullptr) return finish(line, ncclInvalidArgument);
  *ptr = malloc(size ? size : 1);
  if (*ptr == nullptr) return finish(line, ncclSystemError);
  fake::register_object(fake::Kind::kMem, *ptr);
  fake::log_line(line + " -> 0 ptr=" + name_of(*ptr));
  return ncclSuccess;
}
FAKE_PNCCL_ALIAS(ncclMemAlloc)

ncclResult_t ncclMemFree(void* ptr) {
  std::string line = "ncclMemFree ptr=" + name_of(ptr);
  if (fake::should_fail("ncclMemFree")) return finish(line, ncclInternalError);
  if (!fake::unregister_object(fake::Kind::kMem, ptr)) return finish(line, ncclInvalidArgument);
  free(ptr);
  return finish(line, ncclSuccess);
}
FAKE_PNCCL_ALIAS(ncclMemFree)

ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  std::string line = "ncclCommRegister comm=" + name_of(comm) + " buff=" + fake::hex_ptr(buff) +
                     strf(" size=%zu", size);
  if (fake::should_fail("ncclCommRegister")) return finish(line, ncclInternalError);
  if (fake::find_comm(comm) == nullptr || handle == nullptr)
    return finish(line, ncclInvalidArgument);
  *handle = malloc(1);
  fake::register_object(fake::Kind::kReg, *handle);
  fake::log_line(line + " -> 0 handle=" + name_of(*handle));
  return ncclSuccess;
}
FAKE_PNCCL_ALIAS(ncclCommRegister)

ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  std::string line = "ncclCommDeregister comm=" + name_of(comm) + " handle=" + name_of(handle);
  if (fake::should_fail("ncclCommDeregister")) return finish(line, ncclInternalError);
  if (fake::find_comm(comm) == nullptr || !fake::unregister_object(fake::Kind::kReg, handle))
    return finish(line, ncclInvalidArgument);
  free(handle);
  return finish(line, ncclSuccess);
}
FAKE_PNCCL_ALIAS(ncclCommDeregister)

ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  std::string line = "ncclCommWindowRegister comm=" + name_of(comm) +
                     " buff=" + fake::hex_ptr(buff) + strf(" size=%zu flags=%d", size, winFlags);
  if (fake::should_fail("ncclCommWindowRegister")) return finish(line, ncclInternalError);
  if (fake::find_comm(comm) == nullptr || win == nullptr) return finish(line, ncclInvalidArgument);
  auto* w = new Window;
  ncclResult_t inner = ncclInternalError;
  // A plain call to the exported symbol: it goes through the PLT, so a preloaded shim's
  // ncclCommRegister receives it, with a return address inside this library.
  std::thread t([&] { inner = ncclCommRegister(comm, buff, size, &w->reg_handle); });
  t.join();
  if (inner != ncclSuccess) {
    delete w;
    return finish(line, inner);
  }
  fake::register_object(fake::Kind::kWin, w);
  if (fake::defer_window_if_grouped(win, reinterpret_cast<ncclWindow_t>(w))) {
    fake::log_line(line + " -> 0 win=" + name_of(w) + " at group end");
    return ncclSuccess;
  }
  // NCCL runs the registration as a group job; on a non-blocking comm the job is asynchronous:
  // ncclInProgress now, the handle written when a poll sees the job done.
  if (fake::Comm* c = fake::find_comm(comm); c->nonblocking) {
    *win = nullptr;
    fake::defer_window_until_polled(c, win, reinterpret_cast<ncclWindow_t>(w));
    fake::log_line(line + " -> 7 win=" + name_of(w) + " when polled");
    return ncclInProgress;
  }
  *win = reinterpret_cast<ncclWindow_t>(w);
  fake::log_line(line + " -> 0 win=" + name_of(w));
  return ncclSuccess;
}
FAKE_PNCCL_ALIAS(ncclCommWindowRegister)

ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  std::string line = "ncclCommWindowDeregister comm=" + name_of(comm) + " win=" + name_of(win);
  if (fake::should_fail("ncclCommWindowDeregister")) return finish(line, ncclInternalError);
  if (fake::find_comm(comm) == nullptr || !fake::unregister_object(fake::Kind::kWin, win))
    return finish(line, ncclInvalidArgument);
  auto* w = reinterpret_cast<Window*>(win);
  // Released internally, without a second API call (only the two inner calls above exist).
  if (fake::unregister_object(fake::Kind::kReg, w->reg_handle)) free(w->reg_handle);
  delete w;
  return finish(line, ncclSuccess);
}
FAKE_PNCCL_ALIAS(ncclCommWindowDeregister)

ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  std::string line = "ncclRedOpCreatePreMulSum scalar=" + fake::hex_ptr(scalar) +
                     strf(" datatype=%d residence=%d comm=", static_cast<int>(datatype),
                          static_cast<int>(residence)) +
                     name_of(comm);
  if (fake::should_fail("ncclRedOpCreatePreMulSum")) return finish(line, ncclInternalError);
  fake::Comm* fc = fake::find_comm(comm);
  if (op == nullptr || fc == nullptr) return finish(line, ncclInvalidArgument);
  {
    std::lock_guard<std::mutex> lock(g_redops_mu);
    *op = static_cast<ncclRedOp_t>(mangled_redop(g_next_redop++, fc->rank));
    g_redops.insert(*op);
  }
  fake::log_line(line + strf(" -> 0 op=%d", static_cast<int>(*op)));
  return ncclSuccess;
}
FAKE_PNCCL_ALIAS(ncclRedOpCreatePreMulSum)

ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  std::string line = strf("ncclRedOpDestroy op=%d comm=", static_cast<int>(op)) + name_of(comm);
  if (fake::should_fail("ncclRedOpDestroy")) return finish(line, ncclInternalError);
  if (fake::find_comm(comm) == nullptr || op < ncclNumOps) return finish(line, ncclInvalidArgument);
  std::lock_guard<std::mutex> lock(g_redops_mu);
  if (g_redops.erase(op) == 0) return finish(line, ncclInvalidArgument);
  return finish(line, ncclSuccess);
}
FAKE_PNCCL_ALIAS(ncclRedOpDestroy)
