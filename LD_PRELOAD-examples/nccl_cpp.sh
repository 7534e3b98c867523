#!/usr/bin/env bash
# zerocta in front of a C++ program that links NCCL dynamically: the same binary, run plain
# and under zerocta-run. The program is build/tools/zerocta-demo (one process per GPU), which
# all-gathers each size twice - through pncclAllGather (NCCL itself, never intercepted) and
# through ncclAllGather (what zerocta routes) - and checks that both outputs are identical.
#
#   nccl_cpp.sh [NRANKS [ITERS]]    the demo's arguments; default every GPU, 20 iterations
#
# Environment: ZEROCTA_BUILD (default ../build), ZEROCTA_RUN_ARGS (default
# "--allgather auto --stats"). Exit status: 0 both runs OK, 1 a run failed, 2 not built.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
build=${ZEROCTA_BUILD:-$here/../build}
demo=$build/tools/zerocta-demo
zerocta_run=$build/tools/zerocta-run
read -r -a zr_args <<<"${ZEROCTA_RUN_ARGS:---allgather auto --stats}"

for f in "$demo" "$zerocta_run"; do
  [[ -x $f ]] || { echo "$0: $f not built (cmake --build $build)" >&2 && exit 2; }
done
# The first run is the reference: it must not have zerocta preloaded already.
[[ ${LD_PRELOAD:-} != *libzerocta* ]] || { echo "$0: unset LD_PRELOAD first (it has libzerocta)" >&2 && exit 2; }
# shellcheck disable=SC1091  # preflight.sh sits beside this script
. "$here/preflight.sh"
multicast_off_if_asked  # sets nothing unless EXAMPLES_MULTICAST_OFF=1 (preflight.sh)
# This script's own ZEROCTA_* knobs stay in this shell: the ranks have no use for them.
export -n ZEROCTA_BUILD ZEROCTA_RUN_ARGS

log=$(mktemp -d "${TMPDIR:-/tmp}/zerocta-nccl-cpp.XXXXXX")
status=0
echo "== 1/2 without zerocta: both columns are NCCL's own all-gather (route 'no-shim')"
"$demo" "$@" 2>&1 | tee "$log/nccl.txt" || status=1
echo
echo "== 2/2 under zerocta-run ${zr_args[*]}: the 'routed' column goes through zerocta"
"$zerocta_run" "${zr_args[@]}" -- "$demo" "$@" 2>&1 | tee "$log/zerocta.txt" || status=1
echo
if grep -q "Nothing to do" "$log/nccl.txt"; then
  echo "nccl_cpp.sh: fewer than 2 GPUs here, nothing was compared"
elif ! grep -q "zerocta preloaded" "$log/zerocta.txt"; then
  echo "nccl_cpp.sh: FAILED, the second run did not have zerocta preloaded" && status=1
elif [[ $status == 0 ]]; then
  echo "nccl_cpp.sh: both runs OK (outputs kept in $log)"
else
  echo "nccl_cpp.sh: a run FAILED (outputs kept in $log)"
fi
exit "$status"
