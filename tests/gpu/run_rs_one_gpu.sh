#!/usr/bin/env bash
# The copy-engine reduce-scatter end to end on one GPU (tests/gpu/rs_one_gpu_test.cc): 2 and 3
# ranks in processes of their own, the fake NCCL for their meeting, a library built with
# -DZEROCTA_SHARED_GPU_TEST=ON; every case kind eager, then captured into a CUDA graph and
# replayed (and a graph of two ops). Logs under OUT; each rank's host time per routed op (the
# library's exit report, ZEROCTA_STATS=1) in OUT/rs-one-gpu-host-times.txt.
#
#   tests/gpu/run_rs_one_gpu.sh SHARED_GPU_BUILD TEST_BINARY OUT
#   e.g. cmake -S . -B build-sg -DZEROCTA_SHARED_GPU_TEST=ON && ninja -C build-sg zerocta fake_nccl
#        tests/gpu/run_rs_one_gpu.sh build-sg build/tests/gpu/zerocta_gpu_rs_one_gpu /tmp/rs1
set -euo pipefail
build=$(readlink -f -- "$1")
test_binary=$(readlink -f -- "$2")
out=$3
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Only the fake libnccl.so.2 on the library path: the CUDA driver is the machine's own.
mkdir -p "$work/lib" "$work/rdv"
cp "$build/fake_nccl/libnccl.so.2" "$work/lib/"
status=0
for nranks in 2 3; do
  env FAKE_NCCL_RENDEZVOUS_DIR="$work/rdv" FAKE_NCCL_COMM_ID="rs-one-gpu-$nranks-$$" \
    FAKE_NCCL_RENDEZVOUS_TIMEOUT_MS=20000 ZEROCTA_REDUCESCATTER=zerocta ZEROCTA_LOG=info \
    ZEROCTA_STATS=1 \
    LD_LIBRARY_PATH="$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    LD_PRELOAD="$build/libzerocta.so" timeout 300 "$test_binary" "$nranks" \
    >"$out/rs-one-gpu-$nranks-ranks.txt" 2>"$out/rs-one-gpu-$nranks-ranks.log" || status=$?
  grep -E "RESULT" "$out/rs-one-gpu-$nranks-ranks.txt" | grep -c " ok" |
    xargs printf "%s ranks: %s cases ok\n" "$nranks"
  grep -E "FAILED" "$out/rs-one-gpu-$nranks-ranks.txt" || true
  grep -h "stats route host us per op" "$out/rs-one-gpu-$nranks-ranks.log" |
    sed "s/^/$nranks ranks: /" >>"$out/rs-one-gpu-host-times.txt" || true
done
exit "$status"
