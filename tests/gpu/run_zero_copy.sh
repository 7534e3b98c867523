#!/usr/bin/env bash
# The zero-copy all-gather on a GPU host (2+ GPUs); builds nothing.
#
#   ZEROCTA_BUILD=/path/to/build tests/gpu/run_zero_copy.sh OUTDIR
#
# one-process       ZEROCTA_ALLGATHER=zerocta, one thread driving every GPU (grouped init,
#                   InitAll + splits; cudaMalloc buffers reached by address): every all-gather
#                   on the copy engines, bitwise right (zerocta_gpu_creation_paths_test)
# torch-expandable  PyTorch across processes with expandable segments (cuMem exported as fds):
#                   every all-gather on the copy engines, bitwise right, odd sizes, dtypes, in
#                   and out of place, fresh tensors each time; 256 MiB in-place time
# torch-isolated    the same with one GPU visible per rank (CUDA_VISIBLE_DEVICES=<local rank>):
#                   the peer's GPU has no ordinal here, NVML confirms the NVLink path
# torch-default     PyTorch's default allocator (cudaMalloc, unreachable from another process):
#                   every all-gather to NCCL, alike on every rank, bitwise right
# torch-nccl        the same program without the library: NCCL's time for the comparison
# shm-clean         no zerocta entry left in /dev/shm
# Logs go to OUTDIR; a PASS/FAIL table ends the output and OUTDIR/summary.txt.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/gpu/gpu_host_lib.sh
. "$HERE/gpu_host_lib.sh"
host_paths "$@"
ONLY=${ZCTEST_SUITE_ONLY:-}
# The test hosts' rule (not a product default): NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
unset NCCL_CTA_POLICY LD_PRELOAD ZEROCTA_ALLGATHER ZEROCTA_LOG ZEROCTA_ENABLE PYTORCH_CUDA_ALLOC_CONF
NATIVE=(env "LD_LIBRARY_PATH=$NCCL_SYSTEM_DIR:$CUDA_LIB")
NGPU=$(count_gpus)
NPROC=$((NGPU > 8 ? 8 : NGPU))
RECORD_WIDTH=20

SHIMMED=(env "LD_PRELOAD=$SHIM" ZEROCTA_ALLGATHER=zerocta ZEROCTA_LOG=info)
TORCH=("$TORCHRUN" --standalone "--nproc-per-node=$NPROC" "$HERE/zero_copy_torch.py")

step one-process 300 "${NATIVE[@]}" "${SHIMMED[@]}" ZCTEST_EXPECT_CE=1 \
  "$BIN/zerocta_gpu_creation_paths_test"
step torch-expandable 300 "${SHIMMED[@]}" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  ZG_EXPECT=ce "${TORCH[@]}" --bench
step torch-isolated 300 "${SHIMMED[@]}" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  ZG_ISOLATE=1 ZG_EXPECT=ce "${TORCH[@]}" --bench
step torch-default 300 "${SHIMMED[@]}" ZG_EXPECT=nccl "${TORCH[@]}"
step torch-nccl 300 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "${TORCH[@]}" --bench
if selected shm-clean; then
  left=$(find /dev/shm -maxdepth 1 -name 'zerocta-*' | wc -l)
  if [ "$left" -eq 0 ]; then record shm-clean PASS ""; else record shm-clean FAIL "$left left"; fi
fi

{
  for i in "${!NAMES[@]}"; do printf "%-20s %-5s %s\n" "${NAMES[$i]}" "${RESULTS[$i]}" "${NOTES[$i]}"; done
} >"$OUT/summary.txt"
grep -h "busbw\|copy engines\|WRONG\|PASS\|FAIL" "$OUT"/torch-*.log 2>/dev/null | sort | uniq -c | head -40
for r in "${RESULTS[@]}"; do [ "$r" = PASS ] || exit 1; done
exit 0
