#!/usr/bin/env bash
# Runs zerocta's GPU test suite on a GPU host; builds nothing.
#
#   ZEROCTA_BUILD=/path/to/build tests/gpu/run_gpu_suite.sh OUTDIR
#
# For each NCCL found (the system 2.28.3 in /usr/lib/x86_64-linux-gnu and the 2.28.9 of the
# PyTorch wheel), without and with LD_PRELOAD=$ZEROCTA_BUILD/libzerocta.so:
#   collectives   zerocta_gpu_collectives_test; the two digest files must be identical
#   policy        zerocta_gpu_policy_test: kernel path without the shim, copy engines with it
#   soak          zerocta_gpu_ag_soak with the shim (ZCTEST_SOAK_ITERS, default 200) and a
#                 short control run without it (ZCTEST_SUITE_NOSHIM_SOAK_ITERS, default 50)
#   rs-soak       zerocta_gpu_rs_soak (2 GPUs) with the shim and ZEROCTA_REDUCESCATTER=zerocta
#                 (ZCTEST_RS_SOAK_OPS, default 10000; every eager op on the copy engines,
#                 bitwise against NCCL's own result) and a CI-size control run without it
#                 (ZCTEST_SUITE_NOSHIM_RS_SOAK_OPS, default 400)
# and torch_smoke.py under torchrun (PyTorch always uses its own NCCL), digests diffed.
# Logs, digests and gtest XML go to OUTDIR; a PASS/FAIL/SKIP table ends the output and
# OUTDIR/summary.txt. Exit status 1 if any step failed.
#
# Optional environment:
#   ZCTEST_SUITE_ONLY=REGEX      run only the steps whose name matches (grep -E)
#   ZCTEST_NCCL_SYSTEM_DIR, ZCTEST_NCCL_TORCH_DIR   where the two libnccl.so.2 live
#   ZCTEST_CUDA_LIB (/usr/local/cuda/lib64), ZCTEST_TORCHRUN, ZCTEST_SOAK_SEED
#   ZCTEST_SOAK_EXPECT_CE (1): the soak with the shim fails unless some all-gather took a
#                              copy-engine route
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/gpu/gpu_host_lib.sh
. "$HERE/gpu_host_lib.sh"
host_paths "$@"
NCCL_TORCH_DIR=${ZCTEST_NCCL_TORCH_DIR:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib}
SOAK_ITERS=${ZCTEST_SOAK_ITERS:-200}
NOSHIM_SOAK_ITERS=${ZCTEST_SUITE_NOSHIM_SOAK_ITERS:-50}
RS_SOAK_OPS=${ZCTEST_RS_SOAK_OPS:-10000}
NOSHIM_RS_SOAK_OPS=${ZCTEST_SUITE_NOSHIM_RS_SOAK_OPS:-400}
ONLY=${ZCTEST_SUITE_ONLY:-}

# Never NVLink multicast on the shared hosts; nothing inherited may change the policy.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
unset NCCL_CTA_POLICY LD_PRELOAD ZCTEST_DIGEST_FILE ZCTEST_EXPECT_CE ZCTEST_EXPECT_SHIM \
  ZCTEST_EXPECT_NCCL_VERSION

# --- GPU count, without touching the GPUs beyond a query ------------------------------------
RECORD_WIDTH=34
NGPU=$(count_gpus)
NRANKS=$((NGPU > 8 ? 8 : NGPU))
{
  echo "date: $(date -Is)"
  echo "host: $(hostname)"
  echo "build: $BUILD"
  echo "gpus: $NGPU"
  nvidia-smi -L 2>/dev/null || true
} >"$OUT/env.txt"
echo "zerocta GPU suite: build=$BUILD out=$OUT gpus=$NGPU"

# --- steps (record/selected: gpu_host_lib.sh) ---------------------------------------------

# run_step NAME TIMEOUT_S CMD...: runs CMD with a deadline, output to OUT/NAME.log.
# PASS on exit 0, SKIP when a gtest binary ran no test (no GPU / too few GPUs), FAIL otherwise.
run_step() {
  local name=$1 secs=$2
  shift 2
  local log="$OUT/$name.log"
  echo "== $name: $*" >"$log"
  local start=$SECONDS
  timeout --kill-after=30 "$secs" "$@" >>"$log" 2>&1
  local rc=$?
  local took="$((SECONDS - start))s"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" FAIL "timed out after ${secs}s (log $log)"
  elif [ $rc -ne 0 ]; then
    record "$name" FAIL "exit $rc after $took (log $log)"
  elif grep -q '^\[  PASSED  \] 0 tests' "$log"; then
    record "$name" SKIP "no test ran: $(grep -m1 -o -e 'no GPU' -e 'needs [0-9]* GPUs.*' "$log")"
  else
    record "$name" PASS "$took"
  fi
  return $rc
}

