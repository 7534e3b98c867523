#!/usr/bin/env bash
# The GPU checks that CPU-only sessions left unrun, in parts that each fit one 10-minute device
# call (every step has its own time limit, the sum stays under 570 s); builds nothing.
#
#   ZEROCTA_BUILD=/path/to/build tests/gpu/run_pending.sh PART OUTDIR
#
# Part a (2 GPUs): the zero-copy route on PyTorch and its released peer memory, the soak on
#   cuMem buffers and with one rank on cudaMalloc, captures and aborts, cycles, isolation:
#   zero-copy      run_zero_copy.sh torch-expandable (freed outputs' memory comes back within
#                  160 ops), torch-isolated (one GPU visible per rank), torch-default, shm-clean
#   soak-cumem     zerocta_gpu_ag_soak, ZEROCTA_ALLGATHER=zerocta, cuMem buffers, 7000
#                  iterations (over 10 000 ops), bitwise against NCCL, captured ops included
#   soak-mixed     the same, 1000 iterations, rank 0 on cudaMalloc (staged where it is not
#                  first; its captured ops that go to NCCL hang NCCL 2.28.3, see part d)
#   soak-fabric    the same on cuMem exportable as FABRIC handles only (IMEX nodes);
#                  skips where this machine cannot make such memory
#   reliability    run_reliability.sh capture-shim, abort-shim, cycles-shim
#   isolated       probes/isolated_import_probe: can a process that sees one GPU import and
#                  copy a peer process's cuMem memory (CUDA_VISIBLE_DEVICES isolation)?
# Part b (2 GPUs): benchmarks and FSDP2:
#   bench-1proc    zerocta-bench --one-process, nccl-kernel nccl-ce zerocta ceiling, 64M-1G
#   bench-cumem    zerocta-bench, one process per rank, --alloc cumem, the same paths
#   bench-small    zerocta-bench --one-process, nccl-ce zerocta ceiling, 1M-16M: the fixed cost
#                  per op where the copies are short
#   contention     zerocta-bench --alloc cumem --contention: fixed work (40 all-gathers of
#                  256 MiB per rank against 20 GEMMs), nccl-kernel nccl-ce zerocta and bare-ce,
#                  5 rounds in rotated order, in and out of place
#   fsdp2-comm     run_fsdp2.sh comm with --profile-steps 5 (exposed all-gather share)
# Part c (2 GPUs): the #172714 overlap, three rounds; do-no-harm cycles and the ce-route test;
#   the flag probe.
#   overlap        run_overlap.sh, OVERLAP_REPEATS=3
#   do-no-harm     run_do_no_harm.sh cycles-1000, ce-route, shm-clean
#   flag-probe     probes/flag_latency_probe: a flag round trip in host-pinned against device
#                  memory (the route's fixed per-op cost)
# Part d (2 GPUs): whether soak-mixed's hang in a graph replay is NCCL's own:
#   soak-mixed-nccl        the same soak and buffers without the library (NCCL alone)
#   soak-mixed-nccl-noreg  the same with NCCL_GRAPH_REGISTER=0 (no capture-time registration)
#   soak-mixed-noreg       the library's soak-mixed with NCCL_GRAPH_REGISTER=0
#   flag-probe             as in part c
# Part e (2 GPUs): 1000 create/all-gather/destroy cycles with auto, each communicator destroyed
#   before the next is created (about 550 s on 2xH100: NCCL's destroy takes ~0.5 s), RSS, GPU
#   memory, descriptors, threads and /dev/shm entries (run_do_no_harm.sh's cycles-1000 has a
#   second thread destroy them):
#   cycles-1000-serial
# Part x4 (4 GPUs): the sweeps beside NCCL CE, the fixed-work overlap, the 10 000-op soaks:
#   bench-4        zerocta-bench --procs 4, --alloc cumem, nccl-kernel nccl-ce zerocta ceiling
#   bench-3        the same on 3 of the GPUs
#   contention-4   fixed-work overlap on 4 GPUs, 5 runs, in and out of place
#   soak-cumem-4   the soak on 4 ranks, 7000 iterations (over 10 000 ops)
#   soak-mixed-4   the same with rank 0 on cudaMalloc, NCCL_GRAPH_REGISTER=0
#   torch-4        PyTorch, 4 processes, expandable segments (run_zero_copy.sh torch-expandable)
#   fsdp2-4        FSDP2 comm and compute on 4 ranks, plain against zerocta-run --allgather auto
# Part mem4 (4 GPUs): which property of ncclMemAlloc memory puts the route level with NCCL CE at
#   1 GiB in place, where PyTorch's 20 MiB allocations leave it 0.2 % behind: 1 GiB, 9 rounds of
#   nccl-ce and zerocta a pass (zerocta-bench --rounds), the route's memory in each pass:
#   mem-cumem            PyTorch's layout: 20 MiB chunks, minimum granularity, owner access
#   mem-cumem-props      the same chunks with ncclMemAlloc's rdma, recommended and peers
#   mem-cumem-1g         one allocation a buffer, PyTorch's properties
#   mem-cumem-1g-props   one allocation with ncclMemAlloc's properties (all but FABRIC)
#   mem-ncclmem          ncclMemAlloc itself
# Parts x8 and x8f (8 GPUs; never lent so far): what it takes to raise ZEROCTA_AUTO_MAX_RANKS
#   from 4. auto stops at 4 ranks, so these ask for the route itself (ZEROCTA_ALLGATHER=zerocta):
#   bench-8        zerocta-bench --procs 8, --alloc cumem, nccl-kernel nccl-ce zerocta ceiling
#   contention-8   fixed-work overlap on 8 GPUs, 5 runs, in and out of place
#   soak-cumem-8   the soak on 8 ranks, 7000 iterations
#   fsdp2-8 (x8f)  FSDP2 comm and compute on 8 ranks, plain against zerocta-run --allgather
#                  zerocta
# Part rs (2 GPUs): the reduce-scatter route's soak:
#   rs-soak        zerocta_gpu_rs_soak under the library, ZEROCTA_REDUCESCATTER=zerocta,
#                  10 000 ops of float, bfloat16 and half, sum and average, up to 512 MiB of
#                  input, in and out of place, moved buffers, graph replays; each output bitwise
#                  against NCCL's own, every eager op on the copy engines
#   rs-soak-nccl   the same test without the library, CI size: the test's own control
#
# Logs go to OUTDIR/PART/; then OUTDIR/PART.tgz holds them all (the device tool brings back few
# files) and a PASS/FAIL table ends the output. Exit status 1 if a step failed.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
if [ $# -ne 2 ] || ! [[ $1 =~ ^(a|b|c|d|e|rs|x4|mem4|x8|x8f)$ ]]; then
  echo "usage: ZEROCTA_BUILD=build $0 a|b|c|d|e|rs|x4|mem4|x8|x8f OUTDIR" >&2
  exit 2
fi
PART=$1
# shellcheck source=tests/gpu/gpu_host_lib.sh
. "$HERE/gpu_host_lib.sh"
host_paths "$2/$PART"
export ZEROCTA_BUILD=$BUILD
# The test hosts' rule (not a product default): NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# shellcheck disable=SC2034  # read by record() in gpu_host_lib.sh
RECORD_WIDTH=16

# soak NAME SECONDS RANKS ALLOC ITERS: the all-gather soak under the library, route forced.
soak() {
  local name=$1 secs=$2 ranks=$3 alloc=$4 iters=$5
  step "$name" "$secs" env LD_PRELOAD="$SHIM" LD_LIBRARY_PATH="$NCCL_SYSTEM_DIR:$CUDA_LIB" \
    ZCTEST_EXPECT_SHIM=1 ZEROCTA_ALLGATHER=zerocta ZCTEST_SOAK_EXPECT_CE=1 \
    ZCTEST_SOAK_NRANKS="$ranks" \
    ZCTEST_SOAK_ALLOC="$alloc" ZCTEST_SOAK_ITERS="$iters" \
    ZCTEST_SOAK_TIMEOUT_S=$((secs - 20)) "$BIN/zerocta_gpu_ag_soak"
  grep -h '^soak: iterations=' "$OUT/$name.log" 2>/dev/null | sed "s/^/    /"
}

# soak_nccl NAME SECONDS ALLOC ITERS [VAR=VALUE...]: the same soak without the library: what
# NCCL alone does with these buffers (a baseline for a soak that fails under the library).
soak_nccl() {
  local name=$1 secs=$2 alloc=$3 iters=$4
  shift 4
  step "$name" "$secs" env LD_LIBRARY_PATH="$NCCL_SYSTEM_DIR:$CUDA_LIB" ZCTEST_EXPECT_SHIM=0 \
    ZCTEST_SOAK_NRANKS=2 ZCTEST_SOAK_ALLOC="$alloc" ZCTEST_SOAK_ITERS="$iters" \
    ZCTEST_SOAK_TIMEOUT_S=$((secs - 20)) "$@" "$BIN/zerocta_gpu_ag_soak"
  grep -h '^soak: iterations=' "$OUT/$name.log" 2>/dev/null | sed "s/^/    /"
}

# bench NAME SECONDS ARGS...: zerocta-bench, JSON beside the log; by default the comparison
# paths from 64 MiB to 1 GiB (later options win).
bench() {
  local name=$1 secs=$2
  shift 2
  step "$name" "$secs" env LD_LIBRARY_PATH="$NCCL_SYSTEM_DIR:$CUDA_LIB" \
    "$BUILD/tools/zerocta-bench" --multicast-off --paths nccl-kernel,nccl-ce,zerocta,ceiling \
    -b 64M -e 1G -f 4 --json "$OUT/$name.json" "$@"
}

case "$PART" in
  x4 | mem4) need_gpus=4 ;;
  x8 | x8f) need_gpus=8 ;;
  *) need_gpus=2 ;;
