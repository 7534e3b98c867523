#!/usr/bin/env bash
# Runs one training script twice under torchrun - plain NCCL, then under zerocta-run - and
# compares the two records with compare_runs.py (bitwise losses and weights, step times,
# zerocta's all-gather and reduce-scatter routes).
#
#   run_pair.sh NGPU OUTDIR NAME SCRIPT [SCRIPT ARGS...]
#     e.g. run_pair.sh 2 /tmp/zc ddp LD_PRELOAD-examples/ddp.py
#
# SCRIPT must accept --out FILE (fsdp2_gpt.py, ddp.py). Everything goes to OUTDIR/NAME/:
# plain.log/.json, zerocta.log/.json, stats/ (one ZEROCTA_STATS file per rank), summary.json,
# and with fsdp2_gpt.py --profile-steps N --keep-trace each rank's plain/zerocta.trace-rankR.json.
# With PAIR_BASE=allgather-only the first run is not plain but under zerocta-run too, with the
# all-gather route alone (--allgather as the second run's, --reducescatter nccl): its files are
# allgather-only.log/.json and stats-allgather-only/, and the comparison says how much the
# reduce-scatter route adds to the all-gather route's.
#
# Environment:
#   ZEROCTA_BUILD            build directory with libzerocta.so (default: <repo>/build)
#   ZEROCTA_RUN              launcher (default: $ZEROCTA_BUILD/tools/zerocta-run, else
#                            <repo>/tools/zerocta-run); always given --lib $ZEROCTA_BUILD/...
#   ZEROCTA_PAIR_ALLGATHER   zerocta-run --allgather for the second run (default auto)
#   ZEROCTA_PAIR_REDUCESCATTER  zerocta-run --reducescatter for the second run (default nccl:
#                            NCCL's reduce-scatters, as before the option existed)
#   PAIR_BASE                the first run: plain (default) or allgather-only (see above)
#   ZEROCTA_PAIR_ARGS        more zerocta-run options, e.g. "--log info" (for both zerocta runs)
#   TORCHRUN                 default /opt/torch/.venv/bin/torchrun if present, else torchrun
#   PYTHON                   for compare_runs.py (standard library only; default python3)
#   PAIR_TIMEOUT_S           limit per run, seconds (default 600)
#   BASELINE_TWICE=1         also run plain a second time first and compare plain with plain:
#                            tells the program's own nondeterminism from zerocta's effect
#                            (PAIR_BASE=plain only)
#   EXAMPLES_MULTICAST_OFF=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 for every run
#                            (preflight.sh); nothing else is set for NCCL or PyTorch
# Exit status: 0 MATCH, 1 MISMATCH or a failed run, 2 a usage problem.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname -- "$here")

