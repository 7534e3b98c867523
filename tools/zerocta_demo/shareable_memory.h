// GPU memory another process can map: one cuMem allocation that may be exported as a POSIX
// file descriptor, as PyTorch's expandable segments hand out. zerocta's route reaches such
// buffers across processes (cudaMalloc memory only within its own process), so the demo's
// ranks — one process per GPU — use it for the buffers they all-gather.
#pragma once

#include <cstddef>

// `bytes` on the current device, or nullptr (then *why says why).
void* shareable_alloc(size_t bytes, const char** why);
void shareable_free(void* p);
