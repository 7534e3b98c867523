#!/usr/bin/env bash
# The examples set nothing for NCCL or PyTorch unless asked: without EXAMPLES_MULTICAST_OFF=1,
# multicast_off_if_asked (preflight.sh) leaves NCCL_NVLS_ENABLE and
# TORCH_SYMM_MEM_DISABLE_MULTICAST as they were and prints nothing; with it, it exports both
# and says so in one line.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC1091
. "$here/preflight.sh"
fail() { echo "FAIL [multicast flag]: $*" && exit 1; }

unset NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST EXAMPLES_MULTICAST_OFF
said=$(multicast_off_if_asked)
multicast_off_if_asked
[[ -z $said ]] || fail "printed '$said' without the flag"
[[ -z ${NCCL_NVLS_ENABLE+x} && -z ${TORCH_SYMM_MEM_DISABLE_MULTICAST+x} ]] ||
  fail "set the variables without the flag"

export NCCL_NVLS_ENABLE=1  # a user's own choice stays
multicast_off_if_asked
[[ $NCCL_NVLS_ENABLE == 1 ]] || fail "changed the user's NCCL_NVLS_ENABLE without the flag"

export EXAMPLES_MULTICAST_OFF=1
said=$(multicast_off_if_asked)
multicast_off_if_asked >/dev/null
[[ $NCCL_NVLS_ENABLE == 0 && $TORCH_SYMM_MEM_DISABLE_MULTICAST == 1 ]] ||
  fail "did not set both with EXAMPLES_MULTICAST_OFF=1"
[[ $(wc -l <<<"$said") == 1 && $said == *"NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1"* ]] ||
  fail "did not say what it set in one line: '$said'"
echo "PASS [multicast flag]"
