#!/usr/bin/env bash
# The scaling run for one GPU count (issue 7 on 8 GPUs; the same on 2 or 4): the randomized
# all-gather soak bitwise against NCCL (push and pull), zerocta-bench bandwidth + contention
# for every path (and the pull direction), and FSDP2 with the route forced, plain vs shim.
# Each step is time-limited so that the whole run fits one 10-minute device call on 8 GPUs.
#
#   run_scaling.sh NGPU OUTDIR            ZEROCTA_BUILD (default <repo>/build), ONLY (regex of
#                                         steps: soak-push soak-pull bench bench-pull fsdp2)
# Writes OUTDIR/<step>.log, bench JSONs, OUTDIR/fsdp2/, and a summary; exit 1 if a step failed.
set -uo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd -- "$here/../.." && pwd)
# shellcheck source=gpu_host_lib.sh
source "$here/gpu_host_lib.sh"
(($# == 2)) || { echo "usage: $0 NGPU OUTDIR" >&2 && exit 2; }
ngpu=$1 out=$2
build=${ZEROCTA_BUILD:-$repo/build}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
have=$(count_gpus)
if ((have < ngpu)); then
  echo "run_scaling: $ngpu GPUs asked, $have visible: nothing run" && exit 0
fi

step() {  # step NAME LIMIT_S command... : runs it, records PASS/FAIL with its time
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  selected "$name" || return 0
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then
    record "$name" PASS "$((SECONDS - t0))s"
  else
    record "$name" FAIL "rc=$? after $((SECONDS - t0))s, see $out/$name.log"
  fi
}
soak=(env LD_PRELOAD="$build/libzerocta.so" ZEROCTA_ALLGATHER=zerocta ZCTEST_SOAK_ITERS=1000
  ZCTEST_SOAK_TIMEOUT_S=60 ZCTEST_SOAK_EXPECT_CE=1 ZCTEST_SOAK_NRANKS="$ngpu")
step soak-push 70 "${soak[@]}" ZEROCTA_CE_DIRECTION=push "$build/tests/gpu/zerocta_gpu_ag_soak"
step soak-pull 70 "${soak[@]}" ZEROCTA_CE_DIRECTION=pull "$build/tests/gpu/zerocta_gpu_ag_soak"
bench=("$build/tools/zerocta-bench" -g "$ngpu" -b 16M -e 1G -f 4 -n 10 -w 3 --contention)
step bench 150 "${bench[@]}" --paths nccl-kernel,nccl-ce,zerocta,ceiling \
  --contention-paths nccl-kernel,nccl-ce,zerocta,bare-ce --json "$out/bench-$ngpu.json"
step bench-pull 60 env ZEROCTA_CE_DIRECTION=pull "${bench[@]}" --paths zerocta \
  --contention-paths zerocta --json "$out/bench-$ngpu-pull.json"
# auto stays on NCCL above ZEROCTA_AUTO_MAX_RANKS ranks: force the route to measure it.
step fsdp2 200 env ZEROCTA_BUILD="$build" ZEROCTA_FSDP_ALLGATHER=zerocta PAIR_TIMEOUT_S=95 \
  "$repo/LD_PRELOAD-examples/run_fsdp2.sh" "$ngpu" "$out/fsdp2" comm

failed=0
for r in "${RESULTS[@]}"; do [[ $r == FAIL ]] && failed=1; done
echo "run_scaling: $ngpu GPUs, ${#RESULTS[@]} steps, $([ $failed = 0 ] && echo 'all passed' || echo 'FAILURES')"
exit $failed
