// A minimal NVTX tool: an injection library that NVTX3 loads from NVTX_INJECTION64_PATH (the way
// Nsight Systems attaches) and that appends one line per domain event to the file named by
// ZCTEST_NVTX_RECORD. Lines (fields separated by tabs):
//   init
//   domain_create  <domain>
//   register       <domain>  <text>
//   push           <tid>  <domain>  msg=<text>  payload_u64=<n>  color=0x<argb>  depth=<d>
//   pop            <tid>  <domain>  depth=<d>
// where <d> is the thread's nesting depth after the event (push 1 -> pop 0 when balanced).
#define NVTX_NO_IMPL  // a tool needs NVTX's types, not its client-side implementation
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "nvtx3/nvToolsExt.h"

namespace {

// Handles given to the application are pointers to these; never freed (a tool's handles must
// stay valid for the life of the process).
struct Domain {
  std::string name;
};
struct RegisteredString {
  std::string text;
};

std::mutex g_mutex;
int g_fd = -1;
thread_local int t_depth = 0;

void record(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_fd < 0) return;
  const std::string with_newline = line + "\n";
  // O_APPEND + one write per line: lines from concurrent threads never interleave.
  if (write(g_fd, with_newline.data(), with_newline.size()) < 0) {
    perror("zerocta_nvtx_recorder: write");
  }
}

std::string domain_name(nvtxDomainHandle_t domain) {
  return domain ? reinterpret_cast<Domain*>(domain)->name : std::string("<default>");
}

std::string tid() { return std::to_string(static_cast<long>(syscall(SYS_gettid))); }

std::string message_text(const nvtxEventAttributes_t* a) {
  switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII:
      return a->message.ascii ? a->message.ascii : "<null>";
    case NVTX_MESSAGE_TYPE_REGISTERED:
      return a->message.registered
                 ? reinterpret_cast<const RegisteredString*>(a->message.registered)->text
                 : "<null-handle>";
    case NVTX_MESSAGE_UNKNOWN:
      return "<none>";
    default:
      return "<type " + std::to_string(a->messageType) + ">";
  }
}

std::string payload_text(const nvtxEventAttributes_t* a) {
  if (a->payloadType == NVTX_PAYLOAD_TYPE_UNSIGNED_INT64) {
    return "payload_u64=" + std::to_string(a->payload.ullValue);
  }
  return "payload_type=" + std::to_string(a->payloadType);
}

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  auto* d = new Domain{name ? name : ""};
  record("domain_create\t" + d->name);
  return reinterpret_cast<nvtxDomainHandle_t>(d);
}

nvtxStringHandle_t NVTX_API register_string(nvtxDomainHandle_t domain, const char* text) {
  auto* s = new RegisteredString{text ? text : ""};
  record("register\t" + domain_name(domain) + "\t" + s->text);
  return reinterpret_cast<nvtxStringHandle_t>(s);
}

int NVTX_API range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  const int depth = ++t_depth;
  char color[16];
  snprintf(color, sizeof(color), "0x%08X", a->colorType == NVTX_COLOR_ARGB ? a->color : 0u);
  record("push\t" + tid() + "\t" + domain_name(domain) + "\tmsg=" + message_text(a) + "\t" +
         payload_text(a) + "\tcolor=" + color + "\tdepth=" + std::to_string(depth));
  return depth - 1;  // NVTX: the zero-based level of the range just started
}

int NVTX_API range_pop(nvtxDomainHandle_t domain) {
  const int depth = --t_depth;
  record("pop\t" + tid() + "\t" + domain_name(domain) + "\tdepth=" + std::to_string(depth));
  return depth;
}

// Points one slot of NVTX's CORE2 (domain API) callback table at fn.
template <typename Fn>
bool attach(NvtxFunctionTable table, unsigned size, NvtxCallbackIdCore2 id, Fn fn) {
  if (static_cast<unsigned>(id) >= size || table[id] == nullptr) return false;
  *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
  return true;
}

}  // namespace

// The entry point NVTX3 looks up with dlsym after loading NVTX_INJECTION64_PATH. Returning 0
// tells NVTX the tool failed to attach (NVTX then unloads it and turns every call into a no-op).
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const char* path = getenv("ZCTEST_NVTX_RECORD");
  if (path == nullptr || get_export_table == nullptr) return 0;
  g_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (g_fd < 0) {
    perror("zerocta_nvtx_recorder: open ZCTEST_NVTX_RECORD");
    return 0;
  }

  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->struct_size < sizeof(NvtxExportTableCallbacks)) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || !table) return 0;

  const auto* version =
      static_cast<const NvtxExportTableVersionInfo*>(get_export_table(NVTX_ETID_VERSIONINFO));
  if (version != nullptr && version->struct_size >= sizeof(NvtxExportTableVersionInfo)) {
    version->SetInjectionNvtxVersion(NVTX_VERSION);
  }

  const bool ok = attach(table, size, NVTX_CBID_CORE2_DomainCreateA, &domain_create) &&
                  attach(table, size, NVTX_CBID_CORE2_DomainRegisterStringA, &register_string) &&
                  attach(table, size, NVTX_CBID_CORE2_DomainRangePushEx, &range_push) &&
                  attach(table, size, NVTX_CBID_CORE2_DomainRangePop, &range_pop);
  if (!ok) return 0;
  record("init");
  return 1;
}
