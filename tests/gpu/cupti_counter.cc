#include "cupti_counter.h"

#include <cuda_runtime.h>
#include <cupti.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "mp_harness.h"
#include "rank_util.h"

namespace zgpu {
namespace {

constexpr size_t kBufferBytes = size_t{4} << 20;
constexpr size_t kMaxNames = 8;

// Activity records are delivered on CUPTI's own thread, hence the atomics and the mutex.
std::atomic<uint64_t> g_window_start{UINT64_MAX};
std::atomic<int> g_kernels{0};
std::atomic<int> g_memcpys{0};
std::mutex g_names_mutex;  // guards g_names and g_copies
std::vector<std::string> g_names;
std::vector<CopyRecord> g_copies;

void keep_copy(const CopyRecord& c) {
  std::lock_guard<std::mutex> lock(g_names_mutex);
  g_copies.push_back(c);
}

void check_cupti(CUptiResult res, const char* call) {
  if (res == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(res, &text);
  fail(std::string(call) + " -> " + (text ? text : "unknown CUPTI error"));
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  const uint64_t window_start = g_window_start.load();
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
        if (k->start < window_start) break;
        g_kernels.fetch_add(1);
        std::lock_guard<std::mutex> lock(g_names_mutex);
        if (g_names.size() < kMaxNames) g_names.push_back(k->name ? k->name : "?");
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(record);
        if (m->start < window_start) break;
        g_memcpys.fetch_add(1);
        keep_copy({m->start, m->end, m->bytes, m->streamId, m->channelID,
                   static_cast<uint32_t>(m->channelType), m->copyKind, -1, -1});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY2: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpyPtoP4*>(record);
        if (m->start < window_start) break;
        g_memcpys.fetch_add(1);
        keep_copy({m->start, m->end, m->bytes, m->streamId, m->channelID,
                   static_cast<uint32_t>(m->channelType), m->copyKind,
                   static_cast<int>(m->srcDeviceId), static_cast<int>(m->dstDeviceId)});
        break;
      }
      default:
        break;
    }
  }
  free(buffer);
}

}  // namespace

void cupti_start() {
  check_cupti(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
              "cuptiActivityRegisterCallbacks");
  check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
              "cuptiActivityEnable(CONCURRENT_KERNEL)");
  if (env_long("ZCTEST_POLICY_TRACE_MEMCPY", 1) != 0) {
    check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(MEMCPY)");
    check_cupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2), "cuptiActivityEnable(MEMCPY2)");
  }
}

void cupti_begin_window() {
  ZG_CUDA(cudaDeviceSynchronize());
  check_cupti(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  g_kernels = 0;
  g_memcpys = 0;
  {
    std::lock_guard<std::mutex> lock(g_names_mutex);
    g_names.clear();
    g_copies.clear();
  }
  uint64_t now = 0;
  check_cupti(cuptiGetTimestamp(&now), "cuptiGetTimestamp");
  g_window_start = now;
}

ActivityCounts cupti_end_window() {
  ZG_CUDA(cudaDeviceSynchronize());
  check_cupti(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  ActivityCounts counts;
  counts.kernels = g_kernels.load();
  counts.memcpys = g_memcpys.load();
  std::lock_guard<std::mutex> lock(g_names_mutex);
  counts.kernel_names = g_names;
  counts.copies = g_copies;
  std::sort(counts.copies.begin(), counts.copies.end(),
            [](const CopyRecord& a, const CopyRecord& b) { return a.start < b.start; });
  g_window_start = UINT64_MAX;
  return counts;
}

}  // namespace zgpu
