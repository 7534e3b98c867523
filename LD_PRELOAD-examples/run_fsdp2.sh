#!/usr/bin/env bash
# FSDP2 GPT training with and without zerocta, per configuration of fsdp2_gpt.py.
#
#   run_fsdp2.sh NGPU OUTDIR [CONFIG...]
#     CONFIG: compute comm comm-narrow host-bound tiny (default: compute comm)
#
# Each configuration is one run_pair.sh (plain, then zerocta-run --allgather
# ${ZEROCTA_FSDP_ALLGATHER:-auto} --reducescatter ${ZEROCTA_FSDP_REDUCESCATTER:-nccl}), in
# OUTDIR/fsdp2-CONFIG/. Prints each pair's comparison and verdict, then writes
# OUTDIR/fsdp2-summary.json (every pair's summary) and a last line.
# Both copy-engine routes against plain: ZEROCTA_FSDP_REDUCESCATTER=auto. The all-gather route
# alone against both (how much of the gain is the reduce-scatter's): PAIR_BASE=allgather-only
# ZEROCTA_FSDP_REDUCESCATTER=auto (the first run of each pair is then zerocta-run --allgather
# ${ZEROCTA_FSDP_ALLGATHER:-auto} --reducescatter nccl, not plain; run_pair.sh).
# FSDP_PAIRS=N runs N pairs of each configuration, interleaved (pair 1 of every configuration,
# then pair 2, ...: a machine's drift spreads over all of them), in OUTDIR/fsdp2-CONFIG-pI/; the
# summary then also gives per configuration the step-time ratios, their median and the largest.
# Environment: ZEROCTA_FSDP_ALLGATHER, ZEROCTA_FSDP_REDUCESCATTER, PAIR_BASE, FSDP_ARGS (more
# fsdp2_gpt.py options, e.g. "--steps 30 --prefetch 1", or "--profile-steps 5" for both runs'
# exposed all-gather share, which the comparison then prints), and everything run_pair.sh reads
# (ZEROCTA_BUILD, TORCHRUN, PAIR_TIMEOUT_S, BASELINE_TWICE, EXAMPLES_MULTICAST_OFF, ...). Exit
# status: 0 if every pair matched, 1 otherwise, 2 a usage problem.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
known="compute comm comm-narrow host-bound tiny"
(($# >= 2)) || { echo "usage: $0 NGPU OUTDIR [${known// /|} ...]" >&2 && exit 2; }
ngpu=$1 outdir=$2
shift 2
configs=("$@")
((${#configs[@]} > 0)) || configs=(compute comm)
for c in "${configs[@]}"; do
  [[ " $known " == *" $c "* ]] || { echo "$0: unknown config '$c'" >&2 && exit 2; }
done
[[ $ngpu =~ ^[1-9][0-9]*$ ]] || { echo "$0: NGPU must be a number" >&2 && exit 2; }
pairs=${FSDP_PAIRS:-1}
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "$0: FSDP_PAIRS must be a positive number" >&2 && exit 2; }
pair_ag="" pair_rs="" pair_first="" pair_first_name="" pair_second_name=""  # set by pair_routes
# shellcheck disable=SC1091  # preflight.sh sits beside this script
. "$here/preflight.sh"
# Refused here, once, rather than by every pair (run_pair.sh checks the same).
pair_routes "${ZEROCTA_FSDP_ALLGATHER:-auto}" "${ZEROCTA_FSDP_REDUCESCATTER:-nccl}" "${PAIR_BASE:-plain}"
preflight "$ngpu"  # once here, not once per configuration
read -r -a fsdp_args <<<"${FSDP_ARGS:-}"
# (run_pair.sh turns NVLink multicast off for every run when EXAMPLES_MULTICAST_OFF=1, and keeps
# the ZEROCTA_* knobs of both scripts out of the ranks.)
mkdir -p "$outdir"

failed=()
summaries=()
for ((i = 1; i <= pairs; i++)); do
  for c in "${configs[@]}"; do
    name=fsdp2-$c
    ((pairs == 1)) || name=fsdp2-$c-p$i
    if ! ZEROCTA_PAIR_ALLGATHER=$pair_ag ZEROCTA_PAIR_REDUCESCATTER=$pair_rs PAIR_BASE=$pair_first \
      "$here/run_pair.sh" "$ngpu" "$outdir" "$name" "$here/fsdp2_gpt.py" --config "$c" \
      ${fsdp_args[@]+"${fsdp_args[@]}"}; then
      failed+=("$name")
    fi
    summaries+=("$outdir/$name/summary.json")
  done
done

# One JSON for the whole sweep (fsdp2_summary.py): every pair, and per configuration the
# ratios, their median and the largest.
"${PYTHON:-python3}" "$here/fsdp2_summary.py" --compared "$pair_second_name vs $pair_first_name" \
  "$outdir/fsdp2-summary.json" "${summaries[@]}"

compared="$pair_second_name vs $pair_first_name (summary: $outdir/fsdp2-summary.json)"
if ((${#failed[@]} == 0)); then
  echo "run_fsdp2: MATCH for ${configs[*]}, $compared"
else
  echo "run_fsdp2: FAILED or MISMATCH for ${failed[*]}, $compared"
  exit 1
fi
