// This process's copy engines on the GPUs of its peers in other processes.
//
// The later rank of a pair that moves both chunks ("later does both", op_exchange.h) ran both
// copies on its own GPU, where across processes they take turns: half speed each way
// (tests/gpu/probes/import_copy_probe.cu). With a context of its own process on the earlier
// rank's GPU, it issues the earlier chunk's copy there instead, a push by that GPU's copy
// engine in this process's address space, and the pair moves at full speed both ways as when
// each pushes. Measured (tests/gpu/probes/foreign_engine_probe.cu, 2xH100, 256 MiB each way):
// 386 GB/s per direction for both pushes issued by one process, against 198 for a push and a
// pull on one GPU; at full speed beside a kernel of the GPU's own process that holds every
// SM, whose time grew 0.6 %. So the earlier rank of such a pair no longer waits on its host
// for the later one (ce_allgather.cc).
//
// A context takes its GPU's memory: 262 MiB on H100 (driver 580) for the one made here, where
// no kernel ever runs (stack, printf FIFO and heap limits at their least), against 526 for a
// primary context. One per GPU is shared by every communicator of the process and destroyed
// with the last one that used it. It is current on a thread only while its streams and events
// are made (pushed, then popped): the application's contexts are never changed.
#pragma once

#include <cuda.h>

#include <vector>

#include "cuda_driver.h"

namespace zc {

// This process's stream on one peer's GPU, and the event after its copies of an op.
struct PeerEngine {
  int device = -1;  // ordinal here; -1: none
  CUstream stream = nullptr;
  CUevent event = nullptr;
};

class PeerEngines {
 public:
  PeerEngines() = default;
  PeerEngines(const PeerEngines&) = delete;
  PeerEngines& operator=(const PeerEngines&) = delete;
  ~PeerEngines();  // close() must have run (it needs the driver)

  // One engine per rank whose `devices` entry is an ordinal here (-1: a rank of this process,
  // or one that needs none). False, holding nothing, when any cannot be had (or the driver has
  // no context calls): the pairs then run as before.
  bool open(const CudaDriver& cu, int own_device, const std::vector<int>& devices);
  // Waits for the streams, then destroys them and releases the contexts.
  void close(const CudaDriver& cu);
  // Waits for the streams (a suspended communicator).
  void drain(const CudaDriver& cu) const;

  // By rank (a null stream where none): what issue_plan takes.
  const PeerEngine* by_rank() const { return by_rank_.empty() ? nullptr : by_rank_.data(); }
  bool any() const { return count_ > 0; }
  // The ordinals of the GPUs engines run on, each once.
  const std::vector<int>& devices() const { return devices_; }

 private:
  std::vector<PeerEngine> by_rank_;
  std::vector<int> devices_;
  int count_ = 0;
};

}  // namespace zc
