// Shared pieces of the fake NCCL: the object registry that gives every handle a stable
// name in the log (comm#1, mem#2, ...), config and id formatting, failure injection.
//
// Handles are logged by name rather than address so that two runs of the same program (with
// and without a shim in front) produce comparable logs even though heap addresses differ.
// A pointer the fake did not hand out is logged as hex, which makes a shim that substitutes
// its own handles visible.
#pragma once

#include <nccl.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fake_log.h"

// Real NCCL exports pncclX as an alias of ncclX (the profiling entry points); so do we.
#define FAKE_PNCCL_ALIAS(name) \
  extern "C" decltype(name) p##name __attribute__((alias(#name), visibility("default")));

namespace fake {

enum class Kind { kComm, kMem, kReg, kWin };

// Where a communicator's initialisation stands (fake_nccl_state.cc). Without the knobs of
// fake_nccl_state.cc every communicator is kReady from its creation on, except one created
// inside a group, which is kGrouped until the outermost ncclGroupEnd of its thread.
enum class State {
  kReady,       // answers rank/size/device, takes any call
  kGrouped,     // init deferred to the group end: rank/size/device answer 0, as in NCCL
  kInProgress,  // non-blocking init (or split) running: NCCL rejects other calls
  kFailed,      // init failed: calls answer async_error
};

// An init that waits for its peers (FAKE_NCCL_RENDEZVOUS_DIR): each rank's file is
// prefix + rank; the init completes once the files of all `members` exist.
struct Rendezvous {
  bool active = false;
  bool done = false;
  std::string prefix;
  std::vector<int> members;
  long long deadline_ms = 0;  // steady clock; 0 until the wait starts
  // Split: every parent rank's file holds "color key"; the child is made of the ranks of
  // this rank's color, ordered by (key, parent rank).
  bool split = false;
  int color = 0;
  int parent_rank = 0;
  int entered = 0;  // files found by the last check (for the failure message)
  // A grouped init enters at the group's end, where NCCL's bootstrap runs: rank and content of
  // its file until then (enter_rank < 0: entered, or nothing to enter).
  int enter_rank = -1;
  std::string enter_content;
};

struct Comm {
  int nranks = 0;
  int rank = 0;
  int device = -1;
  std::vector<unsigned char> config;  // the bytes of the config the comm was created with
  ncclResult_t async_error = ncclSuccess;

