// The bad-input driver (bad_input_driver*.cc): runs NCCL calls with bad arguments named on
// the command line, one step per argument, and prints "<step>=<ncclResult_t>" for each. Before
// each step it appends "marker step <step>" to the fake NCCL's log, so the test can cut the log
// into one segment per step and compare what reached NCCL with and without the shim.
//
// Collective steps: <op>:<comm>:<args>
//   op    allgather allreduce reducescatter reduce broadcast bcast alltoall gather scatter
//         send recv
//   comm  live (from "init"), null, dead (from "init_dead": created, then destroyed),
//         garbage (an address NCCL never handed out)
//   args  ok inplace nullsend nullrecv nullboth count0 count0null dtype99 dtypeneg badop
//         badroot overlap misaligned hugecount
// "grouped:<collective step>" issues it inside ncclGroupStart/End and also prints
// "<step>.end" (the group's result).
// Communicator and other steps: see lifecycle_step() in bad_input_driver_lifecycle.cc.
#pragma once

#include <nccl.h>

#include <string>

namespace bad {

// The communicators the steps refer to by name.
struct Comms {
  ncclComm_t live = nullptr;
  ncclComm_t dead = nullptr;
};
Comms& comms();

// "live" | "null" | "dead" | "garbage" -> the handle; false for an unknown name.
bool comm_named(const std::string& name, ncclComm_t* out);

// Prints "<step>=<value>".
void result(const std::string& step, long long value);

// The steps of each file; false when the step is not one of theirs.
bool collective_step(const std::string& step);
bool lifecycle_step(const std::string& step);

}  // namespace bad
