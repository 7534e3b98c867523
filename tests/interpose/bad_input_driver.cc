// Bad-input driver, collective steps and main(); the step language is in bad_input_driver.h.
// Buffers are made-up addresses (the fake NCCL never touches data), so every "bad" buffer is
// only bad in its value: NULL, overlapping, misaligned, too many elements.
#include "bad_input_driver.h"

#include <cstdint>
#include <cstdio>
#include <vector>

#include "driver_util.h"

namespace bad {
namespace {

constexpr size_t kCount = 1000;  // elements per rank of the valid calls
constexpr int kRoot = 1;         // a valid root / peer of the 2-rank communicators

cudaStream_t stream() { return static_cast<cudaStream_t>(drv::fake_stream(1)); }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return parts;
}

// The arguments of one collective call after applying a variant to the valid ones.
struct Call {
  const void* send = drv::fake_buffer(1);
  void* recv = drv::fake_buffer(2);
  size_t count = kCount;
  ncclDataType_t dtype = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = kRoot;
};

bool apply_variant(const std::string& v, Call* c) {
  auto* recv = static_cast<char*>(c->recv);
  if (v == "ok") {
  } else if (v == "inplace") {  // rank 0's slot of the output: NCCL's in-place layout
    c->send = recv;
  } else if (v == "nullsend") {
    c->send = nullptr;
  } else if (v == "nullrecv") {
    c->recv = nullptr;
  } else if (v == "nullboth") {
    c->send = nullptr, c->recv = nullptr;
  } else if (v == "count0") {
    c->count = 0;
  } else if (v == "count0null") {
    c->count = 0, c->send = nullptr, c->recv = nullptr;
  } else if (v == "dtype99") {
    c->dtype = static_cast<ncclDataType_t>(99);
  } else if (v == "dtypeneg") {
    c->dtype = static_cast<ncclDataType_t>(-1);
  } else if (v == "badop") {
    c->op = static_cast<ncclRedOp_t>(99);
  } else if (v == "badroot") {
    c->root = 7;                // outside the 2-rank communicator
  } else if (v == "overlap") {  // overlaps the output, but not at this rank's slot
    c->send = recv + 4 * kCount + 1;
  } else if (v == "misaligned") {
    c->send = static_cast<const char*>(c->send) + 3;
    c->recv = recv + 5;
  } else if (v == "hugecount") {  // count * element size * ranks overflows 64 bits
    c->count = SIZE_MAX / 2;
  } else {
    return false;
  }
  return true;
}

ncclResult_t issue(const std::string& op, const Call& c, ncclComm_t comm) {
  cudaStream_t s = stream();
  if (op == "allgather") return ncclAllGather(c.send, c.recv, c.count, c.dtype, comm, s);
  if (op == "allreduce") return ncclAllReduce(c.send, c.recv, c.count, c.dtype, c.op, comm, s);
  if (op == "reducescatter")
    return ncclReduceScatter(c.send, c.recv, c.count, c.dtype, c.op, comm, s);
  if (op == "reduce") return ncclReduce(c.send, c.recv, c.count, c.dtype, c.op, c.root, comm, s);
  if (op == "broadcast") return ncclBroadcast(c.send, c.recv, c.count, c.dtype, c.root, comm, s);
  if (op == "bcast") return ncclBcast(c.recv, c.count, c.dtype, c.root, comm, s);
  if (op == "alltoall") return ncclAlltoAll(c.send, c.recv, c.count, c.dtype, comm, s);
  if (op == "gather") return ncclGather(c.send, c.recv, c.count, c.dtype, c.root, comm, s);
  if (op == "scatter") return ncclScatter(c.send, c.recv, c.count, c.dtype, c.root, comm, s);
  if (op == "send") return ncclSend(c.send, c.count, c.dtype, c.root, comm, s);
  if (op == "recv") return ncclRecv(c.recv, c.count, c.dtype, c.root, comm, s);
  return static_cast<ncclResult_t>(-1);
}

}  // namespace

// The collective `step` printed under the name `printed`.
bool collective_step_as(const std::string& step, const std::string& printed);

Comms& comms() {
  static Comms c;
  return c;
}

bool comm_named(const std::string& name, ncclComm_t* out) {
  if (name == "live") {
    *out = comms().live;
  } else if (name == "null") {
    *out = nullptr;
  } else if (name == "dead") {
    *out = comms().dead;
  } else if (name == "garbage") {
    *out = reinterpret_cast<ncclComm_t>(uintptr_t{0xdead0000});
  } else {
    return false;
  }
  return true;
}

void result(const std::string& step, long long value) { drv::out(step, value); }

bool collective_step(const std::string& step) {
  // "grouped:<step>": the call inside ncclGroupStart/End; "<step>.end" = the group's result.
  const std::string kGrouped = "grouped:";
  if (step.rfind(kGrouped, 0) == 0) {
    ncclResult_t start = ncclGroupStart();
    const bool known = collective_step_as(step.substr(kGrouped.size()), step);
    ncclResult_t end = ncclGroupEnd();
    if (known) result(step + ".end", start != ncclSuccess ? start : end);
    return known;
  }
  return collective_step_as(step, step);
}

bool collective_step_as(const std::string& step, const std::string& printed) {
  std::vector<std::string> p = split(step, ':');
  if (p.size() != 3) return false;
  Call call;
  ncclComm_t comm = nullptr;
  if (!comm_named(p[1], &comm) || !apply_variant(p[2], &call)) return false;
  ncclResult_t r = issue(p[0], call, comm);
  if (static_cast<int>(r) == -1) return false;
  result(printed, r);
  return true;
}

}  // namespace bad

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string step = argv[i];
    drv::log_marker(("step " + step).c_str());
    if (!bad::lifecycle_step(step) && !bad::collective_step(step)) {
      fprintf(stderr, "bad_input_driver: unknown step %s\n", argv[i]);
      return 64;
    }
  }
  return 0;
}
