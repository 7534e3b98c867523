#include "stage_buffer.h"

#include "stats.h"

namespace zc {

bool StageBuffer::ensure(const CudaDriver& cu, uint64_t bytes, const ReachNeeds& needs,
                         DoneMark retire_after, const char** why) {
  if (current_ && current_.bytes >= bytes) return true;
  MappedAllocation grown;
  if (!create_exportable(cu, bytes, device_, needs.peer_devices, needs.npeer_devices, &grown)) {
    *why = "could not allocate a stage for buffers its peers cannot reach";
    return false;
  }
  stats_pool_bytes_add(static_cast<int64_t>(grown.bytes));
  if (current_) retired_.push_back(Retired{current_, retire_after});
  current_ = grown;
  // Exported now, while the descriptors' reserve may still serve (peer_memory.h): describing it
  // for the peers then finds the export made.
  if (needs.by_extents && !export_stage(cu, current_.va)) {
    *why = "could not export a stage for buffers its peers cannot reach";
    return false;
  }
  return true;
}

void StageBuffer::release(const CudaDriver& cu, MappedAllocation* m) {
  stats_pool_bytes_add(-static_cast<int64_t>(m->bytes));
  release_mapping(cu, m);
}

void StageBuffer::tidy(const CudaDriver& cu) {
  for (auto it = retired_.begin(); it != retired_.end();) {
    if (!it->after.passed()) {
      ++it;
      continue;
    }
    release(cu, &it->mapping);
    it = retired_.erase(it);
  }
}

StageBuffer::~StageBuffer() {
  const CudaDriver* cu = cuda_driver();
  if (!cu) return;
  ScopedDevice on(device_);
  for (Retired& r : retired_) release(*cu, &r.mapping);
  if (current_) release(*cu, &current_);
}

}  // namespace zc
