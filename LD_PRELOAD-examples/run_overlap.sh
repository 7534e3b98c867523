#!/usr/bin/env bash
# The PyTorch #172714 microbenchmark (overlap_172714.py) in every variant, one after another in
# one go, and the comparison the issue asks for:
#
#   run_overlap.sh NGPU OUTDIR [overlap_172714.py ARGS...]
#
#   kernel        plain tensors, NCCL alone: NCCL's kernel path (what users have today)
#   nccl-ce       NCCL alone, the application changed: zero-CTA policy + symmetric-memory
#                 buffers registered as NCCL windows (NCCL's own copy-engine path)
#   zerocta       plain tensors under zerocta-run --allgather zerocta
#
# With T_k the overlapped time on the kernel path and T_ideal = max(GEMM alone, all-gather
# alone): recovered = (T_k - T_x) / (T_k - T_ideal) for each variant x (target for zerocta:
# >= 0.8, and T_zerocta <= T_nccl-ce). Logs and JSON per variant in OUTDIR, the comparison in
# OUTDIR/overlap-summary.json. Environment: ZEROCTA_BUILD (default <repo>/build), TORCHRUN,
# PYTHON (python3), OVERLAP_VARIANTS (default "kernel nccl-ce zerocta").
# Exit status: 0 if every variant ran and its output was correct, 1 otherwise, 2 usage.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname -- "$here")
(($# >= 2)) || { echo "usage: $0 NGPU OUTDIR [overlap_172714.py args...]" >&2 && exit 2; }
ngpu=$1 outdir=$2
shift 2
[[ $ngpu =~ ^[1-9][0-9]*$ ]] || { echo "$0: NGPU must be a number" >&2 && exit 2; }
build=${ZEROCTA_BUILD:-$repo/build}
lib=$build/libzerocta.so
[[ -f $lib ]] || { echo "$0: $lib not found; build first or set ZEROCTA_BUILD" >&2 && exit 2; }
zerocta_run=$repo/tools/zerocta-run
torchrun=()  # set by preflight
# shellcheck disable=SC1091  # preflight.sh sits beside this script
. "$here/preflight.sh"
preflight "$ngpu"
read -r -a variants <<<"${OVERLAP_VARIANTS:-kernel nccl-ce zerocta}"
[[ ${LD_PRELOAD:-} != *libzerocta* ]] || { echo "$0: unset LD_PRELOAD first (it has libzerocta)" >&2 && exit 2; }
# Test-host rule, not a zerocta requirement: the project's GPU hosts must not use NVLink
# multicast, so the examples run with it off. On your own cluster drop this line (or export
# NCCL_NVLS_ENABLE=1 first) to keep NCCL's NVLink SHARP; zerocta needs it neither way.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
# This script's own ZEROCTA_* knobs stay in this shell: in the ranks they would be unknown
# ZEROCTA_* variables, which zerocta reports (one WARN each).
export -n ZEROCTA_BUILD
mkdir -p "$outdir"
outdir=$(cd -- "$outdir" && pwd)

failed=0
for v in "${variants[@]}"; do
  launcher=() extra=() envs=()
  case $v in
    kernel) ;;
    # NCCL_DEBUG=INFO/INIT: NCCL says "Init CE" when its copy-engine path first runs.
    nccl-ce) extra=(--buffers nccl-windows) envs=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT) ;;
    zerocta) launcher=("$zerocta_run" --lib "$lib" --allgather zerocta --) ;;
    *) echo "$0: unknown variant '$v'" >&2 && exit 2 ;;
  esac
  echo "== overlap/$v"
  rm -f "$outdir/overlap-$v.json"
  rc=0
  timeout -k 15 "${OVERLAP_TIMEOUT_S:-300}" env ${envs[@]+"${envs[@]}"} \
    ${launcher[@]+"${launcher[@]}"} "${torchrun[@]}" --standalone --nproc-per-node="$ngpu" \
    "$here/overlap_172714.py" "$@" ${extra[@]+"${extra[@]}"} --json "$outdir/overlap-$v.json" \
    >"$outdir/overlap-$v.log" 2>&1 || rc=$?
  grep -v -e ' NCCL INFO ' -e '^\[rank' "$outdir/overlap-$v.log" | grep -E '^(overlap|  )' || true
  if [[ $v == nccl-ce ]]; then
    echo "   NCCL 'Init CE' lines (its copy-engine path ran): $(grep -c 'Init CE' "$outdir/overlap-$v.log" || true)"
  fi
  if ((rc != 0)) || [[ ! -s $outdir/overlap-$v.json ]]; then
    echo "FAILED: overlap/$v exited with $rc; last lines of $outdir/overlap-$v.log:"
    tail -n 20 "$outdir/overlap-$v.log" | sed 's/^/   /'
    failed=1
  fi
done

"${PYTHON:-python3}" - "$outdir" "${variants[@]}" <<'PY'
import json, os, sys
outdir, variants = sys.argv[1], sys.argv[2:]
runs = {}
for v in variants:
    path = os.path.join(outdir, "overlap-%s.json" % v)
    if os.path.exists(path):
        with open(path) as f:
            runs[v] = json.load(f)
summary = {"variants": runs}
k = runs.get("kernel")
print("\n%-15s %9s %9s %9s %9s %10s %9s  %s" % ("variant", "GEMM", "AG alone", "overlap",
      "T_ideal", "recovered", "GEMM +%", "route"))
for v, r in runs.items():
    ideal = max(r["gemm"], r["ag"])
    rec = None
    if k:
        gain = k["ovl"] - max(k["gemm"], k["ag"])
        rec = (k["ovl"] - r["ovl"]) / gain if gain > 0 else None
    r["t_ideal"], r["recovered"] = ideal, rec
    print("%-15s %9.3f %9.3f %9.3f %9.3f %10s %+8.1f%%  %s%s" % (
        v, r["gemm"], r["ag"], r["ovl"], ideal, "-" if rec is None else "%.2f" % rec,
        100.0 * (r["ovl_gemm"] / r["gemm"] - 1), r["route"], "" if r["correct"] else " WRONG"))
z, ce = runs.get("zerocta"), runs.get("nccl-ce")
if z and ce:
    summary["zerocta_vs_nccl_ce"] = z["ovl"] / ce["ovl"]
    print("zerocta overlapped / NCCL CE overlapped: %.3f (target <= 1)" % summary["zerocta_vs_nccl_ce"])
if z and z.get("recovered") is not None:
    print("zerocta recovered %.0f %% of the possible gain (target >= 80 %%)" % (100 * z["recovered"]))
with open(os.path.join(outdir, "overlap-summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
PY
exit $failed
