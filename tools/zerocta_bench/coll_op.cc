#include "coll_op.h"

namespace zcb {

namespace {

struct OpRow {
  CollOp op;
  const char* name;
  const char* call;
  zerocta_op_t counter;
};
constexpr OpRow kOps[] = {
    {CollOp::kAllGather, "allgather", "ncclAllGather", zerocta_op_allgather},
    {CollOp::kAllReduce, "allreduce", "ncclAllReduce", zerocta_op_allreduce},
    {CollOp::kReduceScatter, "reducescatter", "ncclReduceScatter", zerocta_op_reducescatter},
    {CollOp::kBroadcast, "broadcast", "ncclBroadcast", zerocta_op_broadcast},
};

const OpRow& row(CollOp op) {
  for (const OpRow& r : kOps)
    if (r.op == op) return r;
  return kOps[0];
}

}  // namespace

const char* op_name(CollOp op) { return row(op).name; }
const char* op_nccl_call(CollOp op) { return row(op).call; }
zerocta_op_t op_shim_counter(CollOp op) { return row(op).counter; }

bool parse_op(const std::string& name, CollOp* out) {
  for (const OpRow& r : kOps) {
    if (name == r.name) {
      *out = r.op;
      return true;
    }
  }
  return false;
}

bool op_reduces(CollOp op) { return op == CollOp::kAllReduce || op == CollOp::kReduceScatter; }

CollShape coll_shape(CollOp op, uint64_t size_bytes, int nranks, int elem_bytes) {
  CollShape s;
  if (nranks <= 0 || elem_bytes <= 0) return s;
  const uint64_t n = static_cast<uint64_t>(nranks), e = static_cast<uint64_t>(elem_bytes);
  const uint64_t elems = size_bytes / e;
  switch (op) {
    case CollOp::kAllGather:
      s.count = elems / n;
      s.send_bytes = s.count * e;
      s.recv_bytes = s.send_bytes * n;
      s.bytes = s.recv_bytes;
      break;
    case CollOp::kReduceScatter:
      s.count = elems / n;
      s.recv_bytes = s.count * e;
      s.send_bytes = s.recv_bytes * n;
      s.bytes = s.send_bytes;
      break;
    case CollOp::kAllReduce:
    case CollOp::kBroadcast:
      s.count = elems;
      s.send_bytes = s.recv_bytes = s.bytes = elems * e;
      break;
  }
  if (s.count == 0) s = CollShape();
  return s;
}

double bus_factor(CollOp op, int nranks) {
  if (nranks <= 0) return 0;
  const double n = nranks;
  switch (op) {
    case CollOp::kAllReduce:
      return 2.0 * (n - 1) / n;
    case CollOp::kBroadcast:
      return 1.0;
    case CollOp::kAllGather:
    case CollOp::kReduceScatter:
      break;
  }
  return (n - 1) / n;
}

Placement place_buffers(CollOp op, bool in_place, int rank, const CollShape& s, char* a, char* b) {
  Placement p{a, b};
  if (!in_place) return p;
  const uint64_t r = static_cast<uint64_t>(rank);
  switch (op) {
    case CollOp::kAllGather:
      p.recv = b;
      p.send = b + r * s.send_bytes;
      break;
    case CollOp::kReduceScatter:
      p.send = a;
      p.recv = a + r * s.recv_bytes;
      break;
    case CollOp::kAllReduce:
    case CollOp::kBroadcast:
      p.send = p.recv = b;
      break;
  }
  return p;
}

}  // namespace zcb
