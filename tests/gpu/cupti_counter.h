// Counts the kernels and memory copies the GPU ran inside a window of time, with the CUPTI
// activity API. The policy test uses it to tell NCCL's copy-engine all-gather (no kernel)
// from its kernel path.
#pragma once

#include <string>
#include <vector>

namespace zgpu {

struct ActivityCounts {
  int kernels = 0;
  int memcpys = 0;                        // device/host and peer-to-peer copies
  std::vector<std::string> kernel_names;  // the first few, for the log
};

// Call once per process before the CUDA context exists (RunOptions::before_cuda). Throws
// RankError if CUPTI cannot be set up. Env ZEROCTA_POLICY_TRACE_MEMCPY=0 leaves copies out.
void cupti_start();

// Synchronises the current device, drops everything recorded so far and starts a window.
void cupti_begin_window();

// Synchronises the current device and returns what ran since cupti_begin_window().
ActivityCounts cupti_end_window();

}  // namespace zgpu
