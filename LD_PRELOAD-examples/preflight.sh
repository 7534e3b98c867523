# shellcheck shell=bash
# Sourced by the run_*.sh examples and nccl_cpp.sh.
#
# `multicast_off_if_asked`: with EXAMPLES_MULTICAST_OFF=1 in the environment, exports
# NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink multicast off, for machines
# that must not use it) and says so in one line; otherwise sets nothing. zerocta needs multicast
# neither way; NCCL and PyTorch keep their own defaults unless you ask.
multicast_off_if_asked() {
  [[ ${EXAMPLES_MULTICAST_OFF:-} == 1 ]] || return 0
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
  echo "$(basename -- "$0"): set NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (EXAMPLES_MULTICAST_OFF=1)"
}

# `preflight NGPU` sets the array `torchrun` (TORCHRUN, else
# /opt/torch/.venv/bin/torchrun where it exists, else torchrun) and stops the script with
# status 2 and one clear line when torchrun cannot be found or fewer than NGPU GPUs are
# visible, before anything is launched.
preflight() {
  local ngpu=$1 have=0
  if [[ -z ${TORCHRUN:-} && -x /opt/torch/.venv/bin/torchrun ]]; then
    TORCHRUN=/opt/torch/.venv/bin/torchrun
  fi
  read -r -a torchrun <<<"${TORCHRUN:-torchrun}"
  if ! command -v "${torchrun[0]}" >/dev/null; then
    echo "$0: '${torchrun[0]}' not found: install PyTorch (with torchrun) or set TORCHRUN" >&2
    exit 2
  fi
  if command -v nvidia-smi >/dev/null; then
    have=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  fi
  if [[ -n ${CUDA_VISIBLE_DEVICES+x} ]]; then  # an empty list hides every GPU
    local visible
    IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
    ((${#visible[@]} < have)) && have=${#visible[@]}
  fi
  if ((have < ngpu)); then
    echo "$0: $ngpu GPUs asked for, $have visible here: nothing to run" >&2
    exit 2
  fi
}

# `pair_routes AG RS BASE` checks the routes of a pair of training runs (run_pair.sh,
# run_fsdp2.sh) before anything is launched, and stops the script with status 2 and one line
# when they make no sense. AG and RS: zerocta-run's --allgather and --reducescatter for the
# second run (auto|zerocta|nccl|off, any case); BASE: what the first run is: plain (no zerocta)
# or allgather-only (under zerocta-run with the second run's all-gather route and NCCL's
# reduce-scatters: against both routes, how much of the gain is the reduce-scatter's). Sets the
# strings pair_ag, pair_rs (lower case), pair_first (the first run's label: plain or BASE),
# pair_first_name and pair_second_name (what the report calls the runs) and the array
# pair_first_routes (the first run's zerocta-run route options; empty for plain).
# shellcheck disable=SC2034  # the pair_* variables are the caller's
pair_routes() {
  local ag=${1,,} rs=${2,,} base=${3,,} m
  for m in "$ag" "$rs"; do
    [[ " auto zerocta nccl off " == *" $m "* ]] ||
      { echo "$0: route mode '$m' is not one of auto|zerocta|nccl|off" >&2 && exit 2; }
  done
  pair_ag=$ag pair_rs=$rs pair_first=$base pair_first_routes=()
  pair_second_name="zerocta ag=$ag rs=$rs"
  case $base in
    plain) pair_first_name=plain ;;
    allgather-only)
      if [[ $ag != auto && $ag != zerocta || $rs != auto && $rs != zerocta ]]; then
        echo "$0: PAIR_BASE=allgather-only compares with both routes on: needs the all-gather" \
          "and the reduce-scatter modes auto or zerocta (have ag=$ag rs=$rs)" >&2
        exit 2
      fi
      pair_first_routes=(--allgather "$ag" --reducescatter nccl)
      pair_first_name="zerocta ag=$ag rs=nccl"
      ;;
    *) echo "$0: PAIR_BASE '$3' is not one of plain|allgather-only" >&2 && exit 2 ;;
  esac
}