# diff_step NAME A B: identical non-empty files -> PASS.
diff_step() {
  local name=$1 a=$2 b=$3
  if [ ! -s "$a" ] || [ ! -s "$b" ]; then
    record "$name" SKIP "no digests to compare ($(basename "$a"), $(basename "$b"))"
  elif diff -u "$a" "$b" >"$OUT/$name.diff"; then
    record "$name" PASS "$(wc -l <"$a") digests identical"
  else
    record "$name" FAIL "digests differ: $OUT/$name.diff ($(grep -c '^-[^-]' "$OUT/$name.diff") lines)"
  fi
}

need() {  # need NAME FILE: FAIL the step when a file it needs is missing
  if [ ! -e "$2" ]; then
    record "$1" FAIL "missing $2"
    return 1
  fi
}

# NCCL_VERSION_CODE of DIR/libnccl.so.2, asked from the library itself by a test binary
# (pip wheels ship a plain libnccl.so.2 without a versioned name). Empty when that library
# is not the one a test binary loads with DIR first in LD_LIBRARY_PATH.
version_code() {
  local dir=$1 line want
  [ -e "$dir/libnccl.so.2" ] || return 0
  want=$(dirname "$(readlink -f "$dir/libnccl.so.2")")
  line=$(LD_LIBRARY_PATH="$dir:$CUDA_LIB" "$BIN/zerocta_gpu_collectives_test" \
    --gtest_list_tests 2>/dev/null | grep -m1 '^zerocta-gpu-test:')
  if [[ $line =~ nccl-version=([0-9]+)\ nccl-library=([^ ]+) ]] &&
    [ "$(dirname "${BASH_REMATCH[2]}")" = "$want" ]; then
    echo "${BASH_REMATCH[1]}"
  fi
}

# --- native test binaries, per NCCL --------------------------------------------------------
for b in zerocta_gpu_collectives_test zerocta_gpu_policy_test zerocta_gpu_ag_soak \
  zerocta_gpu_rs_soak; do
  [ -x "$BIN/$b" ] || record "build:$b" FAIL "missing $BIN/$b (build first; ZEROCTA_BUILD?)"
done
[ -e "$SHIM" ] || record "build:libzerocta.so" FAIL "missing $SHIM"
for NCCL_DIR in "$NCCL_SYSTEM_DIR" "$NCCL_TORCH_DIR"; do
  CODE=$(version_code "$NCCL_DIR")
  if [ -z "$CODE" ]; then
    record "nccl:$NCCL_DIR" SKIP "no libnccl.so.2 there that a test binary loads"
    continue
  fi
  V="nccl$CODE"
  LIBPATH="$NCCL_DIR:$CUDA_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  BASE_ENV=(env "LD_LIBRARY_PATH=$LIBPATH" "ZCTEST_EXPECT_NCCL_VERSION=$CODE")
  NOSHIM=("${BASE_ENV[@]}" ZCTEST_EXPECT_SHIM=0)
  # The copy-engine route is opt-in (ZEROCTA_ALLGATHER defaults to nccl): exercise it.
  WITHSHIM=("${BASE_ENV[@]}" ZCTEST_EXPECT_SHIM=1 "LD_PRELOAD=$SHIM"
    "ZEROCTA_ALLGATHER=${ZCTEST_SUITE_ALLGATHER:-auto}")

  # Collectives: results with and without the shim must be bitwise identical.
  if selected "collectives-$V"; then
    for mode in noshim shim; do
      step="collectives-$V-$mode"
      digest="$OUT/collectives-$V-$mode.digest"
      rm -f "$digest"
      if [ $mode = noshim ]; then prefix=("${NOSHIM[@]}"); else prefix=("${WITHSHIM[@]}"); fi
      need "$step" "$BIN/zerocta_gpu_collectives_test" || continue
      [ $mode = noshim ] || need "$step" "$SHIM" || continue
      run_step "$step" 3600 "${prefix[@]}" "ZCTEST_DIGEST_FILE=$digest" \
        "$BIN/zerocta_gpu_collectives_test" "--gtest_output=xml:$OUT/$step.xml"
    done
    diff_step "collectives-$V-digest-diff" "$OUT/collectives-$V-noshim.digest" \
      "$OUT/collectives-$V-shim.digest"
  fi

  # Policy: kernels without the shim, copy engines (0 kernels) with it, on every comm.
  if selected "policy-$V"; then
    for mode in noshim shim; do
      step="policy-$V-$mode"
      if [ $mode = noshim ]; then prefix=("${NOSHIM[@]}" ZCTEST_EXPECT_CE=0); else
        prefix=("${WITHSHIM[@]}" ZCTEST_EXPECT_CE=1); fi
      need "$step" "$BIN/zerocta_gpu_policy_test" || continue
      [ $mode = noshim ] || need "$step" "$SHIM" || continue
      run_step "$step" 600 "${prefix[@]}" "$BIN/zerocta_gpu_policy_test" \
        "--gtest_output=xml:$OUT/$step.xml"
    done
  fi

  # Soak: the long run with the shim, a short control run of the test itself without it.
  if selected "soak-$V"; then
    for mode in noshim shim; do
      step="soak-$V-$mode"
      if [ $mode = noshim ]; then
        prefix=("${NOSHIM[@]}" "ZCTEST_SOAK_ITERS=$NOSHIM_SOAK_ITERS")
        iters=$NOSHIM_SOAK_ITERS
      else
        prefix=("${WITHSHIM[@]}" "ZCTEST_SOAK_ITERS=$SOAK_ITERS"
          "ZCTEST_SOAK_EXPECT_CE=${ZCTEST_SOAK_EXPECT_CE:-1}")
        iters=$SOAK_ITERS
      fi
      need "$step" "$BIN/zerocta_gpu_ag_soak" || continue
      [ $mode = noshim ] || need "$step" "$SHIM" || continue
      run_step "$step" $((900 + 3 * iters)) "${prefix[@]}" "ZCTEST_SOAK_TIMEOUT_S=$((600 + 3 * iters))" \
        "$BIN/zerocta_gpu_ag_soak" "--gtest_output=xml:$OUT/$step.xml"
      grep -h '^soak: iterations=' "$OUT/$step.log" | sed "s/^/    $step /"
    done
  fi

  # Reduce-scatter soak: the route forced (every eager op must take it), each result bitwise
  # against NCCL's own on a communicator the shim never sees; the control run without the shim
  # checks the test itself, CI size.
  if selected "rs-soak-$V"; then
    for mode in noshim shim; do
      step="rs-soak-$V-$mode"
      if [ $mode = noshim ]; then
        ops=$NOSHIM_RS_SOAK_OPS
        prefix=("${NOSHIM[@]}" ZCTEST_RS_SOAK_CI=1)
      else
        ops=$RS_SOAK_OPS
        prefix=("${WITHSHIM[@]}" ZEROCTA_REDUCESCATTER=zerocta ZCTEST_RS_SOAK_EXPECT_CE=1)
      fi
      need "$step" "$BIN/zerocta_gpu_rs_soak" || continue
      [ $mode = noshim ] || need "$step" "$SHIM" || continue
      run_step "$step" $((600 + ops / 5)) "${prefix[@]}" "ZCTEST_RS_SOAK_OPS=$ops" \
        "ZCTEST_RS_SOAK_TIMEOUT_S=$((540 + ops / 5))" \
        "$BIN/zerocta_gpu_rs_soak" "--gtest_output=xml:$OUT/$step.xml"
      grep -h '^rs-soak: rank 0 ' "$OUT/$step.log" | sed "s/^/    $step /"
    done
  fi
