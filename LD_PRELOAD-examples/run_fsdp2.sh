#!/usr/bin/env bash
# FSDP2 GPT training with and without zerocta, per configuration of fsdp2_gpt.py.
#
#   run_fsdp2.sh NGPU OUTDIR [CONFIG...]        CONFIG: compute comm tiny (default: compute comm)
#
# Each configuration is one run_pair.sh (plain, then zerocta-run --allgather
# ${ZEROCTA_FSDP_ALLGATHER:-auto}), in OUTDIR/fsdp2-CONFIG/. Prints each pair's comparison and
# verdict, then writes OUTDIR/fsdp2-summary.json (every pair's summary) and a last line.
# Environment: ZEROCTA_FSDP_ALLGATHER, FSDP_ARGS (more fsdp2_gpt.py options, e.g.
# "--steps 30 --prefetch 1", or "--profile-steps 5" for both runs' exposed all-gather share,
# which the comparison then prints), and everything run_pair.sh reads (ZEROCTA_BUILD, TORCHRUN,
# PAIR_TIMEOUT_S, BASELINE_TWICE, ...). Exit status: 0 if every pair matched, 1 otherwise,
# 2 a usage problem.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
(($# >= 2)) || { echo "usage: $0 NGPU OUTDIR [compute|comm|tiny ...]" >&2 && exit 2; }
ngpu=$1 outdir=$2
shift 2
configs=("$@")
((${#configs[@]} > 0)) || configs=(compute comm)
for c in "${configs[@]}"; do
  [[ $c == compute || $c == comm || $c == tiny ]] || { echo "$0: unknown config '$c'" >&2 && exit 2; }
done
[[ $ngpu =~ ^[1-9][0-9]*$ ]] || { echo "$0: NGPU must be a number" >&2 && exit 2; }
# shellcheck disable=SC1091  # preflight.sh sits beside this script
. "$here/preflight.sh"
preflight "$ngpu"  # once here, not once per configuration
read -r -a fsdp_args <<<"${FSDP_ARGS:-}"
# (run_pair.sh turns NVLink multicast off for every run when EXAMPLES_MULTICAST_OFF=1, and keeps
# the ZEROCTA_* knobs of both scripts out of the ranks.)
mkdir -p "$outdir"

failed=()
summaries=()
for c in "${configs[@]}"; do
  if ! ZEROCTA_PAIR_ALLGATHER=${ZEROCTA_FSDP_ALLGATHER:-auto} "$here/run_pair.sh" "$ngpu" \
    "$outdir" "fsdp2-$c" "$here/fsdp2_gpt.py" --config "$c" ${fsdp_args[@]+"${fsdp_args[@]}"}; then
    failed+=("$c")
  fi
  summaries+=("$outdir/fsdp2-$c/summary.json")
done

# One JSON for the whole sweep; a pair that failed before comparing has no summary.
"${PYTHON:-python3}" - "$outdir/fsdp2-summary.json" "${summaries[@]}" <<'EOF'
import json, os, sys
out, paths = sys.argv[1], sys.argv[2:]
pairs = {}
for p in paths:
    name = os.path.basename(os.path.dirname(p))
    pairs[name] = json.load(open(p)) if os.path.exists(p) else {"match": False,
                                                               "problems": ["run failed"]}
json.dump({"pairs": pairs, "all_match": all(v["match"] for v in pairs.values())},
          open(out, "w"), indent=1, sort_keys=True)
EOF

if ((${#failed[@]} == 0)); then
  echo "run_fsdp2: MATCH for ${configs[*]} (summary: $outdir/fsdp2-summary.json)"
else
  echo "run_fsdp2: FAILED or MISMATCH for ${failed[*]} (summary: $outdir/fsdp2-summary.json)"
  exit 1
fi
