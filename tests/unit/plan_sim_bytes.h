// What the plan simulations (direct_plan_test.cc, local_group_plan_test.cc) write and check: a
// byte per (rank, op, offset) that differs between neighbouring ranks, ops and offsets, and
// host pointers as the plans' integer addresses.
#pragma once

#include <cstdint>

namespace zc {

inline uint8_t pattern(int rank, uint64_t op, uint64_t i) {
  return static_cast<uint8_t>(rank * 59 + op * 13 + i * 7 + 1);
}

inline uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

}  // namespace zc