  // NCCL-like life cycle (fake_nccl_state.cc); changed under state_mutex().
  std::atomic<State> state{State::kReady};
  bool nonblocking = false;                // created non-blocking (config or NCCL_COMM_BLOCKING)
  int polls_left = 0;                      // ncclCommGetAsyncError calls still in progress
  ncclResult_t init_result = ncclSuccess;  // what the init ends with (FAKE_NCCL_FAIL_RANK)
  std::string key;                         // rendezvous key of this instance
  int splits = 0;                          // splits and shrinks of this comm so far
  Rendezvous rv;
  bool async_init = false;      // the init ends in ncclCommGetAsyncError (non-blocking model)
  Comm* parent = nullptr;       // split child: the parent that runs its init
  ncclComm_t* slot = nullptr;   // split child: where its handle goes when its init ends
  std::vector<Comm*> children;  // non-blocking split of this parent: children in progress
  std::thread inner;            // FAKE_NCCL_INNER_THREAD: the fake "NCCL thread" of the init
  // Windows registered on a ready non-blocking comm: as NCCL's asynchronous group job, the
  // handle is written to *first only when a poll sees the job done (window_polls_left polls
  // answer ncclInProgress first).
  std::vector<std::pair<ncclWindow_t*, ncclWindow_t>> pending_windows;
  int window_polls_left = 0;
};

// Registers `p` under the next name of its kind ("comm#3").
FAKE_HIDDEN void register_object(Kind kind, const void* p);
FAKE_HIDDEN bool unregister_object(Kind kind, const void* p);
FAKE_HIDDEN bool is_registered(Kind kind, const void* p);
// "comm#3" for a registered object, "0x0" for NULL, hex for anything else.
FAKE_HIDDEN std::string name_of(const void* p);

FAKE_HIDDEN Comm* new_comm(int nranks, int rank, int device, const ncclConfig_t* config);
// nullptr when `comm` is not a live fake communicator.
FAKE_HIDDEN Comm* find_comm(ncclComm_t comm);
FAKE_HIDDEN void delete_comm(ncclComm_t comm);

// True when FAKE_NCCL_FAIL names `fn` (the ncclX name).
FAKE_HIDDEN bool should_fail(const char* fn);
// Logs "<line> -> <result>" (and writes it as an NCCL INFO line: nccl_debug_line) and
// returns the result.
FAKE_HIDDEN ncclResult_t finish(const std::string& line, ncclResult_t result);
// NCCL's own debug output, only to a file (fake_nccl_debug.cc): with NCCL_DEBUG above VERSION
// and NCCL_DEBUG_FILE set, "host:pid:tid [dev] NCCL INFO <text>" to that file, which the first
// line opens as NCCL opens it (expanded, emptied, not appending).
FAKE_HIDDEN void nccl_debug_line(const std::string& text);

// "config=NULL" or "config=0x.. config_size=.. magic=.. version=.. cta=.. blocking=.. hex=..".
FAKE_HIDDEN std::string describe_config(const ncclConfig_t* config);
FAKE_HIDDEN bool config_magic_ok(const ncclConfig_t* config);
// "fakeid:N" for an id from our ncclGetUniqueId, otherwise the first 16 bytes in hex.
FAKE_HIDDEN std::string describe_id(const ncclUniqueId& id);
FAKE_HIDDEN void fill_unique_id(ncclUniqueId* id);

// The calling thread's current CUDA device as the fake driver sees it (-1: none current).
FAKE_HIDDEN int current_device();

FAKE_HIDDEN std::string int_list(const int* values, int n);

// ---- NCCL-like behaviour (fake_nccl_state.cc) ----
FAKE_HIDDEN std::mutex& state_mutex();
// The calling thread's group depth (ncclGroupStart/End nest per thread, as in NCCL).
FAKE_HIDDEN int group_depth();
FAKE_HIDDEN void group_start();
// The outermost group end of this thread: completes the deferred inits, launches (or, with
// `simulate`, drops) the queued operations. Appends the summary fields to *summary and
// returns the group's result.
FAKE_HIDDEN ncclResult_t group_finish(bool simulate, std::string* summary);
// Leaves the group without finishing it (ncclGroupEnd at depth > 1).
FAKE_HIDDEN void group_leave();

// Inside a group: queues an operation (logged now as "<line> -> 0 queued", launched at the
// outermost group end) and returns true. Outside a group: false.
FAKE_HIDDEN bool queue_if_grouped(const std::string& line, ncclComm_t comm);
// Inside a group: keeps `win` to be written to *out at the outermost group end (NCCL 2.28
// fills a window registered in a group only there) and returns true. Outside a group: false.
FAKE_HIDDEN bool defer_window_if_grouped(ncclWindow_t* out, ncclWindow_t win);
// NCCL's ncclCommEnsureReady: ncclInvalidArgument while `comm` is in progress, its error once
// its init failed, ncclSuccess otherwise (and for handles that are not live fake comms).
FAKE_HIDDEN ncclResult_t ensure_ready(ncclComm_t comm);

// Whether a comm created with `config` (NULL: NCCL_COMM_BLOCKING) is non-blocking.
FAKE_HIDDEN bool config_nonblocking(const ncclConfig_t* config, bool inherited);
// FAKE_NCCL_NONBLOCKING=1: non-blocking comms stay in progress for FAKE_NCCL_INPROGRESS_POLLS.
FAKE_HIDDEN bool nonblocking_model();

// Communicator creation with deferral, non-blocking progress and rendezvous. Each logs the
// call (`line` plus its outcome) and returns what NCCL returns.
FAKE_HIDDEN ncclResult_t create_root(const std::string& line, ncclComm_t* out, int nranks, int rank,
                                     int device, const ncclConfig_t* config,
                                     const ncclUniqueId* id);
// Split or shrink of `parent`; `config` already resolved (inherited when NULL).
FAKE_HIDDEN ncclResult_t create_child(const std::string& line, Comm* parent, bool shrink, int color,
                                      int key, const int* exclude, int exclude_count,
                                      ncclComm_t* newcomm, const ncclConfig_t* config);
// Gives rendezvous keys to the comms of one ncclCommInitAll (for their children's keys).
FAKE_HIDDEN void key_local_comms(Comm* const* comms, int n);

// ncclCommGetAsyncError's answer; appends what changed to *extra.
FAKE_HIDDEN ncclResult_t poll_async(Comm* c, std::string* extra);
// A window registration on a ready non-blocking comm: in progress until polled done.
FAKE_HIDDEN void defer_window_until_polled(Comm* c, ncclWindow_t* out, ncclWindow_t win);
// Count/UserRank/CuDevice: ncclSuccess with the value to answer, or the error to return.
FAKE_HIDDEN ncclResult_t query_value(Comm* c, int Comm::*field, int* value);
// Before a comm is freed: joins its fake NCCL thread, forgets its pending children and its
// place in this thread's group.
FAKE_HIDDEN void before_free(Comm* c);

// Argument checks of the real NCCL, active only with FAKE_NCCL_CHECK_ARGS=1
// (fake_nccl_argcheck.cc); without it they answer ncclSuccess.
struct CollArgs {
  ncclComm_t comm = nullptr;
  int datatype = ncclInt8;
  bool has_op = false;
  int op = ncclSum;
  bool has_root = false;  // root, or peer for send/recv
  int root = 0;
};
FAKE_HIDDEN bool check_args_enabled();
// A built-in operator, or one ncclRedOpCreatePreMulSum handed out (fake_nccl_mem.cc).
FAKE_HIDDEN bool redop_exists(int op);
FAKE_HIDDEN ncclResult_t check_coll_args(const CollArgs& args);
// ncclCommInitAll's check: ndev < 0 or a device outside the driver's count -> invalid
// argument, a device listed twice -> invalid usage.
FAKE_HIDDEN ncclResult_t check_device_list(int ndev, const int* devlist);

}  // namespace fake
