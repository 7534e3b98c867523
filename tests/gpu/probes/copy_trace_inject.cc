// Every copy a process runs, with its device start and end, from CUPTI's activity records: a
// CUDA injection library (CUDA_INJECTION64_PATH), so that any program — zerocta-bench's rank
// processes, nccl-tests — is traced unchanged, whichever library issues the copies (NCCL's
// copy-engine path or the route). Written to answer where two paths that issue the same copies
// differ by 0.2 %: do the copies run slower, or start later after the previous op?
//
//   built as build/tests/gpu/zerocta_gpu_probe_copy_trace.so (with CUPTI), or by hand:
//   g++ -O2 -shared -fPIC -o copy_trace.so copy_trace_inject.cc -I$CUDA/include -lcupti
//   COPY_TRACE_DIR=DIR CUDA_INJECTION64_PATH=$PWD/copy_trace.so PROGRAM
// A program whose processes end with _exit writes nothing (the file is written at exit).
//
// At exit each process writes DIR/copy-trace-PID.csv: one line per copy (memcpy and peer-to-peer
// records) — kind, copy kind, bytes, start and end (ns; CUPTI puts the GPU's times on the host's
// clock), device, stream, the source and destination devices of a peer copy, the hardware
// channel it ran on, how many copies the record covers, and the correlation id of the driver
// call that issued it. With COPY_TRACE_API=1 also DIR/api-trace-PID.csv: every driver API call
// of the process — name, start and end on the same clock, thread, correlation id — to see where
// each op's host work lies against its device work (is the host ahead, what runs while the GPUs
// hand over from one op to the next).
// tests/gpu/probes/copy_trace_summary.py summarizes such files.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

constexpr size_t kBufferBytes = 8u << 20;

struct Copy {
  const char* kind;
  unsigned copy_kind;
  unsigned long long bytes, start, end;
  unsigned device, stream, src_device, dst_device, channel;
  unsigned long long count;  // copies in the record (a batch's may be one record)
  unsigned correlation;      // the driver call that issued it
};

struct ApiCall {
  unsigned cbid;
  unsigned long long start, end;
  unsigned thread, correlation;
};

std::mutex g_mu;
std::vector<Copy> g_copies;
std::vector<ApiCall> g_calls;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<Copy> got;
  std::vector<ApiCall> calls;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      got.push_back({"memcpy", m->copyKind, m->bytes, m->start, m->end, m->deviceId, m->streamId,
                     m->deviceId, m->deviceId, m->channelID, m->copyCount, m->correlationId});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY2) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(record);
      got.push_back({"p2p", m->copyKind, m->bytes, m->start, m->end, m->deviceId, m->streamId,
                     m->srcDeviceId, m->dstDeviceId, m->channelID, 1, m->correlationId});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      calls.push_back({a->cbid, a->start, a->end, a->threadId, a->correlationId});
    }
  }
  free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_copies.insert(g_copies.end(), got.begin(), got.end());
  g_calls.insert(g_calls.end(), calls.begin(), calls.end());
}

std::string trace_path(const char* what) {
  const char* dir = getenv("COPY_TRACE_DIR");
  return std::string(dir && *dir ? dir : ".") + "/" + what + "-trace-" + std::to_string(getpid()) +
         ".csv";
}

void write_calls() {
  if (g_calls.empty()) return;
  FILE* f = fopen(trace_path("api").c_str(), "w");
  if (!f) return;
  fprintf(f, "name,start_ns,end_ns,thread,correlation\n");
  for (const ApiCall& c : g_calls) {
    const char* name = nullptr;
    if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, c.cbid, &name) != CUPTI_SUCCESS || !name)
      name = "?";
    fprintf(f, "%s,%llu,%llu,%u,%u\n", name, c.start, c.end, c.thread, c.correlation);
  }
  fclose(f);
}

void write_trace() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mu);
  write_calls();
  if (g_copies.empty()) return;
  FILE* f = fopen(trace_path("copy").c_str(), "w");
  if (!f) return;
  fprintf(f,
          "kind,copy_kind,bytes,start_ns,end_ns,device,stream,src_device,dst_device,channel,"
          "count,correlation\n");
  for (const Copy& c : g_copies)
    fprintf(f, "%s,%u,%llu,%llu,%llu,%u,%u,%u,%u,%u,%llu,%u\n", c.kind, c.copy_kind, c.bytes,
            c.start, c.end, c.device, c.stream, c.src_device, c.dst_device, c.channel, c.count,
            c.correlation);
  fclose(f);
}

}  // namespace

extern "C" int InitializeInjection(void) {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY2) != CUPTI_SUCCESS)
    return 0;
  const char* api = getenv("COPY_TRACE_API");
  if (api && *api && *api != '0' &&
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS)
    return 0;
  atexit(write_trace);
  return 1;
}
