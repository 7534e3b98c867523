#!/usr/bin/env bash
# CPU test of zerocta-bench's parent side on fake GPUs (--fake-gpus: workers send synthetic
# rows, no CUDA): launcher, unique-id forwarding, barriers, LD_PRELOAD handling, tables, JSON,
# timeouts and fault handling; then tools/zerocta-plot on the JSON.
# Usage: test_fake_run.sh path/to/zerocta-bench path/to/zerocta-plot   (ZEROCTA_LIB = the shim)
set -u
BENCH=$1
PLOT=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

check() {  # check NAME CONDITION...
  local name=$1
  shift
  if "$@"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAILED: $name" >&2
  fi
}
contains() { grep -q -- "$2" "$1"; }

# 1. A clean run: every path and the contention study, JSON written and well formed.
"$BENCH" --fake-gpus 2 --quick --contention --contention-paths all --json "$TMP/ok.json" \
  >"$TMP/ok.txt" 2>&1
check "clean run exits 0" test $? -eq 0
check "clean run says OK" contains "$TMP/ok.txt" "# zerocta-bench: OK"
check "zerocta ranks load the shim" contains "$TMP/ok.txt" "zerocta 0\.1"
check "route column shows ce" grep -qE " ce$" "$TMP/ok.txt"
check "comparison table" contains "$TMP/ok.txt" "zc/kernel"
check "contention table" contains "$TMP/ok.txt" "slowdown"
check "json is complete" python3 - "$TMP/ok.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
names = [p["name"] for p in d["paths"]]
assert names == ["nccl-kernel", "nccl-ce", "zerocta", "zerocta-auto", "ceiling"], names
assert all(p["status"] == "OK" and len(p["rows"]) == 3 for p in d["paths"])
assert d["result"] == "OK" and d["machine"]["nranks"] == 2
z = d["paths"][2]["rows"][0]["out_of_place"]
assert z["routes"]["ce"] > 0 and z["routes"]["passthrough"] == 0, z
assert {c["path"] for c in d["contention"]} == {"nccl-kernel", "nccl-ce", "zerocta", "zerocta-auto", "bare-ce"}
assert all(c["status"] == "OK" and len(c["per_rank"]) == 2 for c in d["contention"])
PY

# 2. A hung path is killed at its limit, the run goes on and ends FAILED.
start=$(date +%s)
ZCB_FAKE_HANG=nccl-ce "$BENCH" --fake-gpus 4 --quick --timeout 3 --paths nccl-ce,ceiling \
  >"$TMP/hang.txt" 2>&1
rc=$?
check "hang exits 1" test $rc -eq 1
check "hang reported" contains "$TMP/hang.txt" "nccl-ce: FAILED.*timed out after 3 s"
check "next path still runs" contains "$TMP/hang.txt" "Path ceiling: OK"
check "hang costs only its limit" test $(($(date +%s) - start)) -lt 20

# 3. A crashed rank, wrong data and a zerocta fallback each fail their path.
ZCB_FAKE_CRASH=nccl-kernel "$BENCH" --fake-gpus 2 --quick --paths nccl-kernel >"$TMP/crash.txt" 2>&1
check "crash exits 1" test $? -eq 1
check "crash reported" contains "$TMP/crash.txt" "killed by signal 6"
ZCB_FAKE_WRONG=zerocta "$BENCH" --fake-gpus 2 --quick --paths zerocta >"$TMP/wrong.txt" 2>&1
check "wrong data exits 1" test $? -eq 1
check "wrong data reported" contains "$TMP/wrong.txt" "Out of bounds values : 6 FAILED"
ZCB_FAKE_FALLBACK=zerocta "$BENCH" --fake-gpus 2 --quick --paths zerocta >"$TMP/fb.txt" 2>&1
check "fallback exits 1" test $? -eq 1
check "fallback reported" contains "$TMP/fb.txt" "did not take zerocta's ce route"
ZCB_FAKE_FALLBACK=zerocta "$BENCH" --fake-gpus 2 --quick --paths zerocta --allow-fallback \
  >"$TMP/fb2.txt" 2>&1
check "--allow-fallback exits 0" test $? -eq 0

# 4. The shim is required for the zerocta paths, stripped from the others.
"$BENCH" --fake-gpus 2 --quick --paths zerocta --zerocta-lib "$TMP/none.so" >"$TMP/nolib.txt" 2>&1
check "missing shim exits 2" test $? -eq 2
check "missing shim explained" contains "$TMP/nolib.txt" "libzerocta.so not found"
LD_PRELOAD=$ZEROCTA_LIB "$BENCH" --fake-gpus 2 --quick --paths nccl-kernel >"$TMP/strip.txt" 2>&1
check "shim stripped from nccl-kernel" test $? -eq 0

# A process that reported everything but never exits is killed; the path still counts.
ZCB_FAKE_EXIT_HANG=nccl-kernel "$BENCH" --fake-gpus 2 --quick --timeout 6 --paths nccl-kernel \
  >"$TMP/exithang.txt" 2>&1
check "exit hang exits 0" test $? -eq 0
check "exit hang reported" contains "$TMP/exithang.txt" "nccl-kernel: OK.*did not exit within 2 s"

# 5. Dry run and the deadline.
"$BENCH" --fake-gpus 2 --dry-run >"$TMP/dry.txt" 2>&1
check "dry run exits 0" test $? -eq 0
check "dry run prints the plan" contains "$TMP/dry.txt" "total ~"
ZCB_FAKE_HANG=nccl-kernel "$BENCH" --fake-gpus 2 --quick --deadline 2 --paths nccl-kernel,ceiling \
  >"$TMP/deadline.txt" 2>&1
check "deadline skips later paths" contains "$TMP/deadline.txt" "Path ceiling: SKIPPED"

# 6. The plot script: PNGs where matplotlib exists, the one-line message where it does not.
PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c "import matplotlib" 2>/dev/null; then PY=$p; break; fi
done
if [ -n "$PY" ]; then
  "$PY" "$PLOT" "$TMP/ok.json" -o "$TMP/plots" >"$TMP/plot.txt" 2>&1
  check "plot exits 0" test $? -eq 0
  check "bandwidth.png written" test -s "$TMP/plots/bandwidth.png"
  check "contention.png written" test -s "$TMP/plots/contention.png"
else
  python3 "$PLOT" "$TMP/ok.json" -o "$TMP/plots" >"$TMP/plot.txt" 2>&1
  check "plot without matplotlib exits 2" test $? -eq 2
  check "plot without matplotlib says so" contains "$TMP/plot.txt" "matplotlib is not installed"
fi

echo "$pass passed, $fail failed"
test "$fail" -eq 0
