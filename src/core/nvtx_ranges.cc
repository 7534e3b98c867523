// NVTX ranges in the "zerocta" domain.
//
// Cost model. NVTX3 is header-only: every nvtx* call is an inline function that calls through
// a pointer which is null unless a tool (Nsight Systems, or any NVTX_INJECTION64_PATH library)
// attached at the first NVTX call. To keep the hot path free of formatting, each (op, route)
// message is registered once as a string ("allgather ce") and the byte count travels in the
// event's 64-bit payload; a range push is then a struct fill and one indirect call.
//
// NVTX3 has no "is a tool attached" query; a null domain handle from nvtxDomainCreateA is the
// practical signal (only a tool returns a handle), and then ranges are skipped entirely.
#include "nvtx_ranges.h"

#include <atomic>
#include <cstdio>

#include "config.h"
#include "nvtx3/nvToolsExt.h"

namespace zc {
namespace {

struct NvtxState {
  nvtxDomainHandle_t domain = nullptr;
  nvtxStringHandle_t names[zerocta_op_count][zerocta_route_count] = {};
};

NvtxState make_state() {
  NvtxState state;
  // First NVTX call of this copy of NVTX: loads the injection library, if any.
  state.domain = nvtxDomainCreateA("zerocta");
  if (state.domain == nullptr) return state;
  for (int op = 0; op < zerocta_op_count; ++op) {
    for (int route = 0; route < zerocta_route_count; ++route) {
      char text[48];
      snprintf(text, sizeof(text), "%s %s", zerocta_op_name(static_cast<zerocta_op_t>(op)),
               zerocta_route_name(static_cast<zerocta_route_t>(route)));
      state.names[op][route] = nvtxDomainRegisterStringA(state.domain, text);
    }
  }
  return state;
}

// Created on first use, not at load: NVTX's init may dlopen a tool, which must not happen
// inside the dynamic loader's constructor phase. Thread-safe as a function-local static.
const NvtxState& nvtx_state() {
  static const NvtxState state = make_state();
  return state;
}

// The hot-path decision, cached in one word: after the first range, a disabled or tool-less
// process pays one relaxed load and a branch per collective. Threads racing through the first
// call all compute the same answer (config() and nvtx_state() are each built once).
enum : int { kUnknown = 0, kOff = 1, kOn = 2 };
std::atomic<int> g_mode{kUnknown};

bool ranges_on() {
  int mode = g_mode.load(std::memory_order_acquire);
  if (mode == kUnknown) {
    mode = config().nvtx && nvtx_state().domain != nullptr ? kOn : kOff;
    g_mode.store(mode, std::memory_order_release);
  }
  return mode == kOn;
}

// ARGB, one color per route so the timeline shows at a glance which path ran.
uint32_t route_color(zerocta_route_t route) {
  switch (route) {
    case zerocta_route_passthrough:
      return 0xFF9E9E9Eu;  // grey: NCCL as usual
    case zerocta_route_ce:
      return 0xFF76B900u;  // green: zerocta's copy-engine all-gather
    case zerocta_route_nccl_ce:
      return 0xFF2196F3u;  // blue: NCCL's CE path on symmetric windows
    default:
      return 0xFF000000u;
  }
}

}  // namespace

NvtxRange::NvtxRange(zerocta_op_t op, zerocta_route_t route, uint64_t bytes) : active_(false) {
  if (!ranges_on()) return;
  if (static_cast<unsigned>(op) >= zerocta_op_count ||
      static_cast<unsigned>(route) >= zerocta_route_count) {
    return;
  }
  const NvtxState& state = nvtx_state();

  nvtxEventAttributes_t attr = {};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.colorType = NVTX_COLOR_ARGB;
  attr.color = route_color(route);
  attr.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  attr.payload.ullValue = bytes;
  const nvtxStringHandle_t name = state.names[op][route];
  if (name != nullptr) {
    attr.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    attr.message.registered = name;
  } else {
    // A tool that records ranges but does not register strings: fall back to static text
    // (the op name; the route is in the color, the bytes in the payload).
    attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attr.message.ascii = zerocta_op_name(op);
  }
  nvtxDomainRangePushEx(state.domain, &attr);
  active_ = true;
}

NvtxRange::~NvtxRange() {
  if (active_) nvtxDomainRangePop(nvtx_state().domain);
}

}  // namespace zc
