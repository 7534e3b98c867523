// What the fake NCCL logged about one config it received, and the 2.28 layout rules the
// tests check it against.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "harness.h"

namespace itest {

struct SeenConfig {
  bool present = false;  // the call had a log line at all
  bool null = false;     // config=NULL
  std::string ptr;       // address NCCL received, as hex
  size_t size = 0;
  unsigned magic = 0;
  unsigned version = 0;
  std::vector<unsigned char> bytes;  // `size` bytes as NCCL read them
  int cta() const;                   // int at offset 60 (requires size >= 64)
  int int_at(size_t offset) const;
  unsigned long long ptr_at(size_t offset) const;
};

// The config of the first logged call to fn (ncclCommInitRankConfig, ...).
SeenConfig seen_config(const RunResult& r, const std::string& fn);

// ncclConfig_v22800 on x86-64.
constexpr size_t kCtaOffset = 60;
constexpr size_t kConfigSize228 = 80;

// The field at `offset` and the NCCL version whose struct first had it. A struct of an older
// version has padding or nothing there, whatever its bytes say. The generations the tests
// use (2.14, 2.17, 2.18, 2.27, 2.28+) only need these versions to be right up to 2.18; the
// fields from trafficClass to nvlsCTAs all exist in 2.27 (trafficClass came earlier, after
// 2.18, which no tested struct distinguishes).
struct ConfigField {
  size_t offset;
  size_t len;
  unsigned since;
  bool pointer;
};
constexpr ConfigField kConfigFields[] = {
    {16, 4, 21400, false},  // blocking
    {20, 4, 21700, false},  // cgaClusterSize
    {24, 4, 21700, false},  // minCTAs
    {28, 4, 21700, false},  // maxCTAs
    {32, 8, 21700, true},   // netName
    {40, 4, 21800, false},  // splitShare
    {44, 4, 21900, false},  // trafficClass
    {48, 8, 22700, true},   // commName
    {56, 4, 22700, false},  // collnetEnable
    {60, 4, 22700, false},  // CTAPolicy
    {64, 4, 22700, false},  // shrinkShare
    {68, 4, 22700, false},  // nvlsCTAs
    {72, 4, 22800, false},  // nChannelsPerNetPeer
    {76, 4, 22800, false},  // nvlinkCentricSched
};

}  // namespace itest
