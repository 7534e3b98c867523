#!/usr/bin/env bash
# run_fsdp2.sh, run_pair.sh and run_overlap.sh on a machine without GPUs: nvidia-smi, torchrun and
# zerocta-run are stand-ins (in a temporary directory) that log how they were called and write
# the records the real programs would, so compare_runs.py, fsdp2_summary.py and run_overlap.sh's
# summary run for real. Checks which routes each run gets (ZEROCTA_FSDP_ALLGATHER,
# ZEROCTA_FSDP_REDUCESCATTER, PAIR_BASE; run_overlap.sh --op), that losses and weights are still
# compared bitwise, that the scripts' own ZEROCTA_* knobs stay out of the ranks, that NCCL and
# PyTorch get NCCL_NVLS_ENABLE / TORCH_SYMM_MEM_DISABLE_MULTICAST only with
# EXAMPLES_MULTICAST_OFF=1, and that bad settings stop a script before it launches anything.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf -- "$tmp"' EXIT
fail() { echo "FAIL [run scripts]: $*" && exit 1; }

mkdir -p "$tmp/bin" "$tmp/build"
: >"$tmp/build/libzerocta.so"
log=$tmp/calls.log

cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
echo "GPU 0: Fake (UUID: GPU-0)"
echo "GPU 1: Fake (UUID: GPU-1)"
EOF

# zerocta-run: logs its options and exports what the real one would (the routes, the stats
# path), then runs the command after --.
cat >"$tmp/bin/zerocta-run" <<'EOF'
#!/usr/bin/env bash
echo "zerocta-run $*" >>"$FAKE_LOG"
export FAKE_ZEROCTA=1
while (($#)); do
  case $1 in
    --) shift && break ;;
    --lib) shift 2 ;;
    --allgather) export ZEROCTA_ALLGATHER=$2 && shift 2 ;;
    --reducescatter) export ZEROCTA_REDUCESCATTER=$2 && shift 2 ;;
    --stats=*) export ZEROCTA_STATS=${1#--stats=} && shift ;;
    *) shift ;;
  esac
done
exec "$@"
EOF

# torchrun: logs the ranks' environment and writes what rank 0 would: a training record
# (--out) or overlap_172714.py's JSON (--json), and one ZEROCTA_STATS file per rank.
cat >"$tmp/bin/torchrun" <<'EOF'
#!/usr/bin/env bash
script=$3
shift 3
{
  echo "torchrun $(basename -- "$script") zerocta=${FAKE_ZEROCTA:-no} $*"
  env | grep -E '^(ZEROCTA_|NCCL_NVLS_ENABLE=|TORCH_SYMM_MEM_DISABLE_MULTICAST=)' | sort |
    sed 's/^/  env /'
} >>"$FAKE_LOG"
exec python3 - "$script" "$@" <<'PY'
import json, os, sys
script, args = os.path.basename(sys.argv[1]), sys.argv[2:]
opt = lambda name, default=None: args[args.index(name) + 1] if name in args else default
zc = os.environ.get("FAKE_ZEROCTA") == "1"
ag, rs = os.environ.get("ZEROCTA_ALLGATHER", "-"), os.environ.get("ZEROCTA_REDUCESCATTER", "-")
if zc and "ZEROCTA_STATS" in os.environ:
    for pid in (101, 102):
        ops = {"allgather": {"ce" if ag in ("auto", "zerocta") else "passthrough":
                             {"calls": 10, "bytes": 10 << 26}},
               "reducescatter": {"ce" if rs in ("auto", "zerocta") else "passthrough":
                                 {"calls": 8, "bytes": 8 << 26}}}
        with open(os.environ["ZEROCTA_STATS"].replace("%p", str(pid)), "w") as f:
            json.dump({"pid": pid, "comms_created": 1, "comms_zero_policy": 1,
                       "comms_ce_ready": 1, "ops": ops,
                       "route": {"pairs_each_pushes": 5, "pairs_later_does_both": 0}}, f)
if script == "overlap_172714.py":
    variant = ("zerocta" if zc else
               "nccl-ce" if opt("--buffers") == "nccl-windows" else "kernel")
    ovl = {"kernel": 14.0, "nccl-ce": 13.0, "zerocta": 11.0}[variant]
    rec = {"gemm": 10.0, "comm": 5.0, "seq": 15.0, "ovl": ovl, "ovl_gemm": ovl - 0.5,
           "ovl_comm": 4.0, "ranks": 2, "buffers": opt("--buffers", "plain"),
           "route": "ce" if zc else "-", "correct": True, "op": opt("--op", "allgather"),
           "args": args}
    with open(opt("--json"), "w") as f:
        json.dump(rec, f)
    sys.exit(0)
