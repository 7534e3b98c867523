#!/usr/bin/env bash
# The PyTorch #172714 microbenchmark (overlap_172714.py) in every variant, one after another in
# one go, and the comparison the issue asks for:
#
#   run_overlap.sh NGPU OUTDIR [overlap_172714.py ARGS...]
#
#   kernel        plain tensors, NCCL alone: NCCL's kernel path (what users have today)
#   nccl-ce       NCCL alone, the application changed: zero-CTA policy + symmetric-memory
#                 buffers registered as NCCL windows (NCCL's own copy-engine path; its log's
#                 "Init CE" lines say whether it ran)
#   zerocta       plain tensors under zerocta-run --allgather zerocta (with --op reducescatter:
#                 --reducescatter zerocta)
#
# The collective is the all-gather unless the arguments say --op reducescatter (then also
# --rs-mib, --rs-dtype bf16|fp32, --redop sum|avg; overlap_172714.py). With T_k the overlapped
# time on the kernel path and T_ideal = max(GEMM alone, collective alone): recovered =
# (T_k - T_x) / (T_k - T_ideal) for each variant x (target for zerocta: >= 0.8, and
# T_zerocta <= T_nccl-ce). Logs and JSON per variant in OUTDIR, the comparison in
# OUTDIR/overlap-summary.json: per variant the median and (min..max) over OVERLAP_REPEATS
# rounds (default 3; the variants in rotated order each round, each run its own processes;
# "recovered" is computed against the kernel run of the same round). Environment:
# ZEROCTA_BUILD (default <repo>/build), ZEROCTA_RUN (default <repo>/tools/zerocta-run), TORCHRUN,
# PYTHON (python3), OVERLAP_VARIANTS (default "kernel nccl-ce zerocta"), OVERLAP_REPEATS,
# OVERLAP_TIMEOUT_S (per run, default 300), EXAMPLES_MULTICAST_OFF=1 (preflight.sh).
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
zerocta_run=${ZEROCTA_RUN:-$repo/tools/zerocta-run}
# The collective, as overlap_172714.py will read it (it takes no abbreviated options).
op=allgather
prev=""
for arg in "$@"; do
  [[ $prev == --op ]] && op=$arg
  [[ $arg == --op=* ]] && op=${arg#--op=}
  prev=$arg
done
case $op in
  allgather) route_option=--allgather ;;
  reducescatter) route_option=--reducescatter ;;
  *) echo "$0: --op '$op' is not one of allgather|reducescatter" >&2 && exit 2 ;;
esac
torchrun=()  # set by preflight
# shellcheck disable=SC1091  # preflight.sh sits beside this script
. "$here/preflight.sh"
preflight "$ngpu"
read -r -a variants <<<"${OVERLAP_VARIANTS:-kernel nccl-ce zerocta}"
[[ ${LD_PRELOAD:-} != *libzerocta* ]] || { echo "$0: unset LD_PRELOAD first (it has libzerocta)" >&2 && exit 2; }
multicast_off_if_asked  # sets nothing unless EXAMPLES_MULTICAST_OFF=1 (preflight.sh)
# This script's own ZEROCTA_* knobs stay in this shell: the ranks have no use for them.
export -n ZEROCTA_BUILD ZEROCTA_RUN
mkdir -p "$outdir"
outdir=$(cd -- "$outdir" && pwd)

repeats=${OVERLAP_REPEATS:-3}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "$0: OVERLAP_REPEATS must be a number" >&2 && exit 2; }
failed=0
for ((round = 1; round <= repeats; round++)); do
  # Rotated order per round: a slow drift of the GPUs' clocks does not favour one variant.
  n=${#variants[@]}
  for ((k = 0; k < n; k++)); do
    v=${variants[$(((k + round - 1) % n))]}
    launcher=() extra=() envs=()
    case $v in
      kernel) ;;
      # NCCL_DEBUG=INFO/INIT: NCCL says "Init CE" when its copy-engine path first runs.
      nccl-ce) extra=(--buffers nccl-windows) envs=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT) ;;
      zerocta) launcher=("$zerocta_run" --lib "$lib" "$route_option" zerocta --) ;;
      *) echo "$0: unknown variant '$v'" >&2 && exit 2 ;;
    esac
    tag=$v-r$round
    echo "== overlap/$v $op (round $round of $repeats)"
    rm -f "$outdir/overlap-$tag.json"
    rc=0
    timeout -k 15 "${OVERLAP_TIMEOUT_S:-300}" env ${envs[@]+"${envs[@]}"} \
      ${launcher[@]+"${launcher[@]}"} "${torchrun[@]}" --standalone --nproc-per-node="$ngpu" \
      "$here/overlap_172714.py" "$@" ${extra[@]+"${extra[@]}"} --json "$outdir/overlap-$tag.json" \
      >"$outdir/overlap-$tag.log" 2>&1 || rc=$?
    grep -v -e ' NCCL INFO ' -e '^\[rank' "$outdir/overlap-$tag.log" | grep -E '^(overlap|  )' || true
    if [[ $v == nccl-ce ]]; then
      echo "   NCCL 'Init CE' lines (its copy-engine path ran): $(grep -c 'Init CE' "$outdir/overlap-$tag.log" || true)"
    fi
    if ((rc != 0)) || [[ ! -s $outdir/overlap-$tag.json ]]; then
      echo "FAILED: overlap/$v exited with $rc; last lines of $outdir/overlap-$tag.log:"
      tail -n 20 "$outdir/overlap-$tag.log" | sed 's/^/   /'
      failed=1
    fi
  done
