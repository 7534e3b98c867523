// Deterministic test data on the host: every rank can regenerate every other rank's input
// from a seed, so results are checked against known bytes, not against another run.
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace zgpu {

constexpr uint8_t kPoison = 0xAB;  // written over every output before an operation

uint64_t mix64(uint64_t x);
uint64_t seed_of(std::initializer_list<uint64_t> parts);

// `count` elements of `dt`. Floating-point types get finite values with magnitudes in
// [1/16, 4) and random mantissas (so sums round and summation order matters, but never
// overflow); integer and fp8 types get uniformly random bytes.
std::vector<uint8_t> make_input(ncclDataType_t dt, size_t count, uint64_t seed);

// Element `index` of a buffer of `dt` as a double (integers and floats; not fp8).
double element_as_double(const uint8_t* data, ncclDataType_t dt, size_t index);

// Checks `got` (count elements) against the element-wise sum of inputs[q] + in_offset_elems:
// exactly, with the type's wrap-around, for integers; within a rounding bound for floats.
// Returns "" when it matches, else a description of the first bad element.
std::string check_sum(const uint8_t* got, const std::vector<const uint8_t*>& inputs,
                      size_t in_offset_elems, size_t count, ncclDataType_t dt);

// 64-bit FNV-1a of the bytes.
uint64_t fnv1a64(const void* data, size_t len);

// Offset of the first differing byte, or SIZE_MAX when the ranges are equal.
size_t first_difference(const void* a, const void* b, size_t len);

// Offset of the first byte that is not `value`, or SIZE_MAX.
size_t first_not(const void* data, size_t len, uint8_t value);

// "0x12 0x34 ..." for up to 8 bytes at data[offset...].
std::string bytes_at(const void* data, size_t len, size_t offset);

}  // namespace zgpu