step = 10.0
if zc:
    step = 8.0 if rs in ("auto", "zerocta") else 9.0
mismatch = zc and rs in ("auto", "zerocta") and os.environ.get("FAKE_RS_MISMATCH") == "1"
losses = [["3f800000", "3f000000", "3e800000"]] * 2
rec = {"script": "fsdp2_gpt", "name": opt("--config"), "config": opt("--config"),
       "world_size": 2, "steps": 3, "seed": 1234, "deterministic": "strict",
       "losses_hex": [l[:2] + ["3e800001"] for l in losses] if mismatch else losses,
       "checksum": ["aa", "bb"], "finite": True,
       "timing": {"median_step_ms": step, "timed_steps": 2},
       "zerocta": [] if zc else None, "profile": None, "args": args}
with open(opt("--out"), "w") as f:
    json.dump(rec, f)
PY
EOF
chmod +x "$tmp/bin/"*

export PATH=$tmp/bin:$PATH FAKE_LOG=$log ZEROCTA_BUILD=$tmp/build ZEROCTA_RUN=$tmp/bin/zerocta-run
export TORCHRUN=$tmp/bin/torchrun PAIR_TIMEOUT_S=60 OVERLAP_TIMEOUT_S=60
unset CUDA_VISIBLE_DEVICES LD_PRELOAD NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST \
  EXAMPLES_MULTICAST_OFF ZEROCTA_FSDP_ALLGATHER ZEROCTA_FSDP_REDUCESCATTER ZEROCTA_PAIR_ALLGATHER \
  ZEROCTA_PAIR_REDUCESCATTER ZEROCTA_PAIR_ARGS PAIR_BASE BASELINE_TWICE FSDP_ARGS FSDP_PAIRS \
  ZEROCTA_ALLGATHER ZEROCTA_REDUCESCATTER ZEROCTA_STATS

