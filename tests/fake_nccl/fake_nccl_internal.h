// Shared pieces of the fake NCCL: the object registry that gives every handle a stable
// name in the log (comm#1, mem#2, ...), config and id formatting, failure injection.
//
// Handles are logged by name rather than address so that two runs of the same program (with
// and without a shim in front) produce comparable logs even though heap addresses differ.
// A pointer the fake did not hand out is logged as hex, which makes a shim that substitutes
// its own handles visible.
#pragma once

#include <nccl.h>

#include <string>
#include <vector>

#include "fake_log.h"

// Real NCCL exports pncclX as an alias of ncclX (the profiling entry points); so do we.
#define FAKE_PNCCL_ALIAS(name) \
  extern "C" decltype(name) p##name __attribute__((alias(#name), visibility("default")));

namespace fake {

enum class Kind { kComm, kMem, kReg, kWin };

struct Comm {
  int nranks = 0;
  int rank = 0;
  int device = -1;
  std::vector<unsigned char> config;  // the bytes of the config the comm was created with
  ncclResult_t async_error = ncclSuccess;
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
// Logs "<line> -> <result>" and returns the result.
FAKE_HIDDEN ncclResult_t finish(const std::string& line, ncclResult_t result);

// "config=NULL" or "config=0x.. config_size=.. magic=.. version=.. cta=.. blocking=.. hex=..".
FAKE_HIDDEN std::string describe_config(const ncclConfig_t* config);
FAKE_HIDDEN bool config_magic_ok(const ncclConfig_t* config);
// "fakeid:N" for an id from our ncclGetUniqueId, otherwise the first 16 bytes in hex.
FAKE_HIDDEN std::string describe_id(const ncclUniqueId& id);
FAKE_HIDDEN void fill_unique_id(ncclUniqueId* id);

// The calling thread's current CUDA device as the fake driver sees it (-1: none current).
FAKE_HIDDEN int current_device();

FAKE_HIDDEN std::string int_list(const int* values, int n);

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