done

"${PYTHON:-python3}" - "$outdir" "$repeats" "$op" "${variants[@]}" <<'PY'
import json, os, statistics, sys
outdir, repeats, op, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
runs = {v: [] for v in variants}
for v in variants:
    for r in range(1, repeats + 1):
        path = os.path.join(outdir, "overlap-%s-r%d.json" % (v, r))
        if os.path.exists(path):
            with open(path) as f:
                x = json.load(f)
            # "comm": the collective's time alone ("ag" in records from before --op).
            x.setdefault("comm", x.get("ag"))
            if x.get("op", "allgather") == op:  # not a stale record of the other collective
                runs[v].append(dict(x, round=r))

def recovered(x, k):
    """(T_kernel - T_x) / (T_kernel - max alone of the kernel run), same round."""
    gain = k["ovl"] - max(k["gemm"], k["comm"])
    return (k["ovl"] - x["ovl"]) / gain if gain > 0 else None

def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}

kernel_by_round = {x["round"]: x for x in runs.get("kernel", [])}
summary = {"repeats": repeats, "op": op, "variants": {}}
print("\n%s overlapped with the GEMM" % {"allgather": "all-gather",
                                         "reducescatter": "reduce-scatter"}[op])
print("%-10s %6s %22s %22s %22s %26s" % ("variant", "runs", "GEMM alone (ms)",
      "overlapped (ms)", "GEMM while ovl (%)", "recovered vs kernel"))
fmt = lambda s, f: "-" if s is None else (f % s["median"]) + (" (" + f % s["min"] + ".." + f % s["max"] + ")")
for v in variants:
    xs = runs[v]
    rec = spread([recovered(x, kernel_by_round[x["round"]]) if x["round"] in kernel_by_round else None
                  for x in xs])
    row = {"runs": len(xs), "gemm": spread([x["gemm"] for x in xs]),
           "comm": spread([x["comm"] for x in xs]), "ovl": spread([x["ovl"] for x in xs]),
           "gemm_slowdown_pct": spread([100.0 * (x["ovl_gemm"] / x["gemm"] - 1) for x in xs]),
           "recovered": rec, "all_correct": all(x["correct"] for x in xs),
           "routes": sorted({x["route"] for x in xs})}
    if op == "allgather":
        row["ag"] = row["comm"]  # the key this summary had before --op
    summary["variants"][v] = row
    print("%-10s %6d %22s %22s %22s %26s%s" % (v, len(xs), fmt(row["gemm"], "%.3f"),
          fmt(row["ovl"], "%.3f"), fmt(row["gemm_slowdown_pct"], "%+.1f"),
          fmt(rec, "%.2f"), "" if row["all_correct"] else "  WRONG"))
z, ce = summary["variants"].get("zerocta"), summary["variants"].get("nccl-ce")
if z and ce and z["recovered"] and ce["recovered"]:
    # The issue's test: zerocta's share >= NCCL CE's minus the run-to-run spread.
    ce_spread = ce["recovered"]["max"] - ce["recovered"]["min"]
    summary["zerocta_minus_nccl_ce_recovered"] = z["recovered"]["median"] - ce["recovered"]["median"]
    summary["nccl_ce_recovered_spread"] = ce_spread
    print("zerocta recovered %.2f, NCCL CE %.2f (its spread %.2f): %s" % (
        z["recovered"]["median"], ce["recovered"]["median"], ce_spread,
        "at least NCCL CE's minus its spread" if z["recovered"]["median"] >=
        ce["recovered"]["median"] - ce_spread else "BELOW NCCL CE's minus its spread"))
with open(os.path.join(outdir, "overlap-summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
PY
exit $failed
