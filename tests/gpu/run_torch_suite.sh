#!/usr/bin/env bash
# PyTorch's own distributed tests (e.g. test/distributed/test_c10d_nccl.py, which PyTorch's wheel
# does not ship: copy them from PyTorch's repository at the installed version into TESTDIR)
# without zerocta and with it, side by side: which tests pass on NCCL alone and fail, hang or
# skip with the library.
#
#   run_torch_suite.sh TESTDIR OUTDIR SELECTION...
#
# SELECTION: pytest node ids relative to TESTDIR, e.g. test_c10d_nccl.py::ProcessGroupNCCLGroupTest
# (add ::test_name for one test). Modes (ZCTEST_TORCH_MODES, default "plain shim"): plain = no
# library; shim = LD_PRELOAD=$ZEROCTA_BUILD/libzerocta.so with ZEROCTA_ALLGATHER=auto,
# ZEROCTA_MIN_BYTES=1 and expandable segments (ZCTEST_TORCH_SHIM_ENV adds more, e.g.
# "ZEROCTA_LOG=debug"). Per test: ZCTEST_TORCH_TIMEOUT seconds (default 150, pytest-timeout).
# ZCTEST_TORCH_K: pytest -k expression. ZCTEST_TORCH_STACKS_AFTER=S: S seconds into each mode's
# run, the native stacks of every process of it still running (cuda-gdb) go to
# OUTDIR/MODE-stacks.txt, for a hang's cause.
# Out: OUTDIR/MODE.xml (JUnit, written at the end), OUTDIR/MODE.log (a line per test as it ends),
# OUTDIR/summary.txt; exit 1 when a test that
# passed plain did not pass with the library.
set -uo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/../.." && pwd)
(($# >= 3)) || { echo "usage: $0 TESTDIR OUTDIR SELECTION..." >&2 && exit 2; }
testdir=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && outdir=$(cd "$2" && pwd) || exit 2
shift 2
lib=$(readlink -f -- "${ZEROCTA_BUILD:-$repo/build}/libzerocta.so")
[[ -f $lib ]] || { echo "$0: libzerocta.so not found; set ZEROCTA_BUILD" >&2 && exit 2; }
python=${PYTHON:-python3}
[[ -x /opt/torch/.venv/bin/python3 && -z ${PYTHON:-} ]] && python=/opt/torch/.venv/bin/python3
# NVLink multicast stays off on the project's GPU machines, in every run.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
echo "run_torch_suite: set NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink multicast off)"

# The native stacks of every process in `pgid`'s group, after `secs` seconds.
dump_stacks_later() {
  local secs=$1 pgid=$2 out=$3
  sleep "$secs"
  command -v cuda-gdb >/dev/null || { echo "no cuda-gdb" >"$out" && return; }
  for pid in $(pgrep -g "$pgid"); do
    {
      echo "=== pid $pid: $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-200)"
      timeout 60 cuda-gdb -q -batch -p "$pid" -ex "info threads" -ex "thread apply all bt 30" 2>&1 |
        grep -v "^\[New Thread\|^warning:" | head -400
    } >>"$out"
  done
}

run_mode() {
  local mode=$1
  shift
  local -a env_mode=()
  if [[ $mode == shim ]]; then
    read -r -a extra <<<"${ZCTEST_TORCH_SHIM_ENV:-}"
    env_mode=(LD_PRELOAD="$lib" ZEROCTA_ALLGATHER=auto ZEROCTA_MIN_BYTES=1
      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "${extra[@]}")
  fi
  local -a k=()
  [[ -n ${ZCTEST_TORCH_K:-} ]] && k=(-k "$ZCTEST_TORCH_K")
  (
    cd "$testdir" || exit 2
    exec setsid env "${env_mode[@]}" "$python" -m pytest -v -p no:cacheprovider -rA \
      --timeout="${ZCTEST_TORCH_TIMEOUT:-150}" --junitxml="$outdir/$mode.xml" "${k[@]}" "$@"
  ) >"$outdir/$mode.log" 2>&1 &
  local pid=$!
  local watcher=
  if [[ -n ${ZCTEST_TORCH_STACKS_AFTER:-} ]]; then
    dump_stacks_later "$ZCTEST_TORCH_STACKS_AFTER" "$pid" "$outdir/$mode-stacks.txt" &
    watcher=$!
  fi
  wait "$pid"
  echo "run_torch_suite: $mode exited $?"
  [[ -n $watcher ]] && kill "$watcher" 2>/dev/null
  pkill -9 -g "$pid" 2>/dev/null || true
}

for mode in ${ZCTEST_TORCH_MODES:-plain shim}; do
  run_mode "$mode" "$@"
done
"$python" "$here/torch_suite_summary.py" "$outdir" ${ZCTEST_TORCH_MODES:-plain shim} |
  tee "$outdir/summary.txt"
