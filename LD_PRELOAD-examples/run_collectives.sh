#!/usr/bin/env bash
# Runs collectives.py under torchrun twice - plain NCCL, then under zerocta-run - and diffs
# the digests every rank wrote. Prints MATCH or MISMATCH and the routes zerocta counted.
#
#   run_collectives.sh [NPROC]          NPROC GPUs of this host, default 2
#
# Environment: ZEROCTA_RUN (default ../build/tools/zerocta-run), ZEROCTA_RUN_ARGS (default
# "--allgather auto", the copy-engine route), TORCHRUN (default /opt/torch/.venv/bin/torchrun if present, else torchrun), TIMEOUT_S (per run,
# default 600). Exit status: 0 MATCH, 1 MISMATCH or a failed run, 2 a usage problem.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
nproc=${1:-2}
zerocta_run=${ZEROCTA_RUN:-$here/../build/tools/zerocta-run}
read -r -a zr_args <<<"${ZEROCTA_RUN_ARGS:---allgather auto}"

[[ $nproc =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [NPROC]" >&2 && exit 2; }
torchrun=()  # set by preflight
# shellcheck disable=SC1091  # preflight.sh sits beside this script
. "$here/preflight.sh"
preflight "$nproc"
[[ -x $zerocta_run ]] || { echo "$0: $zerocta_run not found; build first or set ZEROCTA_RUN" >&2 && exit 2; }
# The first run is the reference: it must not have zerocta preloaded already.
[[ ${LD_PRELOAD:-} != *libzerocta* ]] || { echo "$0: unset LD_PRELOAD first (it has libzerocta)" >&2 && exit 2; }
multicast_off_if_asked  # sets nothing unless EXAMPLES_MULTICAST_OFF=1 (preflight.sh)
# This script's own ZEROCTA_* knobs stay in this shell: the ranks have no use for them.
export -n ZEROCTA_RUN ZEROCTA_RUN_ARGS

work=$(mktemp -d "${TMPDIR:-/tmp}/zerocta-collectives.XXXXXX")
echo "outputs in $work"

# run NAME [LAUNCHER...]: collectives.py under torchrun; its digests go to $work/NAME.
run() {
  local name=$1
  shift
  echo "== $name: ${*:+$* }${torchrun[*]} --nproc-per-node=$nproc collectives.py"
  # torchrun's --standalone rendezvous stays on this host.
  if ! timeout "${TIMEOUT_S:-600}" "$@" "${torchrun[@]}" --standalone --nproc-per-node="$nproc" \
    "$here/collectives.py" --out "$work/$name" 2>&1 | tee "$work/$name.log"; then
    echo "FAILED: the $name run (see $work/$name.log)"
    exit 1
  fi
}

run nccl
# %p: every rank writes its own JSON file (the torchrun agent makes no NCCL call, so none).
run zerocta "$zerocta_run" "${zr_args[@]}" --stats="$work/stats-%p.json" --

grep -q "zerocta not loaded" "$work/nccl.log" || { echo "FAILED: zerocta was loaded in the nccl run" && exit 1; }
! grep -q "zerocta not loaded" "$work/zerocta.log" || { echo "FAILED: zerocta was not loaded by zerocta-run" && exit 1; }

echo "== routes zerocta counted (zerocta run, per rank):"
grep "^zerocta-stats" "$work/zerocta.log" | sort
shopt -s nullglob
stats_files=("$work"/stats-*.json)
echo "== ZEROCTA_STATS files: ${#stats_files[@]} (expected $nproc, one per rank)"

count=$(find "$work/nccl" -name 'digests.rank*.txt' | wc -l)
if [[ $count == "$nproc" ]] && diff -r "$work/nccl" "$work/zerocta"; then
  echo "MATCH: $nproc ranks x $(wc -l <"$work/nccl/digests.rank0.txt") ops, digests identical with and without zerocta"
else
  echo "MISMATCH: digests differ (or are missing) between $work/nccl and $work/zerocta"
  exit 1
fi
