#include "push_steps.h"

#include "cuda_check.h"

namespace zcb {

PushSteps::PushSteps(int ngpus) : ngpus_(ngpus) {
  if (ngpus < 3) return;
  events_.resize(2 * static_cast<size_t>(ngpus));
  for (int g = 0; g < ngpus; ++g) {
    ZCB_CUDA(cudaSetDevice(g));
    for (int slot = 0; slot < 2; ++slot)
      ZCB_CUDA(cudaEventCreateWithFlags(&events_[2 * g + slot], cudaEventDisableTiming));
  }
}

PushSteps::~PushSteps() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void PushSteps::before(int g, uint64_t op, cudaStream_t stream) const {
  if (!in_step() || op == 0) return;
  for (int q = 0; q < ngpus_; ++q)
    if (q != g) ZCB_CUDA(cudaStreamWaitEvent(stream, event(q, op - 1), 0));
}

void PushSteps::after(int g, uint64_t op, cudaStream_t stream) const {
  if (in_step()) ZCB_CUDA(cudaEventRecord(event(g, op), stream));
}

}  // namespace zcb
