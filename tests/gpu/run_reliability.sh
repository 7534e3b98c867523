#!/usr/bin/env bash
# Runs zerocta's reliability tests on a GPU host with 2 or more GPUs; builds nothing. The
# whole run stays within ZCTEST_RELIABILITY_BUDGET_S (360 s): each step gets its own timeout,
# cut to what is left, and the optional baselines run only if time remains.
#
#   tests/gpu/run_reliability.sh BUILD OUTDIR
#
#   kill-shim      FaultKill: peer SIGKILLed mid-stream, rank 0 aborts and drains (zerocta route)
#   abort-shim     FaultAbort: ncclCommAbort with zerocta's ops queued, on both ranks
#   capture-shim   Capture: a capture retried on one rank, eager against captured: an error
#                  on every rank, no hang
#   cycles-shim    CommCycles: init / all-gather / destroy cycles, RSS and GPU memory growth
#   mismatch-shim  ConfigMismatch: ZEROCTA_ALLGATHER differing across ranks agrees on
#                  pass-through (no hang, one WARN); nccl everywhere stays quiet
#   kill-noshim    baseline: the kill test with NCCL alone (its abort times), if time is left
#   cycles-noshim  baseline: 100 cycles with NCCL alone (a leak there is NCCL's), if time left
#
# Logs go to OUTDIR/<step>.log. The tests' "RELIABILITY ..." lines (times, memory numbers) and
# a PASS/FAIL/SKIP table end the output and OUTDIR/summary.txt. Exit status 1 if a step
# failed.
#
# Optional environment: ZCTEST_NCCL_DIR (directory of the libnccl.so.2 to use, default the
# system's /usr/lib/x86_64-linux-gnu), ZCTEST_CUDA_LIB (/usr/local/cuda/lib64),
# ZCTEST_RELIABILITY_BUDGET_S (360), ZCTEST_RELIABILITY_ONLY=REGEX (steps to run), and the
# tests' own knobs (ZCTEST_FAULT_*, ZCTEST_CYCLES*), which are passed through.
set -u -o pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD OUTDIR" >&2
  exit 2
fi
BUILD=$(cd "$1" 2>/dev/null && pwd) || {
  echo "build directory $1 not found" >&2
  exit 2
}
mkdir -p "$2" || exit 2
OUT=$(cd "$2" && pwd)
SHIM=$BUILD/libzerocta.so
BIN=$BUILD/tests/gpu
NCCL_DIR=${ZCTEST_NCCL_DIR:-/usr/lib/x86_64-linux-gnu}
CUDA_LIB=${ZCTEST_CUDA_LIB:-/usr/local/cuda/lib64}
BUDGET=${ZCTEST_RELIABILITY_BUDGET_S:-360}
ONLY=${ZCTEST_RELIABILITY_ONLY:-}
LIBPATH="$NCCL_DIR:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# Never NVLink multicast on the shared hosts; nothing inherited may steer the shim.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
unset NCCL_CTA_POLICY LD_PRELOAD ZEROCTA_ALLGATHER ZCTEST_EXPECT_SHIM \
  ZCTEST_EXPECT_NCCL_VERSION

# shellcheck source=tests/gpu/gpu_host_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu_host_lib.sh"
RECORD_WIDTH=14
NGPU=$(count_gpus)
{
  echo "date: $(date -Is)"
  echo "host: $(hostname)"
  echo "build: $BUILD"
  echo "nccl dir: $NCCL_DIR"
  echo "gpus: $NGPU"
  nvidia-smi -L 2>/dev/null || true
} >"$OUT/env.txt"
echo "zerocta reliability: build=$BUILD out=$OUT gpus=$NGPU budget=${BUDGET}s"


# step_seconds WANT_S: the timeout a step asking for WANT_S gets, cut to the budget left.
step_seconds() {
  local left=$((BUDGET - SECONDS - 5))
  echo $(($1 < left ? $1 : left))
}

