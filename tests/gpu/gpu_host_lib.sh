# shellcheck shell=bash
# Shared by the GPU-host scripts (run_gpu_suite.sh, run_reliability.sh, run_do_no_harm.sh,
# run_zero_copy.sh); sourced, not run.

# The paths every GPU-host script starts from: OUTDIR (created) as OUT, $ZEROCTA_BUILD (default
# ./build) as BUILD, the shim, the test binaries, CUDA's libraries and the system NCCL. Exits 2
# with a usage line when OUTDIR is missing or the build is not there.
# shellcheck disable=SC2034  # the variables are the caller's
host_paths() {
  if [ $# -ne 1 ]; then
    echo "usage: ZEROCTA_BUILD=build $0 OUTDIR" >&2
    exit 2
  fi
  mkdir -p "$1" || exit 2
  OUT=$(cd "$1" && pwd)
  BUILD=$(cd "${ZEROCTA_BUILD:-./build}" 2>/dev/null && pwd) || {
    echo "build directory ${ZEROCTA_BUILD:-./build} not found (set ZEROCTA_BUILD)" >&2
    exit 2
  }
  SHIM=$BUILD/libzerocta.so
  BIN=$BUILD/tests/gpu
  CUDA_LIB=${ZCTEST_CUDA_LIB:-/usr/local/cuda/lib64}
  NCCL_SYSTEM_DIR=${ZCTEST_NCCL_SYSTEM_DIR:-/usr/lib/x86_64-linux-gnu}
  TORCHRUN=${ZCTEST_TORCHRUN:-$(command -v torchrun || echo /opt/torch/.venv/bin/torchrun)}
}

# Number of GPUs this process would use, without touching them beyond a query.
count_gpus() {
  if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
    echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU'
  else
    find /proc/driver/nvidia/gpus -mindepth 1 -maxdepth 1 2>/dev/null | wc -l
  fi
}

# Step bookkeeping: record NAME RESULT NOTE appends to NAMES/RESULTS/NOTES and prints a row
# whose name column is RECORD_WIDTH wide (default 34).
NAMES=()
RESULTS=()
NOTES=()
record() {
  NAMES+=("$1")
  RESULTS+=("$2")
  NOTES+=("$3")
  printf "%-${RECORD_WIDTH:-34}s %-5s %s\n" "$1" "$2" "$3"
}

# Whether step NAME matches the ONLY regex (all steps when ONLY is empty).
selected() { [ -z "${ONLY:-}" ] || echo "$1" | grep -Eq -- "$ONLY"; }

result_of() {  # the recorded result of step $1
  local i
  for i in "${!NAMES[@]}"; do
    [ "${NAMES[$i]}" = "$1" ] && echo "${RESULTS[$i]}" && return
  done
  echo NONE
}

# expect_in_log NAME LOG PATTERN WHAT: turns a PASS of NAME into FAIL unless LOG has PATTERN.
expect_in_log() {
  local name=$1 log=$2 pattern=$3 what=$4
  if [ "$(result_of "$name")" = PASS ] && ! grep -q -- "$pattern" "$log"; then
    record "$name" FAIL "$what"
  fi
}

# step NAME TIMEOUT CMD...: runs CMD (if NAME is selected) with its output in OUT/NAME.log and
# records PASS on exit 0, FAIL with the status, or FAIL "hung" when TIMEOUT seconds ran out.
step() {
  local name=$1 secs=$2
  shift 2
  selected "$name" || return 0
  local start=$SECONDS
  timeout --kill-after=20 "$secs" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" FAIL "hung: killed after ${secs}s"
  elif [ $rc -ne 0 ]; then
    record "$name" FAIL "exit $rc ($name.log)"
  else
    record "$name" PASS "$((SECONDS - start))s"
  fi
}
