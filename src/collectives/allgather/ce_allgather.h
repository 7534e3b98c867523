// zerocta's zero-copy all-gather: one op, on the application's thread, never waiting for a peer
// (op_exchange.h says who moves which bytes, direct_plan.h how).
#pragma once

#include <cuda.h>
#include <nccl.h>

#include <memory>

#include "comm_state.h"

namespace zc {

// Posts the op, arrives, and either issues it on the copy engines behind `stream` or, when the
// first rank to arrive decided so, sets *to_nccl: the caller then forwards the op to NCCL, as
// every rank does. `capturing`: the stream is being captured into a CUDA graph: the op is
// captured on the route (captured_ops.h); one rank capturing where another runs eagerly is an
// error. `chain`: the communicator's call chain before the op, taken when the application
// called it (call_chain.h); ranks whose chains differ fail the op. Any failure after the post
// poisons the communicator and returns the error.
ncclResult_t ce_allgather(CommState& st, const void* sendbuff, void* recvbuff, size_t sendcount,
                          ncclDataType_t datatype, uint64_t bytes_per_rank, CUstream stream,
                          bool capturing, ChainPoint chain, bool* to_nccl);

// The same op in two steps, so that a thread that drives several ranks of a communicator whose
// other ranks are in other processes posts and claims for all of its ranks before any of them
// waits for a peer (local_group_allgather.h): one op at a time, one of its ranks would wait for
// a later rank of another process whose thread waits, in turn, for one of ours still to come.
class RoutedAllGather {
 public:
  RoutedAllGather(CommState& st, const void* sendbuff, void* recvbuff, size_t sendcount,
                  ncclDataType_t datatype, uint64_t bytes_per_rank, CUstream stream, bool capturing,
                  ChainPoint chain);
  ~RoutedAllGather();
  // Posts, arrives, stages if it must, and settles the pairs in which this rank arrived later;
  // waits for no peer. false: the op is over — *result holds its error, or ncclSuccess with
  // to_nccl() (every rank forwards it to NCCL).
  bool begin(ncclResult_t* result);
  // After a true begin(): settles the pairs with later ranks and issues the copies. An eager op
  // leaves its pushes into ranks of other processes to the push issuer (push_issuer.h) and
  // waits for no peer; a captured one waits for the later ranks' claims as PairWait says.
  ncclResult_t complete();
  bool to_nccl() const;
  RoutedAllGather(const RoutedAllGather&) = delete;
  RoutedAllGather& operator=(const RoutedAllGather&) = delete;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The number and flags of eager op `seq` in rank `me`'s view: its ring slot's ready and done
// flags (op_exchange.h), as `me`'s streams address them.
void set_ring_flags(const CeComm& ce, int me, int nranks, uint64_t seq, DirectOpView* v);


}  // namespace zc
