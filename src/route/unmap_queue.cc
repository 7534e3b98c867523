#include "unmap_queue.h"

#include <utility>

namespace zc {

void UnmapQueue::add(CUdeviceptr va, std::vector<uint64_t> sizes, int pid,
                     std::vector<uint64_t> blocks) {
  View v;
  v.va = va;
  v.sizes = std::move(sizes);
  v.blocks = std::move(blocks);
  v.pid = pid;
  views_.push_back(std::move(v));
}

size_t UnmapQueue::finish(const CudaDriver& cu, View* v, size_t max_calls) {
  size_t calls = 0;
  while (v->unmapped < v->sizes.size() && calls < max_calls) {
    cu.cuMemUnmap(v->va + v->offset, v->sizes[v->unmapped]);
    v->offset += v->sizes[v->unmapped++];
    ++calls;
  }
  if (v->unmapped == v->sizes.size()) cu.cuMemAddressFree(v->va, v->offset);
  return calls;
}

size_t UnmapQueue::drain(const CudaDriver& cu, size_t max_calls, const Finished& finished) {
  size_t calls = 0;
  while (!views_.empty()) {
    View& v = views_.front();
    calls += finish(cu, &v, max_calls - calls);
    if (v.unmapped < v.sizes.size()) break;  // out of calls for now
    const View done = std::move(v);
    views_.pop_front();
    if (finished) finished(done.pid, done.blocks);
  }
  return calls;
}

bool UnmapQueue::take_front(View* out) {
  if (views_.empty()) return false;
  *out = std::move(views_.front());
  views_.pop_front();
  return true;
}

}  // namespace zc
