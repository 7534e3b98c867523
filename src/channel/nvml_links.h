// Whether two GPUs of this host are linked by NVLink, asked of NVML (libnvidia-ml.so.1, loaded
// at the first question), which sees every GPU of the host whatever CUDA_VISIBLE_DEVICES hides
// from CUDA. The route asks it about a peer GPU this process cannot see — ranks that each see
// one GPU, as SLURM's --gpu-bind or one-GPU containers give them: such a rank reaches its
// peers' buffers through imports of their allocations, which need no device ordinal, but
// only an NVLink path makes the route worth taking.
#pragma once

namespace zc {

enum class NvlinkAnswer {
  kLinked,     // NVML says the two GPUs are linked by NVLink
  kNotLinked,  // NVML knows both and says they are not
  kUnknown,    // no NVML, or it does not know one of them (another host's GPU)
};

// `a` and `b`: the 16 bytes of the GPUs' UUIDs (cuDeviceGetUuid).
NvlinkAnswer nvlink_between(const unsigned char a[16], const unsigned char b[16]);

}  // namespace zc
