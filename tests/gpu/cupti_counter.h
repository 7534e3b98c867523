// Counts the kernels and memory copies the GPU ran inside a window of time, with the CUPTI
// activity API. The policy test uses it to tell NCCL's copy-engine all-gather (no kernel)
// from its kernel path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zgpu {

// One memory copy the GPU ran, for timelines (CUPTI timestamps, ns).
struct CopyRecord {
  uint64_t start = 0, end = 0, bytes = 0;
  uint32_t stream = 0, channel = 0;
  uint32_t channel_type = 0;             // CUpti_ChannelType: 1 compute, 2 asynchronous copy engine
  uint8_t copy_kind = 0;                 // CUpti_ActivityMemcpyKind
  int src_device = -1, dst_device = -1;  // peer-to-peer copies only
};

struct ActivityCounts {
  int kernels = 0;
  int memcpys = 0;                        // device/host and peer-to-peer copies
  std::vector<std::string> kernel_names;  // the first few, for the log
  std::vector<CopyRecord> copies;         // every copy of the window (timeline order)
};

// Call once per process before the CUDA context exists (RunOptions::before_cuda). Throws
// RankError if CUPTI cannot be set up. Env ZCTEST_POLICY_TRACE_MEMCPY=0 leaves copies out.
void cupti_start();

// Synchronises the current device, drops everything recorded so far and starts a window.
void cupti_begin_window();

// Synchronises the current device and returns what ran since cupti_begin_window().
ActivityCounts cupti_end_window();

}  // namespace zgpu