esac
if [ "$(count_gpus)" -lt "$need_gpus" ]; then
  echo "part $PART: SKIP, needs $need_gpus GPUs, $(count_gpus) visible"
  exit 0
fi

case "$PART" in
  a)
    step zero-copy 200 env ZCTEST_SUITE_ONLY='torch-expandable|torch-isolated|torch-default|shm-clean' \
      "$HERE/run_zero_copy.sh" "$OUT/zero-copy"
    soak soak-cumem 60 2 cumem 7000
    # NCCL_GRAPH_REGISTER=0: NCCL 2.28.3 alone hangs in a grouped graph replay over cuMem on one
    # rank and cudaMalloc on the other (iteration 87; docs/RELIABILITY.md), and those ops are NCCL's
    NCCL_GRAPH_REGISTER=0 soak soak-mixed 90 2 mixed 1000
    soak soak-fabric 60 2 fabric 1000  # skips where no IMEX channel lets a process make FABRIC memory
    step reliability 180 env ZCTEST_RELIABILITY_ONLY='capture-shim|abort-shim|cycles-shim' \
      ZCTEST_RELIABILITY_BUDGET_S=160 "$HERE/run_reliability.sh" "$BUILD" "$OUT/reliability"
    step isolated 40 "$BIN/zerocta_gpu_probe_isolated_import"
    grep -h '^RESULT' "$OUT/isolated.log" 2>/dev/null | sed "s/^/    /"
    ;;
  b)
    bench bench-1proc 60 -g 2
    bench bench-cumem 60 --procs 2 --alloc cumem
    bench bench-small 60 -g 2 --paths nccl-ce,zerocta,ceiling -b 1M -e 16M
    bench contention 180 --procs 2 --alloc cumem --paths none --contention \
      --contention-paths nccl-kernel,nccl-ce,zerocta --repeats 5 --contention-placement both
    step fsdp2-comm 200 env FSDP_ARGS="--profile-steps 5" \
      "$REPO/LD_PRELOAD-examples/run_fsdp2.sh" 2 "$OUT/fsdp2" comm
    ;;
  c)
    step overlap 350 env OVERLAP_REPEATS=3 OVERLAP_TIMEOUT_S=110 \
      "$REPO/LD_PRELOAD-examples/run_overlap.sh" 2 "$OUT/overlap"
    step do-no-harm 180 env ZCTEST_SUITE_ONLY='cycles-1000|ce-route|shm-clean' \
      "$HERE/run_do_no_harm.sh" "$OUT/do-no-harm"
    step flag-probe 30 "$BIN/zerocta_gpu_probe_flag_latency"
    grep -h ' us$' "$OUT/flag-probe.log" 2>/dev/null | sed "s/^/    /"
    ;;
  d)
    soak_nccl soak-mixed-nccl 60 mixed 1000
    soak_nccl soak-mixed-nccl-noreg 60 mixed 1000 NCCL_GRAPH_REGISTER=0
    NCCL_GRAPH_REGISTER=0 soak soak-mixed-noreg 60 2 mixed 1000
    step flag-probe 30 "$BIN/zerocta_gpu_probe_flag_latency"
    grep -h ' us$' "$OUT/flag-probe.log" 2>/dev/null | sed "s/^/    /"
    ;;
  e)
    step cycles-1000-serial 590 env LD_PRELOAD="$SHIM" LD_LIBRARY_PATH="$NCCL_SYSTEM_DIR:$CUDA_LIB" \
      ZCTEST_CYCLES_ALLGATHER=auto ZCTEST_CYCLES=1000 ZCTEST_CYCLES_DESTROY_LAG=0 \
      ZCTEST_CYCLES_BUDGET_S=575 "$BIN/zerocta_gpu_cycles_test"
    grep -h '^RELIABILITY cycles' "$OUT/cycles-1000-serial.log" 2>/dev/null | sed "s/^/    /"
    ;;
  rs)
    step rs-soak 420 env LD_PRELOAD="$SHIM" LD_LIBRARY_PATH="$NCCL_SYSTEM_DIR:$CUDA_LIB" \
      ZCTEST_EXPECT_SHIM=1 ZEROCTA_REDUCESCATTER=zerocta ZCTEST_RS_SOAK_EXPECT_CE=1 \
      ZCTEST_RS_SOAK_OPS=10000 ZCTEST_RS_SOAK_TIMEOUT_S=400 "$BIN/zerocta_gpu_rs_soak"
    grep -h '^rs-soak: rank' "$OUT/rs-soak.log" 2>/dev/null | sed "s/^/    /"
    step rs-soak-nccl 120 env LD_LIBRARY_PATH="$NCCL_SYSTEM_DIR:$CUDA_LIB" ZCTEST_EXPECT_SHIM=0 \
      ZCTEST_RS_SOAK_CI=1 ZCTEST_RS_SOAK_OPS=400 ZCTEST_RS_SOAK_TIMEOUT_S=100 \
      "$BIN/zerocta_gpu_rs_soak"
    grep -h '^rs-soak: rank 0 ' "$OUT/rs-soak-nccl.log" 2>/dev/null | sed "s/^/    /"
    ;;
  x4)
    bench bench-4 120 --procs 4 --alloc cumem
    bench bench-3 120 --procs 3 --alloc cumem
    bench contention-4 200 --procs 4 --alloc cumem --paths none --contention \
      --contention-paths nccl-kernel,nccl-ce,zerocta --repeats 5 --contention-placement both
    soak soak-cumem-4 120 4 cumem 7000
    # NCCL_GRAPH_REGISTER=0: NCCL 2.28.3 alone hangs on captured ops over cuMem on some ranks and
    # cudaMalloc on others (docs/RELIABILITY.md), and those ops are NCCL's
    NCCL_GRAPH_REGISTER=0 soak soak-mixed-4 120 4 mixed 7000
    step torch-4 150 env ZCTEST_SUITE_ONLY='torch-expandable' \
      "$HERE/run_zero_copy.sh" "$OUT/zero-copy-4"
    step fsdp2-4 260 env FSDP_ARGS="--steps 40" \
      "$REPO/LD_PRELOAD-examples/run_fsdp2.sh" 4 "$OUT/fsdp2-4" comm compute
    ;;
  mem4)
    props=rdma,recommended,peers
    for variant in "cumem:20M:none" "cumem-props:20M:$props" "cumem-1g:1G:none" \
      "cumem-1g-props:1G:$props" "ncclmem"; do
      IFS=: read -r name chunk with <<<"$variant"
      alloc=(--alloc cumem --cumem-chunk "$chunk" --cumem-props "$with")
      [ "$name" = ncclmem ] && alloc=(--alloc ncclmem)
      bench "mem-$name" 80 -g 4 "${alloc[@]}" --paths nccl-ce,zerocta -b 1G -e 1G -n 100 \
        --rounds 9 --deadline 70
      sed -n '/^# Rounds:/,/^# zerocta-bench/p' "$OUT/mem-$name.log" 2>/dev/null | sed "s/^/    /"
    done
    ;;
  x8)
    bench bench-8 150 --procs 8 --alloc cumem
    bench contention-8 220 --procs 8 --alloc cumem --paths none --contention \
      --contention-paths nccl-kernel,nccl-ce,zerocta --repeats 5 --contention-placement both
    soak soak-cumem-8 150 8 cumem 7000
    ;;
  x8f)
    step fsdp2-8 400 env FSDP_ARGS="--steps 40" ZEROCTA_FSDP_ALLGATHER=zerocta \
      "$REPO/LD_PRELOAD-examples/run_fsdp2.sh" 8 "$OUT/fsdp2-8" comm compute
    ;;
esac

tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$PART" 2>/dev/null
failed=0
for i in "${!NAMES[@]}"; do
  [ "${RESULTS[$i]}" = PASS ] || failed=1
done
printf '%s\n' "part $PART: ${#NAMES[@]} steps, $([ $failed = 0 ] && echo all passed || echo some FAILED)"
exit $failed