done

# --- PyTorch (its own NCCL) ------------------------------------------------------------------
if selected "torch"; then
  if [ "$NGPU" -lt 2 ]; then
    record "torch" SKIP "needs 2 GPUs, $NGPU visible"
  elif [ ! -x "$TORCHRUN" ]; then
    record "torch" SKIP "torchrun not found (ZCTEST_TORCHRUN)"
  else
    for mode in noshim shim; do
      step="torch-$mode"
      if [ $mode = noshim ]; then prefix=(env); else
        need "$step" "$SHIM" || continue
        prefix=(env "LD_PRELOAD=$SHIM" "ZEROCTA_ALLGATHER=${ZCTEST_SUITE_ALLGATHER:-auto}")
      fi
      run_step "$step" 900 "${prefix[@]}" "$TORCHRUN" --standalone "--nproc-per-node=$NRANKS" \
        "$HERE/torch_smoke.py"
      grep '^digest ' "$OUT/$step.log" >"$OUT/torch-$mode.digest"
    done
    expect_in_log torch-noshim "$OUT/torch-noshim.log" "zerocta-loaded no" \
      "expected no shim in the process"
    expect_in_log torch-shim "$OUT/torch-shim.log" "zerocta-loaded yes" \
      "the shim was not loaded (LD_PRELOAD failed?)"
    diff_step "torch-digest-diff" "$OUT/torch-noshim.digest" "$OUT/torch-shim.digest"
  fi
fi

# --- summary -------------------------------------------------------------------------------
# A step recorded twice (PASS, then FAIL from a later check) counts by its last result.
declare -A FINAL=()
ORDER=()
for i in "${!NAMES[@]}"; do
  n=${NAMES[$i]}
  [ -n "${FINAL[$n]+x}" ] || ORDER+=("$n")
  FINAL[$n]="${RESULTS[$i]}|${NOTES[$i]}"
done
failed=0
{
  echo
  echo "================ zerocta GPU suite summary ($NGPU GPUs) ================"
  for n in "${ORDER[@]}"; do
    r=${FINAL[$n]%%|*}
    printf '%-34s %-4s %s\n' "$n" "$r" "${FINAL[$n]#*|}"
    [ "$r" = FAIL ] && failed=$((failed + 1))
  done
  echo "========================================================================="
  if [ $failed -eq 0 ]; then echo "RESULT: PASS"; else echo "RESULT: FAIL ($failed steps)"; fi
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
[ $failed -eq 0 ]