# json FILE EXPR: a value of a JSON file (EXPR in Python, the data as d).
json() { python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
# run NAME CMD...: runs a script quietly, its output in $tmp/NAME.out; sets rc.
run() {
  local name=$1
  shift
  : >"$log"
  rc=0
  "$@" >"$tmp/$name.out" 2>&1 || rc=$?
}
expect_rc() { ((rc == $1)) || { cat "$tmp/$2.out" && fail "$2: exit $rc, expected $1"; }; }
# No knob of the scripts themselves reached a rank, and no multicast setting unless asked.
no_leaks() {
  ! grep -E '  env ZEROCTA_(FSDP|PAIR|BUILD|RUN)' "$log" || fail "$1: a script's own knob reached the ranks"
  ! grep -E '  env (NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST)=' "$log" ||
    fail "$1: multicast settings without EXAMPLES_MULTICAST_OFF=1"
}

# 1. Defaults: plain vs all-gather route only, as before the reduce-scatter option.
out=$tmp/default
run default env FSDP_PAIRS=2 "$here/run_fsdp2.sh" 2 "$out" tiny
expect_rc 0 default
[[ $(grep -c '^zerocta-run .*--allgather auto --reducescatter nccl ' "$log") == 2 ]] ||
  fail "default: zerocta-run not given --allgather auto --reducescatter nccl once per pair"
[[ $(grep -c '^torchrun fsdp2_gpt.py zerocta=no ' "$log") == 2 ]] || fail "default: no plain run per pair"
no_leaks default
[[ $(json "$out/fsdp2-summary.json" 'd["compared"]') == "zerocta ag=auto rs=nccl vs plain" ]] ||
  fail "default: summary does not say what was compared"
[[ $(json "$out/fsdp2-tiny-p2/summary.json" 'd["ratio"]') == 0.9 ]] || fail "default: ratio"
grep -q 'run_fsdp2: MATCH for tiny, zerocta ag=auto rs=nccl vs plain' "$tmp/default.out" ||
  fail "default: last line"

# 2. Both routes against plain, with NVLink multicast off as the test hosts need.
out=$tmp/both
run both env ZEROCTA_FSDP_REDUCESCATTER=auto EXAMPLES_MULTICAST_OFF=1 FSDP_PAIRS=2 \
  "$here/run_fsdp2.sh" 2 "$out" tiny comm
expect_rc 0 both
[[ $(grep -c '^zerocta-run .*--allgather auto --reducescatter auto ' "$log") == 4 ]] ||
  fail "both: zerocta-run not given both routes in every pair"
[[ $(grep -c '^torchrun fsdp2_gpt.py zerocta=no ' "$log") == 4 ]] || fail "both: no plain run per pair"
! grep -E '  env ZEROCTA_(FSDP|PAIR|BUILD|RUN)' "$log" || fail "both: a script's own knob reached the ranks"
[[ $(grep -c '  env NCCL_NVLS_ENABLE=0' "$log") == 8 && $(grep -c '  env TORCH_SYMM_MEM_DISABLE_MULTICAST=1' "$log") == 8 ]] ||
  fail "both: not every run had NVLink multicast off with EXAMPLES_MULTICAST_OFF=1"
[[ $(json "$out/fsdp2-comm-p1/summary.json" 'd["reducescatter_routes"]["ce"]["calls"]') == 16 ]] ||
  fail "both: the reduce-scatter routes are not in the pair's summary"
[[ $(json "$out/fsdp2-summary.json" 'd["configs"]["fsdp2-comm"]["ratios"]') == "[0.8, 0.8]" ]] ||
  fail "both: ratios"
grep -q 'fsdp2-tiny-p1: zerocta reduce-scatter routes, all ranks: ce 16 calls' "$tmp/both.out" ||
  fail "both: the reduce-scatter routes are not reported"

# 3. The all-gather route alone against both: the first run of a pair under zerocta too.
out=$tmp/ag-vs-both
run ag-vs-both env PAIR_BASE=allgather-only ZEROCTA_FSDP_REDUCESCATTER=auto FSDP_PAIRS=2 \
  "$here/run_fsdp2.sh" 2 "$out" comm
expect_rc 0 ag-vs-both
grep -q 'zerocta=no' "$log" && fail "ag-vs-both: a plain run"
[[ $(grep -c '^zerocta-run .*--allgather auto --reducescatter nccl --stats=.*/stats-allgather-only/' "$log") == 2 &&
  $(grep -c '^zerocta-run .*--allgather auto --reducescatter auto --stats=.*/stats/' "$log") == 2 ]] ||
  fail "ag-vs-both: not the all-gather route alone, then both, in every pair"
no_leaks ag-vs-both
[[ -s $out/fsdp2-comm-p1/allgather-only.json && ! -e $out/fsdp2-comm-p1/plain.json ]] ||
  fail "ag-vs-both: the first run's record"
s=$out/fsdp2-comm-p2/summary.json
[[ $(json "$s" 'round(d["ratio"], 4)') == 0.8889 && $(json "$s" 'd["first_zerocta"]') == True ]] ||
  fail "ag-vs-both: ratio against the all-gather route alone"
[[ $(json "$s" 'd["first_routes"]["reducescatter_routes"]["passthrough"]["calls"]') == 16 ]] ||
  fail "ag-vs-both: the first run's routes"
[[ $(json "$out/fsdp2-summary.json" 'd["compared"]') == "zerocta ag=auto rs=auto vs zerocta ag=auto rs=nccl" ]] ||
  fail "ag-vs-both: summary does not say what was compared"
grep -q 'median step: zerocta ag=auto rs=nccl 9.00 ms, zerocta ag=auto rs=auto 8.00 ms, ratio 0.889' \
  "$tmp/ag-vs-both.out" || fail "ag-vs-both: the step-time line"

# 4. Losses and weights are compared bitwise in either kind of pair.
for base in plain allgather-only; do
  run mismatch-$base env PAIR_BASE=$base ZEROCTA_FSDP_REDUCESCATTER=zerocta FAKE_RS_MISMATCH=1 \
    "$here/run_fsdp2.sh" 2 "$tmp/mismatch-$base" tiny
  expect_rc 1 mismatch-$base
  grep -q 'VERDICT fsdp2-tiny: MISMATCH: losses differ' "$tmp/mismatch-$base.out" ||
    fail "mismatch ($base): a differing loss was not caught"
  [[ $(json "$tmp/mismatch-$base/fsdp2-summary.json" 'd["all_match"]') == False ]] ||
    fail "mismatch ($base): the sweep summary"
done

# 5. Settings that make no sense stop before anything is launched.
for bad in "ZEROCTA_FSDP_REDUCESCATTER=sometimes" "PAIR_BASE=allgather-only" \
  "PAIR_BASE=reducescatter-only ZEROCTA_FSDP_REDUCESCATTER=auto" \
  "PAIR_BASE=allgather-only ZEROCTA_FSDP_ALLGATHER=nccl ZEROCTA_FSDP_REDUCESCATTER=auto"; do
  read -r -a vars <<<"$bad"
  run bad env "${vars[@]}" "$here/run_fsdp2.sh" 2 "$tmp/bad" tiny
  expect_rc 2 bad
  [[ ! -s $log ]] || fail "bad ($bad): launched something"
done
run bad env BASELINE_TWICE=1 PAIR_BASE=allgather-only ZEROCTA_PAIR_REDUCESCATTER=auto \
  "$here/run_pair.sh" 2 "$tmp/bad" x "$here/fsdp2_gpt.py"
expect_rc 2 bad
[[ ! -s $log ]] || fail "BASELINE_TWICE=1 with PAIR_BASE=allgather-only launched something"

# 6. run_pair.sh alone: ZEROCTA_PAIR_REDUCESCATTER, ZEROCTA_PAIR_ARGS in both zerocta runs.
run pair env PAIR_BASE=allgather-only ZEROCTA_PAIR_REDUCESCATTER=Auto ZEROCTA_PAIR_ARGS="--log info" \
  "$here/run_pair.sh" 2 "$tmp/pair" p "$here/fsdp2_gpt.py" --config tiny
expect_rc 0 pair
[[ $(grep -c '^zerocta-run .*--log info -- ' "$log") == 2 ]] || fail "pair: ZEROCTA_PAIR_ARGS not in both runs"
grep -q -- '--allgather auto --reducescatter auto ' "$log" || fail "pair: mode not lower-cased"

# 7. run_overlap.sh with a reduce-scatter: the zerocta variant on --reducescatter zerocta, the
# options passed through, the share of the possible gain per variant.
out=$tmp/overlap-rs
run overlap-rs env OVERLAP_REPEATS=2 "$here/run_overlap.sh" 2 "$out" --op reducescatter \
  --rs-dtype fp32 --redop avg --iters 5
expect_rc 0 overlap-rs
[[ $(grep -c '^zerocta-run .*--reducescatter zerocta -- ' "$log") == 2 ]] ||
  fail "overlap-rs: zerocta variant not on --reducescatter zerocta"
grep -q -- '--allgather' "$log" && fail "overlap-rs: an all-gather route asked for"
[[ $(grep -c '^torchrun overlap_172714.py .*--op reducescatter --rs-dtype fp32 --redop avg --iters 5' "$log") == 6 ]] ||
  fail "overlap-rs: options not passed to every run"
no_leaks overlap-rs
s=$out/overlap-summary.json
[[ $(json "$s" 'd["op"]') == reducescatter ]] || fail "overlap-rs: summary op"
[[ $(json "$s" 'd["variants"]["zerocta"]["recovered"]["median"]') == 0.75 &&
  $(json "$s" 'd["variants"]["nccl-ce"]["recovered"]["median"]') == 0.25 &&
  $(json "$s" 'd["variants"]["kernel"]["recovered"]["median"]') == 0.0 ]] ||
  fail "overlap-rs: recovered shares"
grep -q '^reduce-scatter overlapped with the GEMM' "$tmp/overlap-rs.out" || fail "overlap-rs: table title"

# 8. run_overlap.sh as before: the all-gather, the zerocta variant on --allgather zerocta; a
# stale reduce-scatter record in the same directory is not counted.
run overlap-ag env OVERLAP_REPEATS=1 OVERLAP_VARIANTS="kernel zerocta" EXAMPLES_MULTICAST_OFF=1 \
  "$here/run_overlap.sh" 2 "$out" --op=allgather
expect_rc 0 overlap-ag
[[ $(grep -c '^zerocta-run .*--allgather zerocta -- ' "$log") == 1 ]] ||
  fail "overlap-ag: zerocta variant not on --allgather zerocta"
[[ $(grep -c '  env NCCL_NVLS_ENABLE=0' "$log") == 2 ]] || fail "overlap-ag: multicast not off with the flag"
[[ $(json "$s" 'd["op"]') == allgather && $(json "$s" 'd["variants"]["zerocta"]["runs"]') == 1 &&
  $(json "$s" 'd["variants"]["zerocta"]["ag"]["median"]') == 5.0 ]] || fail "overlap-ag: summary"
run overlap-bad "$here/run_overlap.sh" 2 "$out" --op allreduce
expect_rc 2 overlap-bad
[[ ! -s $log ]] || fail "overlap-bad: launched something"

echo "PASS [run scripts]"
