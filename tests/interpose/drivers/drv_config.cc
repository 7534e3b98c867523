// Hands NCCL an application config of a given struct generation and reports what happened.
//
//   drv_config <entry> [<size>|null [<version> [<cta>|unset [badmagic]]]]
//   entry: initrank | rankconfig | scalable | split | split_nocolor | shrink
//
// The config is built as raw bytes (older and newer structs than our nccl.h), with every
// field the generation has set to a distinctive value and every unknown byte to a pattern.
// It ends exactly at an inaccessible page, and its page is read-only during the call, so a
// shim that reads past `size` or writes into the caller's struct crashes the driver.
// Prints caller_ptr, before, after (hex of the caller's bytes), result and newcomm_null.
#include <nccl.h>

#include <climits>
#include <cstddef>
#include <string>

#include "driver_util.h"

namespace {

struct IntField {
  size_t offset;
  int value;
};
struct PtrField {
  size_t offset;
  size_t arena_offset;  // where the string lives
  const char* text;
};

// The 2.28 layout (x86-64): offsets of ncclConfig_v22800, checked below against the header.
constexpr IntField kInts[] = {{16, 1}, {20, 2}, {24, 3}, {28, 5},  {40, 1}, {44, 7},
                              {56, 0}, {64, 1}, {68, 9}, {72, 11}, {76, 1}};
constexpr PtrField kPtrs[] = {{32, 0x800, "fakenet"}, {48, 0x840, "fakecomm"}};
constexpr size_t kCtaOffset = 60;
static_assert(offsetof(ncclConfig_t, CTAPolicy) == kCtaOffset, "layout");
static_assert(offsetof(ncclConfig_t, netName) == 32 && offsetof(ncclConfig_t, commName) == 48,
              "layout");
static_assert(offsetof(ncclConfig_t, nvlinkCentricSched) == 76 && sizeof(ncclConfig_t) == 80,
              "layout");

ncclConfig_t* build_config(size_t size, unsigned version, int cta, bool bad_magic) {
  unsigned char* b = drv::guarded_block(size);
  for (size_t i = 0; i < size; ++i) b[i] = static_cast<unsigned char>(0x30 + 7 * i);
  auto put = [&](size_t off, const void* v, size_t n) {
    if (off + n <= size) memcpy(b + off, v, n);
  };
  uint64_t sz = size;
  unsigned magic = bad_magic ? 0xdeadbeef : 0xcafebeef;
  put(0, &sz, 8);
  put(8, &magic, 4);
  put(12, &version, 4);
  for (const IntField& f : kInts) put(f.offset, &f.value, 4);
  for (const PtrField& f : kPtrs) {
    char* s = reinterpret_cast<char*>(drv::arena() + f.arena_offset);
    strcpy(s, f.text);
    put(f.offset, &s, sizeof s);
  }
  put(kCtaOffset, &cta, 4);
  return reinterpret_cast<ncclConfig_t*>(b);
}

ncclComm_t make_parent() {
  ncclUniqueId id;
  ncclComm_t parent = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&parent, 4, id, 0) != ncclSuccess) {
    drv::out("parent", "failed");
    exit(2);
  }
  return parent;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 64;
  std::string entry = argv[1];
  bool null_config = argc < 3 || std::string(argv[2]) == "null";
  size_t size = null_config ? 0 : strtoul(argv[2], nullptr, 0);
  unsigned version = argc > 3 ? static_cast<unsigned>(strtoul(argv[3], nullptr, 0)) : 22809;
  int cta = argc > 4 && std::string(argv[4]) != "unset" ? atoi(argv[4]) : INT_MIN;
  bool bad_magic = argc > 5 && std::string(argv[5]) == "badmagic";

  ncclConfig_t* config = null_config ? nullptr : build_config(size, version, cta, bad_magic);
  drv::out("caller_ptr", drv::ptr_hex(config));
  if (config) drv::out("before", drv::hex(config, size));

  ncclComm_t parent =
      (entry == "split" || entry == "split_nocolor" || entry == "shrink") ? make_parent() : nullptr;
  ncclUniqueId ids[2];
  if (ncclGetUniqueId(&ids[0]) != ncclSuccess || ncclGetUniqueId(&ids[1]) != ncclSuccess) return 3;
  ncclComm_t comm = nullptr;
  int excluded[1] = {3};
  ncclResult_t r = ncclInternalError;

  if (config) drv::protect_guarded_page(true);
  if (entry == "initrank") {
    r = ncclCommInitRank(&comm, 4, ids[0], 2);
  } else if (entry == "rankconfig") {
    r = ncclCommInitRankConfig(&comm, 4, ids[0], 2, config);
  } else if (entry == "scalable") {
    r = ncclCommInitRankScalable(&comm, 4, 2, 2, ids, config);
  } else if (entry == "split") {
    r = ncclCommSplit(parent, 1, 0, &comm, config);
  } else if (entry == "split_nocolor") {
    comm = reinterpret_cast<ncclComm_t>(0x1);  // must be overwritten with NULL
    r = ncclCommSplit(parent, NCCL_SPLIT_NOCOLOR, 0, &comm, config);
  } else if (entry == "shrink") {
    r = ncclCommShrink(parent, excluded, 1, &comm, config, NCCL_SHRINK_DEFAULT);
  } else {
    return 64;
  }
  if (config) drv::protect_guarded_page(false);

  drv::out("result", r);
  drv::out("newcomm_null", comm == nullptr ? 1 : 0);
  if (config) drv::out("after", drv::hex(config, size));
  if (r == ncclSuccess && comm != nullptr) ncclCommDestroy(comm);
  if (parent != nullptr) ncclCommDestroy(parent);
  return 0;
}
