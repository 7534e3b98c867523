#include "premul_sums.h"

#include <algorithm>

namespace zc {

void PreMulSums::note(const PreMulSum& p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it =
      std::find_if(ops_.begin(), ops_.end(), [&](const PreMulSum& o) { return o.op == p.op; });
  if (it != ops_.end())
    *it = p;
  else
    ops_.push_back(p);
}

void PreMulSums::forget(ncclRedOp_t op) {
  std::lock_guard<std::mutex> lock(mu_);
  ops_.erase(
      std::remove_if(ops_.begin(), ops_.end(), [&](const PreMulSum& o) { return o.op == op; }),
      ops_.end());
}

bool PreMulSums::find(ncclRedOp_t op, PreMulSum* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const PreMulSum& p : ops_)
    if (p.op == op) {
      *out = p;
      return true;
    }
  return false;
}

ResolvedRedOp resolve_red_op(const PreMulSums* sums, ncclRedOp_t op) {
  ResolvedRedOp r;
  r.op = op;
  if (op == ncclSum || op == ncclAvg) {
    r.kind = op == ncclSum ? RsReduce::kSum : RsReduce::kAvg;
    return r;
  }
  const bool noted = op >= ncclNumOps && sums != nullptr && sums->find(op, &r.premul);
  r.kind = noted ? RsReduce::kPreMulSum : RsReduce::kOther;
  return r;
}

}  // namespace zc
