// The part of a rank's Hello that says which GPU and process it is: shared by the NCCL
// workers (nccl_rank.cc) and the one-process peer paths (peer_push.cc).
#pragma once

#include "protocol.h"

namespace zcb {

// A Hello with rank, device, pid, GPU name and PCI bus id filled in; the NCCL fields are
// left zero for the caller.
HelloMsg gpu_hello(int rank, int device);

}  // namespace zcb
