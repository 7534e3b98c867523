// A zero-filled, page-aligned region of anonymous memory laid out by `Layout` for `n` ranks
// (Layout::region_bytes), as the channel gives the op exchange and the capture blocks theirs.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace zc {

template <typename Layout>
struct AnonRegion {
  explicit AnonRegion(uint32_t n) : bytes(Layout::region_bytes(n)) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  ~AnonRegion() { munmap(base, bytes); }
  AnonRegion(const AnonRegion&) = delete;
  AnonRegion& operator=(const AnonRegion&) = delete;
  size_t bytes;
  void* base;
};

}  // namespace zc
