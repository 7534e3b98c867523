#!/usr/bin/env bash
# zerocta's compatibility matrix with PyTorch: every cell of torch_compat.py under torchrun,
# once without and once with libzerocta.so preloaded, then the table (OUTDIR/compat.md).
#
#   run_torch_compat.sh NGPU OUTDIR [--cells a,b,...]
#
# The run with the shim: LD_PRELOAD=$ZEROCTA_BUILD/libzerocta.so ZEROCTA_ALLGATHER=auto
# ZEROCTA_MIN_BYTES=1M ZEROCTA_STATS=<run dir>/stats-%p.json (other ZEROCTA_* variables of the
# caller's environment pass through, e.g. ZEROCTA_LOG=info). Each run is limited to its cell's
# time (torch_compat.py --list; 60 s, compile_funcol 120 s); a run that hangs is killed with
# every rank and recorded as a timeout. Per run: OUTDIR/CELL/{plain,shim}/ with log, run.json,
# result.rank<R>.json and (shim) stats-<pid>.json.
#
# Environment: ZEROCTA_BUILD (default <repo>/build), TORCHRUN (default
# /opt/torch/.venv/bin/torchrun if present, else torchrun), PYTHON (default
# /opt/torch/.venv/bin/python3 if present, else python3), COMPAT_TIMEOUT_S (one limit, in
# seconds, for every run instead of the cells' own), COMPAT_ALLGATHER (the shim run's
# ZEROCTA_ALLGATHER, default auto; nccl checks the library's default mode).
# Exit status: 0 if every cell behaves the same with the shim as without (and bitwise equal),
# 1 otherwise, 2 a usage problem.
set -uo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/../.." && pwd)
usage() {
  echo "usage: $0 NGPU OUTDIR [--cells a,b,...]" >&2
  exit 2
}
(($# == 2 || $# == 4)) || usage
ngpu=$1 outdir=$2
cells_opt=""
if (($# == 4)); then
  [[ $3 == --cells ]] || usage
  cells_opt=$4
fi
[[ $ngpu =~ ^[1-9][0-9]*$ ]] || usage

lib=${ZEROCTA_BUILD:-$repo/build}/libzerocta.so
[[ -f $lib ]] || { echo "$0: $lib not found; build first or set ZEROCTA_BUILD" >&2 && exit 2; }
lib=$(readlink -f -- "$lib")
venv=/opt/torch/.venv/bin
if [[ -z ${TORCHRUN:-} && -x $venv/torchrun ]]; then TORCHRUN=$venv/torchrun; fi
if [[ -z ${PYTHON:-} && -x $venv/python3 ]]; then PYTHON=$venv/python3; fi
read -r -a torchrun <<<"${TORCHRUN:-torchrun}"
python=${PYTHON:-python3}
# The runs without the shim are the reference: it must not be preloaded already.
[[ ${LD_PRELOAD:-} != *libzerocta* ]] || { echo "$0: unset LD_PRELOAD first (it has libzerocta)" >&2 && exit 2; }
# NVLink multicast stays off on the project's GPU machines, in every run.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

compat=$here/torch_compat.py
# name -> time limit, from the cells' own table.
declare -A limit=()
order=()
while read -r name secs _; do
  limit[$name]=${COMPAT_TIMEOUT_S:-$secs}
  order+=("$name")
done < <("$python" "$compat" --list) || true
((${#order[@]} > 0)) || { echo "$0: '$python $compat --list' listed no cells" >&2 && exit 2; }
if [[ -n $cells_opt ]]; then
  IFS=, read -r -a cells <<<"$cells_opt"
  for c in "${cells[@]}"; do
    [[ -n ${limit[$c]:-} ]] || { echo "$0: unknown cell '$c' (cells: ${order[*]})" >&2 && exit 2; }
  done
else
  cells=("${order[@]}")
fi
mkdir -p "$outdir"
outdir=$(cd -- "$outdir" && pwd)

# run_one CELL MODE: one torchrun job; MODE plain or shim.
run_one() {
  local cell=$1 mode=$2 dir="$outdir/$1/$2" rc=0 t0 t1 secs=${limit[$1]}
  local -a env_args=()
  mkdir -p "$dir"
  # Only what an earlier run of this script left here.
  rm -f "$dir"/result.rank*.json "$dir"/stats-*.json "$dir/run.json" "$dir/log"
  if [[ $mode == shim ]]; then
    env_args=(LD_PRELOAD="$lib" ZEROCTA_ALLGATHER="${COMPAT_ALLGATHER:-auto}" ZEROCTA_MIN_BYTES=1M
      ZEROCTA_STATS="$dir/stats-%p.json")
  fi
  t0=$(date +%s.%N)
  # timeout signals its whole process group: torchrun and every rank; -k: SIGKILL 10 s later.
  timeout -k 10 "$secs" env ${env_args[@]+"${env_args[@]}"} "${torchrun[@]}" --standalone \
    --nproc-per-node="$ngpu" "$compat" --cell "$cell" --out "$dir" >"$dir/log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  local timed_out=false
  if ((rc == 124 || rc == 137)); then timed_out=true; fi
  printf '{"cell": "%s", "mode": "%s", "rc": %d, "elapsed_s": %s, "timed_out": %s, "timeout_s": %d}\n' \
    "$cell" "$mode" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" \
    "$timed_out" "$secs" >"$dir/run.json"
  # Rank 0's own verdict line, wherever a launcher prefix puts it.
  printf '   %-16s %-6s exit %3d  %s\n' "$cell" "$mode" "$rc" \
    "$(grep -o -m 1 'torch_compat [a-z_]* rank 0: .*' "$dir/log" | cut -c1-100)"
}

echo "torch_compat: ${#cells[@]} cells x (plain, shim) on $ngpu GPUs; outputs in $outdir"
start=$SECONDS
for cell in "${cells[@]}"; do
  run_one "$cell" plain
  run_one "$cell" shim
done
echo "torch_compat: runs took $((SECONDS - start)) s"
cells_csv=$(
  IFS=,
  echo "${cells[*]}"
)
"$python" "$compat" --report "$outdir" --cells "$cells_csv" --ngpu "$ngpu"