# run_step NAME WANT_S MIN_S SHIM(1|0) BINARY GTEST_FILTER [VAR=VALUE...]
# Runs with a timeout of WANT_S, cut to the time left (SKIP when less than MIN_S is left).
run_step() {
  local name=$1 want=$2 min=$3 shim=$4 bin=$5 filter=$6
  shift 6
  selected "$name" || return 0
  local left secs
  left=$((BUDGET - SECONDS - 5))
  secs=$(step_seconds "$want")
  if [ "$secs" -lt "$min" ]; then
    record "$name" SKIP "not enough of the ${BUDGET}s budget left (${left}s)"
    return 0
  fi
  if [ "$NGPU" -lt 2 ]; then
    record "$name" SKIP "needs 2 GPUs, $NGPU visible"
    return 0
  fi
  if [ ! -x "$BIN/$bin" ] || { [ "$shim" = 1 ] && [ ! -e "$SHIM" ]; }; then
    record "$name" FAIL "missing $BIN/$bin or $SHIM (build first)"
    return 0
  fi
  # Per-operation deadlines well inside the step's timeout, so a hang is reported by the test
  # itself (which rank, which operation) rather than by `timeout`.
  local envs=("LD_LIBRARY_PATH=$LIBPATH" "ZCTEST_EXPECT_SHIM=$shim"
    "ZCTEST_OP_TIMEOUT_S=${ZCTEST_OP_TIMEOUT_S:-20}")
  [ "$shim" = 1 ] && envs+=("LD_PRELOAD=$SHIM")
  local log="$OUT/$name.log" start=$SECONDS
  echo "== $name (timeout ${secs}s): ${envs[*]} $* $bin --gtest_filter=$filter" >"$log"
  timeout --kill-after=10 "$secs" env "${envs[@]}" "$@" "$BIN/$bin" "--gtest_filter=$filter" \
    "--gtest_output=xml:$OUT/$name.xml" >>"$log" 2>&1
  local rc=$? took=$((SECONDS - start))
  grep -h '^RELIABILITY' "$log" | sed "s/^/    /"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" FAIL "timed out after ${secs}s: a hang (log $log)"
  elif [ $rc -ne 0 ]; then
    record "$name" FAIL "exit $rc after ${took}s (log $log)"
  elif grep -q '^\[  SKIPPED \]' "$log" && ! grep -q '^\[       OK \]' "$log"; then
    record "$name" SKIP "$(grep -m1 -o -e 'no GPU' -e 'needs [0-9]* GPUs.*' "$log")"
  else
    record "$name" PASS "${took}s"
  fi
}

# Name          want min shim binary                    filter
run_step kill-shim 75 45 1 zerocta_gpu_fault_test 'FaultKill.*'
run_step abort-shim 60 30 1 zerocta_gpu_fault_test 'FaultAbort.*'
run_step capture-shim 75 30 1 zerocta_gpu_fault_test 'Capture.*'
run_step channel-shim 60 30 1 zerocta_gpu_fault_test 'Channel.*'
run_step mismatch-shim 90 45 1 zerocta_gpu_fault_test 'ConfigMismatch.*'
# The cycles test sizes its run from its budget: keep it inside the step's timeout, with room
# for its first measured cycles and its teardown.
run_step cycles-shim 150 60 1 zerocta_gpu_cycles_test 'CommCycles.*' \
  "ZCTEST_CYCLES_BUDGET_S=${ZCTEST_CYCLES_BUDGET_S:-$(($(step_seconds 150) - 25))}"
run_step kill-noshim 60 45 0 zerocta_gpu_fault_test 'FaultKill.*'
run_step cycles-noshim 60 45 0 zerocta_gpu_cycles_test 'CommCycles.*' \
  "ZCTEST_CYCLES=${ZCTEST_NOSHIM_CYCLES:-100}"

failed=0
{
  echo
  echo "================ zerocta reliability summary ($NGPU GPUs, ${SECONDS}s) ================"
  for log in "$OUT"/*.log; do
    [ -e "$log" ] || continue
    grep -h '^RELIABILITY' "$log" | sed "s/^/$(basename "$log" .log): /"
  done
  echo "----------------------------------------------------------------------------------"
  for i in "${!NAMES[@]}"; do
    printf '%-14s %-5s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${NOTES[$i]}"
    [ "${RESULTS[$i]}" = FAIL ] && failed=$((failed + 1))
  done
  echo "=================================================================================="
  if [ $failed -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL ($failed steps)"; fi
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
[ $failed -eq 0 ]
