// What the parent knows about the machine before it runs anything: GPUs, P2P between them,
// driver/runtime/NCCL versions. CUDA is touched only in a forked child, so the parent stays
// CUDA-free and can fork the rank processes safely.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zcb {

struct GpuInfo {
  std::string name;
  std::string bus_id;
  uint64_t memory_bytes = 0;
};

struct MachineInfo {
  int gpu_count = 0;
  std::string no_gpu_reason;  // why gpu_count is 0
  std::vector<GpuInfo> gpus;
  std::vector<std::string> p2p_missing;  // "0->1" for pairs without peer access
  int cuda_driver_version = 0;           // cudaDriverGetVersion, e.g. 13000
  int cuda_runtime_version = 0;
  int nccl_version = 0;        // ncclGetVersion of the libnccl this binary loads
  std::string driver_version;  // "580.159.04" from /proc/driver/nvidia/version
  std::string hostname;
  bool fake = false;
};

// Probes in a forked child, which is killed after timeout_s.
MachineInfo probe_machine(int timeout_s);
// The --fake-gpus stand-in.
MachineInfo fake_machine(int ngpus);

// "22809" -> "2.28.9"; "13000" -> "13.0".
std::string nccl_version_string(int code);
std::string cuda_version_string(int code);

}  // namespace zcb
