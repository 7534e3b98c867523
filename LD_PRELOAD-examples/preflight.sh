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