usage() {
  echo "usage: $0 NGPU OUTDIR NAME SCRIPT [SCRIPT ARGS...]" >&2
  exit 2
}
(($# >= 4)) || usage
ngpu=$1 outdir=$2 name=$3 script=$4
shift 4
[[ $ngpu =~ ^[1-9][0-9]*$ ]] || usage
[[ $name =~ ^[A-Za-z0-9._-]+$ ]] || { echo "$0: NAME must be [A-Za-z0-9._-]+" >&2 && exit 2; }
[[ -f $script ]] || { echo "$0: $script not found" >&2 && exit 2; }

build=${ZEROCTA_BUILD:-$repo/build}
lib=$build/libzerocta.so
[[ -f $lib ]] || { echo "$0: $lib not found; build first or set ZEROCTA_BUILD" >&2 && exit 2; }
zerocta_run=${ZEROCTA_RUN:-$build/tools/zerocta-run}
[[ -x $zerocta_run ]] || zerocta_run=$repo/tools/zerocta-run
[[ -x $zerocta_run ]] || { echo "$0: zerocta-run not found; set ZEROCTA_RUN" >&2 && exit 2; }
torchrun=()  # set by preflight
pair_ag="" pair_rs="" pair_first="" pair_first_name="" pair_second_name=""  # set by pair_routes
pair_first_routes=()
# shellcheck disable=SC1091  # preflight.sh sits beside this script
. "$here/preflight.sh"
pair_routes "${ZEROCTA_PAIR_ALLGATHER:-auto}" "${ZEROCTA_PAIR_REDUCESCATTER:-nccl}" "${PAIR_BASE:-plain}"
if [[ ${BASELINE_TWICE:-0} == 1 && $pair_first != plain ]]; then
  echo "$0: BASELINE_TWICE=1 checks the program's own determinism: it needs PAIR_BASE=plain" >&2
  exit 2
fi
preflight "$ngpu"
read -r -a pair_args <<<"${ZEROCTA_PAIR_ARGS:-}"
python=${PYTHON:-python3}
timeout_s=${PAIR_TIMEOUT_S:-600}
# The plain runs are the reference: zerocta must not be preloaded already.
[[ ${LD_PRELOAD:-} != *libzerocta* ]] || { echo "$0: unset LD_PRELOAD first (it has libzerocta)" >&2 && exit 2; }
multicast_off_if_asked  # sets nothing unless EXAMPLES_MULTICAST_OFF=1 (preflight.sh)
# This script's own ZEROCTA_* knobs stay in this shell: the ranks have no use for them.
export -n ZEROCTA_BUILD ZEROCTA_RUN ZEROCTA_PAIR_ALLGATHER ZEROCTA_PAIR_REDUCESCATTER \
  ZEROCTA_PAIR_ARGS ZEROCTA_FSDP_ALLGATHER ZEROCTA_FSDP_REDUCESCATTER

dir=$outdir/$name
mkdir -p "$dir/stats"
dir=$(cd -- "$dir" && pwd)
first_stats=$dir/stats-$pair_first  # when the first run is under zerocta too
[[ $pair_first == plain ]] || mkdir -p "$first_stats"
# Old stats files would be counted as this run's ranks, an old summary read as this one's.
find "$dir/stats" -maxdepth 1 -name 'zerocta-*.json' -delete
[[ $pair_first == plain ]] || find "$first_stats" -maxdepth 1 -name 'zerocta-*.json' -delete
rm -f "$dir/summary.json" "$dir/summary-baseline.json"

# run LABEL [LAUNCHER...]: SCRIPT under torchrun, record to $dir/LABEL.json, log to LABEL.log.
# timeout is outermost and signals its whole process group (torchrun and every rank).
run() {
  local label=$1 rc=0 t0
  shift
  echo "== $name/$label: ${*:+$* }torchrun --nproc-per-node=$ngpu $(basename -- "$script")" \
    "${script_args[*]:-}"
  rm -f "$dir/$label.json"
  t0=$SECONDS
  timeout -k 15 "$timeout_s" "$@" "${torchrun[@]}" --standalone --nproc-per-node="$ngpu" \
    "$script" ${script_args[@]+"${script_args[@]}"} --out "$dir/$label.json" >"$dir/$label.log" 2>&1 || rc=$?
  # Progress without the per-step lines: the start lines, the summary and zerocta's counters.
  grep -E '^(fsdp2_gpt|ddp|zerocta-stats)' "$dir/$label.log" | sed 's/^/   /' || true
  if ((rc != 0)) || [[ ! -s $dir/$label.json ]]; then
    if ((rc == 124 || rc == 137)); then
      echo "FAILED: $name/$label timed out after ${timeout_s}s; last lines of $dir/$label.log:"
    else
      echo "FAILED: $name/$label exited with $rc; last lines of $dir/$label.log:"
    fi
    tail -n 30 "$dir/$label.log" | sed 's/^/   /'
    echo "VERDICT $name: FAILED ($label run)"
    exit 1
  fi
  echo "   ($((SECONDS - t0)) s)"
}

script_args=("$@")
if [[ ${BASELINE_TWICE:-0} == 1 ]]; then
  run plain2
fi
# %p: every rank writes its own stats file (the torchrun agent makes no NCCL call: none).
compare_first=()
if [[ $pair_first == plain ]]; then
  run plain
else
  run "$pair_first" "$zerocta_run" --lib "$lib" ${pair_first_routes[@]+"${pair_first_routes[@]}"} \
    --stats="$first_stats/zerocta-%p.json" ${pair_args[@]+"${pair_args[@]}"} --
  compare_first=(--first-zerocta --first-stats-dir "$first_stats")
fi
if [[ ${BASELINE_TWICE:-0} == 1 ]]; then
  "$python" "$here/compare_runs.py" "$dir/plain2.json" "$dir/plain.json" --second-plain \
    --summary "$dir/summary-baseline.json" --label "$name baseline (plain vs plain)" || true
fi
run zerocta "$zerocta_run" --lib "$lib" --allgather "$pair_ag" --reducescatter "$pair_rs" \
  --stats="$dir/stats/zerocta-%p.json" ${pair_args[@]+"${pair_args[@]}"} --

"$python" "$here/compare_runs.py" "$dir/$pair_first.json" "$dir/zerocta.json" \
  --stats-dir "$dir/stats" --summary "$dir/summary.json" --label "$name" \
  --names "$pair_first_name" "$pair_second_name" ${compare_first[@]+"${compare_first[@]}"}
