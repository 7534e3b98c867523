#!/usr/bin/env bash
# End to end: an application calling NCCL under LD_PRELOAD of the real libzerocta.so (fake
# NCCL underneath) shows zerocta's ranges to an NVTX tool, with op, route and bytes.
# usage: preloaded_nvtx_test.sh LIBZEROCTA FAKE_NCCL_DIR RECORDER DRIVER
set -euo pipefail
lib=$1 fake=$2 recorder=$3 driver=$4
rec=$(mktemp) rec_off=$(mktemp)
trap 'rm -f "$rec" "$rec_off"' EXIT

run() {  # run RECORD_FILE [VAR=VALUE...]
  local out=$1
  shift
  env -i PATH="$PATH" LD_PRELOAD="$lib" LD_LIBRARY_PATH="$fake" FAKE_NCCL_LOG=/dev/null \
    NVTX_INJECTION64_PATH="$recorder" ZCTEST_NVTX_RECORD="$out" "$@" \
    "$driver" init allgather allreduce bcast destroy >/dev/null
}

run "$rec"
fail() { echo "FAIL: $1"; echo "--- recorded:"; cat "$rec"; exit 1; }
# 2 ranks: the all-gather receives 2 x 1024 floats; the all-reduce 2048 floats; the
# broadcast 512 int8 (ncclBcast, whose inner ncclBroadcast is NCCL's own call: one range).
for want in "allgather passthrough	payload_u64=8192" "allreduce passthrough	payload_u64=8192" \
  "broadcast passthrough	payload_u64=512"; do
  grep -qF "zerocta	msg=$want	" "$rec" || fail "no range '$want'"
done
pushes=$(grep -c '^push' "$rec" || true)
pops=$(grep -c '^pop' "$rec" || true)
[ "$pushes" = 3 ] || fail "expected 3 ranges, got $pushes"
[ "$pops" = "$pushes" ] || fail "unbalanced: $pushes pushes, $pops pops"

run "$rec_off" ZEROCTA_NVTX=0
if grep -q '^push' "$rec_off"; then echo "FAIL: ZEROCTA_NVTX=0 still emitted ranges"; exit 1; fi
echo "nvtx end-to-end: 3 ranges recorded through the preloaded library, balanced; none with ZEROCTA_NVTX=0"
