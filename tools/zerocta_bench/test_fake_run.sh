#!/usr/bin/env bash
# CPU test of zerocta-bench's parent side on fake GPUs (--fake-gpus: workers send synthetic
# rows and contention numbers, no CUDA): launcher, unique-id forwarding, barriers, LD_PRELOAD
# handling, every --op and its path list, init times, first ops on fresh buffers,
# --one-process and --alloc, the contention study's repeats, rotation, medians, placements,
# modes and GPU readings, tables, JSON, timeouts and fault handling; then tools/zerocta-plot on
# the JSON.
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

# A stand-in nvidia-smi on PATH, so the GPU readings around each contention run have numbers.
mkdir -p "$TMP/bin"
cat >"$TMP/bin/nvidia-smi" <<'SMI'
#!/bin/sh
echo "0, 1980, 2619, 412.35, 51"
echo "1, 1755, 2619, [N/A], 58"
SMI
chmod +x "$TMP/bin/nvidia-smi"

# 1. A clean run: every path and the contention study, JSON written and well formed.
PATH="$TMP/bin:$PATH" "$BENCH" --fake-gpus 2 --quick --contention --contention-paths all \
  --json "$TMP/ok.json" >"$TMP/ok.txt" 2>&1
check "clean run exits 0" test $? -eq 0
check "clean run says OK" contains "$TMP/ok.txt" "# zerocta-bench: OK"
check "zerocta ranks load the shim" contains "$TMP/ok.txt" "zerocta 0\.1"
check "route column shows ce" grep -qE " ce$" "$TMP/ok.txt"
check "comparison table" contains "$TMP/ok.txt" "zc/kernel"
check "first-op column" grep -qE "^#  +size .* ip-med +first-op  route$" "$TMP/ok.txt"
check "first-op unit" grep -qE "^#  +\(B\) .* \(us\) +\(ms\)$" "$TMP/ok.txt"
check "first-op value before the route" grep -qE "^ +67108864 .* [0-9]+\.[0-9]{3}  ce$" "$TMP/ok.txt"
check "first-op comparison table" contains "$TMP/ok.txt" "^# First op on each size's fresh buffers (ms"
check "nccl-ce's window registration beside the first ops" grep -qE \
  "^#  place +size +nccl-kernel .* ceiling +ce windows$" "$TMP/ok.txt"
check "contention table" contains "$TMP/ok.txt" "slowdown"
check "contention tables per placement" test "$(grep -c '^# Contention, .* all-gathers (fixed mode)' \
  "$TMP/ok.txt")" -eq 2
check "a line per contention run" test "$(grep -c '^# Contention .*, run [0-9]/3 ' "$TMP/ok.txt")" -eq 21
check "GPU readings per run" contains "$TMP/ok.txt" \
  "GPUs before -> after: GPU0 1980/2619 MHz 412 W 51 C -> 1980/2619 MHz 412 W 51 C; GPU1 1755"
check "json is complete" python3 - "$TMP/ok.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
names = [p["name"] for p in d["paths"]]
assert names == ["nccl-kernel", "nccl-policy", "zerocta-policy", "nccl-ce", "zerocta",
                 "zerocta-auto", "ceiling"], names
assert all(p["status"] == "OK" and len(p["rows"]) == 3 for p in d["paths"])
assert d["result"] == "OK" and d["machine"]["nranks"] == 2 and d["options"]["op"] == "allgather"
paths = {p["name"]: p for p in d["paths"]}
z = paths["zerocta"]["rows"][0]["out_of_place"]
assert z["routes"]["ce"] > 0 and z["routes"]["passthrough"] == 0, z
zp = paths["zerocta-policy"]["rows"][0]["out_of_place"]
assert zp["routes"]["passthrough"] > 0 and zp["routes"]["ce"] == 0, zp
# Init times: max over ranks for every NCCL path, none for the single-process ceiling.
assert paths["ceiling"]["init_ms"] is None and paths["ceiling"]["init_per_rank"] == []
for name in names[:-1]:
    p = paths[name]
    assert p["init_ms"] == max(r["init_ms"] for r in p["init_per_rank"]), p
    assert len(p["init_per_rank"]) == 2 and p["first_op_ms"] > 0, p
assert paths["zerocta"]["init_ms"] > paths["nccl-kernel"]["init_ms"] + 100  # the pool
# The first op on each size's fresh buffers: every row of every path, max over ranks, the call
# inside it; its route on the shim paths only (zerocta's ce, with the peers' imports).
for p in d["paths"]:
    for r in p["rows"]:
        assert 0 < r["first_op_call_ms"] <= r["first_op_ms"] < 100, (p["name"], r)
        assert ("first_op_routes" in r) == p["uses_shim"], (p["name"], r)
        # nccl-ce registers each size's buffers as windows before its first op (the model:
        # 2 ms and 8 ms a GiB, max over ranks); no other path has windows
        assert ("first_op_windows_ms" in r) == (p["name"] == "nccl-ce"), (p["name"], r)
        if p["name"] == "nccl-ce":
            assert abs(r["first_op_windows_ms"] - (2.0 + 8.0 * r["size"] / 2**30)) < 1e-3, r
for zr, kr in zip(paths["zerocta"]["rows"], paths["nccl-kernel"]["rows"]):
    assert zr["first_op_routes"] == {"passthrough": 0, "ce": 2, "nccl_ce": 0}, zr
    assert zr["first_op_ms"] > kr["first_op_ms"] + 1, (zr, kr)
auto = paths["zerocta-auto"]["rows"]
assert auto[0]["first_op_routes"]["passthrough"] == 2 and auto[-1]["first_op_routes"]["ce"] == 2
assert paths["nccl-policy"]["init_call"] == "ncclCommInitRankConfig"
assert paths["nccl-kernel"]["time_vs_nccl_kernel"]["median"] == 1.0
r = paths["nccl-policy"]["rows"][0]["in_place"]
k = paths["nccl-kernel"]["rows"][0]["in_place"]
assert abs(r["time_vs_nccl_kernel"] / (r["time_us"] / k["time_us"]) - 1) < 1e-4, (r, k)  # 6 digits
assert d["options"]["alloc"] == "cudamalloc" and not d["options"]["one_process"]
assert all(p["processes"] == (1 if p["name"] == "ceiling" else 2) for p in d["paths"])
assert [c["path"] for c in d["contention"]] == ["nccl-kernel", "nccl-policy", "zerocta-policy",
                                               "nccl-ce", "zerocta", "zerocta-auto", "bare-ce"]
o = d["options"]
assert o["contention_mode"] == "fixed" and o["repeats"] == 3 and o["contention_ops"] == 10
names = [c["path"] for c in d["contention"]]
for c in d["contention"]:
    assert c["status"] == "OK" and c["runs_ok"] == 3 and len(c["runs"]) == 3, c["path"]
    for run in c["runs"]:
        assert len(run["per_rank"]) == 4  # 2 ranks x 2 placements
        assert run["gpus"]["before"][0]["sm_mhz"] == 1980 and run["gpus"]["after"][1]["power_w"] is None
        # Rotated order: repeat r starts with path r.
        assert names[(run["position"] + run["repeat"]) % len(names)] == c["path"], run
    assert set(c["placements"]) == {"out_of_place", "in_place"}
    for pl in c["placements"].values():
        assert pl["runs"] == 3 and pl["ag_ops"] == [10, 10, 10]  # fixed work on every path
        for key, m in pl.items():
            if not isinstance(m, dict):
                continue
            v = sorted(m["repeats"])
            assert len(v) == 3 and m["median"] == v[1] and m["min"] == v[0] and m["max"] == v[2], key
        g = pl["gain_share"]["median"]
        assert -1 < g <= 1, (c["path"], g)
bare = {c["path"]: c for c in d["contention"]}["bare-ce"]["placements"]["out_of_place"]
kern = {c["path"]: c for c in d["contention"]}["nccl-kernel"]["placements"]["out_of_place"]
assert bare["gemm_slowdown_pct"]["median"] < kern["gemm_slowdown_pct"]["median"]
# Every repeat ran every path once, at every position once.
for rep in range(3):
    pos = sorted(r["position"] for c in d["contention"] for r in c["runs"] if r["repeat"] == rep)
    assert pos == list(range(7)), pos
PY

# 1a. One process for every GPU, cumem buffers, saturate mode, one placement; nvidia-smi missing.
PATH=/nonexistent "$BENCH" --fake-gpus 2 --quick --one-process --alloc cumem \
  --paths nccl-kernel,zerocta-policy,nccl-ce --contention-mode saturate --contention-placement in \
  --contention-paths nccl-kernel,zerocta --repeats 2 --json "$TMP/one.json" >"$TMP/one.txt" 2>&1
check "one-process run exits 0" test $? -eq 0
check "header names the allocator" contains "$TMP/one.txt" \
  "using 2 rank(s), --alloc cumem, one process drives every GPU"
check "banner names the buffers" contains "$TMP/one.txt" \
  "# buffers: cumem in 20 MiB allocations  processes: 1"
check "nccl-ce keeps its own buffers" contains "$TMP/one.txt" "# buffers: ncclMemAlloc+window"
check "only the in-place table" test "$(grep -c '^# Contention, in-place all-gathers (saturate mode)' \
  "$TMP/one.txt")" -eq 1
check "no out-of-place table" bash -c "! grep -q '^# Contention, out-of-place' '$TMP/one.txt'"
check "GPU readings unavailable" contains "$TMP/one.txt" "GPUs before -> after: unavailable"
check "one-process json" python3 - "$TMP/one.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == "OK" and d["options"]["alloc"] == "cumem" and d["options"]["one_process"]
for p in d["paths"]:
    assert p["processes"] == 1 and len({r["pid"] for r in p["ranks"]}) == 1, p
    assert p["alloc"] == ("ncclMemAlloc+window" if p["name"] == "nccl-ce" else "cumem"), p
    assert all(r["first_op_ms"] > 0 for r in p["rows"]), p
# One process: its first op's calls (one per GPU, in one group) counted once, with the first
# GPU's row.
assert all(r["first_op_routes"]["passthrough"] == 2 for r in d["paths"][1]["rows"])
assert d["paths"][1]["shim_totals"]["comms_zero_policy"] == 2
assert [c["path"] for c in d["contention"]] == ["nccl-kernel", "zerocta", "bare-ce"]
ops = {}
for c in d["contention"]:
    assert c["status"] == "OK" and list(c["placements"]) == ["in_place"], c
    assert all(r["gpus"]["before"] == "unavailable" for r in c["runs"])
    assert all(m["in_place"] for r in c["runs"] for m in r["per_rank"])
    ops[c["path"]] = c["placements"]["in_place"]["ag_ops"][0]
# Saturate mode: a faster path does more all-gathers in the same GEMM window.
assert ops["bare-ce"] > ops["zerocta"] > ops["nccl-kernel"], ops
PY

# 1b'. A contention run that dies fails its path; the other runs still give medians.
ZCB_FAKE_CRASH=zerocta "$BENCH" --fake-gpus 2 --quick --paths none --contention \
  --json "$TMP/ccrash.json" >"$TMP/ccrash.txt" 2>&1
check "contention crash exits 1" test $? -eq 1
check "contention crash reported" grep -qE "^# Contention zerocta, run 2/3 .*FAILED.*killed by signal 6" \
  "$TMP/ccrash.txt"
check "contention crash in the table" grep -qE "^   zerocta .* 2/3 FAILED repeat 2: " "$TMP/ccrash.txt"
check "contention crash json" python3 - "$TMP/ccrash.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
z = {c["path"]: c for c in d["contention"]}["zerocta"]
assert d["result"] == "FAILED" and z["status"] == "FAILED" and z["runs_ok"] == 2
assert [r["status"] for r in z["runs"]] == ["OK", "FAILED", "OK"]
assert len(z["placements"]["out_of_place"]["gemm_alone_ms"]["repeats"]) == 2
PY

# 1b. The other ops: nccl-tests sizes and busbw factors, default path lists, init times, the
# policy comparison in the output, the zerocta paths forwarding (passthrough route).
for op in allreduce reducescatter broadcast; do
  "$BENCH" --fake-gpus 4 --quick --op $op --json "$TMP/$op.json" >"$TMP/$op.txt" 2>&1
  check "$op run exits 0" test $? -eq 0
  check "$op prints init times" grep -qE "^# init: max over ranks [0-9.]+ ms, first op [0-9.]+ ms" \
    "$TMP/$op.txt"
  check "$op prints time ratios" contains "$TMP/$op.txt" "Time of each path / time of nccl-kernel"
  check "$op prints the policy change" grep -qE "^#   nccl-policy +\+1\.0 %" "$TMP/$op.txt"
  check "$op compares init" grep -qE "^#   zerocta-policy +[0-9.]+ +\+[0-9.]+ " "$TMP/$op.txt"
  check "$op json" python3 - "$TMP/$op.json" $op <<'PY'
import json, sys
d, op = json.load(open(sys.argv[1])), sys.argv[2]
assert d["result"] == "OK" and d["options"]["op"] == op
assert [p["name"] for p in d["paths"]] == ["nccl-kernel", "nccl-policy", "zerocta-policy"]
factor = {"allreduce": 1.5, "reducescatter": 0.75, "broadcast": 1.0}[op]  # 4 ranks
for p in d["paths"]:
    assert p["status"] == "OK" and len(p["rows"]) == 3, p
    assert p["init_ms"] > 0 and p["first_op_ms"] > 0 and len(p["init_per_rank"]) == 4, p
    assert all(0 < r["first_op_ms"] < p["first_op_ms"] for r in p["rows"]), p
    for r in p["rows"]:
        for place in ("out_of_place", "in_place"):
            x = r[place]
            assert abs(x["busbw_gbps"] - x["algbw_gbps"] * factor) < 1e-4 * x["busbw_gbps"], x
            assert abs(x["algbw_gbps"] - r["size"] / x["time_us"] / 1e3) < 1e-4 * x["algbw_gbps"], x
        # nccl-tests' count column: per-rank output elements (reducescatter) or the buffer.
        assert r["count"] * 4 * (4 if op == "reducescatter" else 1) == r["size"], r
zp = d["paths"][2]
assert zp["zerocta_allgather"] == "nccl" and zp["uses_shim"]
assert zp["shim_totals"]["comms_zero_policy"] == 4 and zp["shim_totals"]["routes"]["passthrough"] > 0
assert d["paths"][1]["init_call"] == "ncclCommInitRankConfig"
assert d["paths"][0]["init_call"] == "ncclCommInitRank" and zp["init_call"] == "ncclCommInitRank"
assert 1.0 < d["paths"][1]["time_vs_nccl_kernel"]["median"] < 1.02
PY
done
check "allreduce redop column" grep -qE "^ +1048576 +262144 +float +sum +-1 " "$TMP/allreduce.txt"
check "broadcast root column" grep -qE "^ +1048576 +262144 +float +none +0 " "$TMP/broadcast.txt"
check "reducescatter count column" grep -qE "^ +1048576 +65536 +float +sum +-1 " \
  "$TMP/reducescatter.txt"
"$BENCH" --fake-gpus 2 --quick --op allreduce --paths all --json "$TMP/arall.json" \
  >"$TMP/arall.txt" 2>&1
check "allreduce on every path exits 0" test $? -eq 0
check "zerocta forwards all-reduces" python3 - "$TMP/arall.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
names = [p["name"] for p in d["paths"]]
assert names == ["nccl-kernel", "nccl-policy", "zerocta-policy", "zerocta", "zerocta-auto"], names
for p in d["paths"][3:]:
    assert p["status"] == "OK", p
    assert all(r[pl]["routes"]["ce"] == 0 and r[pl]["routes"]["passthrough"] > 0
               for r in p["rows"] for pl in ("out_of_place", "in_place")), p
PY

# 1c. Paths that make no sense for an op are usage errors, and so is --contention with one.
"$BENCH" --fake-gpus 2 --quick --op allreduce --paths nccl-kernel,nccl-ce >"$TMP/u1.txt" 2>&1
check "nccl-ce with allreduce exits 2" test $? -eq 2
check "nccl-ce with allreduce explained" contains "$TMP/u1.txt" \
  'path "nccl-ce" does not apply to --op allreduce'
"$BENCH" --fake-gpus 2 --quick --paths ceiling --op broadcast >"$TMP/u2.txt" 2>&1
check "ceiling with broadcast exits 2" test $? -eq 2
"$BENCH" --fake-gpus 2 --quick --op allreduce --contention >"$TMP/u3.txt" 2>&1
check "contention with allreduce exits 2" test $? -eq 2
check "contention with allreduce explained" contains "$TMP/u3.txt" \
  "measures all-gathers and reduce-scatters"
"$BENCH" --fake-gpus 2 --quick --op reducescatter --dtype int32 >"$TMP/u5.txt" 2>&1
check "reducescatter of int32 exits 2" test $? -eq 2
check "reducescatter types explained" contains "$TMP/u5.txt" "float, bf16 or half"
"$BENCH" --fake-gpus 2 --quick --redop avg >"$TMP/u6.txt" 2>&1
check "--redop avg with allgather exits 2" test $? -eq 2
"$BENCH" --fake-gpus 2 --quick --op reducescatter --contention-paths nccl-ce >"$TMP/u7.txt" 2>&1
check "nccl-ce under reduce-scatter contention exits 2" test $? -eq 2
"$BENCH" --fake-gpus 2 --quick --paths sum-kernel >"$TMP/u8.txt" 2>&1
check "sum-kernel with allgather exits 2" test $? -eq 2
"$BENCH" --fake-gpus 2 --quick --op reducescatter --redop premul --paths sum-kernel \
  >"$TMP/u9.txt" 2>&1
check "sum-kernel with --redop premul exits 2" test $? -eq 2
check "sum-kernel with --redop premul explained" contains "$TMP/u9.txt" \
  'path "sum-kernel" does not apply to --op reducescatter --redop premul'

# 1c'. Reduce-scatter: every path with its floors, bf16 average, the contention study of
# reduce-scatters; ZEROCTA_REDUCESCATTER reaches the shim paths, zerocta must take ce.
PATH="$TMP/bin:$PATH" "$BENCH" --fake-gpus 2 --quick --op reducescatter --paths all --dtype bf16 \
  --redop avg --rs-ctas 8 --contention --json "$TMP/rs.json" >"$TMP/rs.txt" 2>&1
check "reducescatter with floors exits 0" test $? -eq 0
check "reducescatter banner names dtype and redop" contains "$TMP/rs.txt" "^# dtype bf16  redop avg  check:"
check "reducescatter shim env in the banner" contains "$TMP/rs.txt" \
  "ZEROCTA_ALLGATHER=zerocta, ZEROCTA_REDUCESCATTER=zerocta$"
check "reducescatter maxdiff column" grep -qE "^# +size .* ip-med +maxdiff +first-op  route$" \
  "$TMP/rs.txt"
check "reducescatter row: avg, maxdiff, ce" grep -qE \
  "^ +67108864 +16777216 +bf16 +avg +-1 .* 7\.81e-03 +[0-9.]+  ce$" "$TMP/rs.txt"
check "reducescatter floor comparison" contains "$TMP/rs.txt" "busbw in % of bare-ce"
check "reducescatter contention table" contains "$TMP/rs.txt" \
  "^# Contention, in-place reduce-scatters (fixed mode)"
check "reducescatter json" python3 - "$TMP/rs.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
o = d["options"]
assert d["result"] == "OK" and o["op"] == "reducescatter" and o["redop"] == "avg", o
assert o["dtype"] == "bf16" and o["rs_ctas"] == 8 and o["contention_op"] == "reducescatter", o
names = [p["name"] for p in d["paths"]]
assert names == ["nccl-kernel", "nccl-policy", "zerocta-policy", "zerocta", "zerocta-auto",
                 "bare-ce", "sum-kernel"], names
paths = {p["name"]: p for p in d["paths"]}
for p in d["paths"]:
    assert p["status"] == "OK" and len(p["rows"]) == 3, p["name"]
    for r in p["rows"]:
        assert r["type"] == "bf16" and r["redop"] == "avg" and r["count"] * 2 * 2 == r["size"], r
        for pl in ("out_of_place", "in_place"):
            x = r[pl]
            assert x["wrong"] == 0, (p["name"], x)
            assert abs(x["busbw_gbps"] - x["algbw_gbps"] * 0.5) < 1e-4 * x["busbw_gbps"], x
            if p["name"] == "bare-ce":  # the pushes alone: nothing summed
                assert x["maxdiff"] is None, x
            else:
                assert 0 < x["maxdiff"] < 0.1, (p["name"], x)
        if p["name"] != "bare-ce":
            assert r["maxdiff"] == max(r["out_of_place"]["maxdiff"], r["in_place"]["maxdiff"])
assert paths["zerocta"]["zerocta_reducescatter"] == "zerocta"
assert paths["zerocta-auto"]["zerocta_reducescatter"] == "auto"
assert paths["zerocta-policy"]["zerocta_reducescatter"] == "nccl"
assert "zerocta_reducescatter" not in paths["nccl-kernel"]
z = paths["zerocta"]
assert all(r[pl]["routes"]["ce"] > 0 and r[pl]["routes"]["passthrough"] == 0
           for r in z["rows"] for pl in ("out_of_place", "in_place")), z
assert z["shim_totals"]["routes"]["passthrough"] == 0
auto = paths["zerocta-auto"]["rows"]
assert auto[0]["first_op_routes"]["passthrough"] == 2 and auto[-1]["first_op_routes"]["ce"] == 2
for name in ("bare-ce", "sum-kernel"):
    assert paths[name]["processes"] == 1 and paths[name]["init_ms"] is None, name
assert paths["sum-kernel"]["alloc"] == "cudamalloc (one GPU)"
cont = {c["path"]: c for c in d["contention"]}
assert list(cont) == ["nccl-kernel", "zerocta", "bare-ce"], list(cont)
for c in cont.values():
    assert c["status"] == "OK" and c["runs_ok"] == 3 and c["op"] == "reducescatter", c["path"]
    for pl in c["placements"].values():
        assert pl["ag_ops"] == [10, 10, 10]
        v = sorted(pl["gain_share"]["repeats"])
        assert pl["gain_share"]["median"] == v[1] and pl["gain_share"]["min"] == v[0]
zr = cont["zerocta"]["runs"][0]["per_rank"][0]["routes"]
assert zr["ce"] > 0 and zr["passthrough"] == 0, zr
assert d["options"]["contention_bytes"] == 512 * 2**20
PY
# A pre-multiplied sum (premul-dev: the scalar in device memory): every path but sum-kernel.
PATH="$TMP/bin:$PATH" "$BENCH" --fake-gpus 2 --quick --op reducescatter --paths all \
  --redop premul-dev --json "$TMP/premul.json" >"$TMP/premul.txt" 2>&1
check "reducescatter premul-dev exits 0" test $? -eq 0
check "premul-dev banner names the reference" contains "$TMP/premul.txt" \
  "^# dtype float  redop premul-dev  check: .*float64 sum of each rank's input times its scalar"
check "premul-dev json" python3 - "$TMP/premul.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["result"] == "OK" and d["options"]["redop"] == "premul-dev", d["options"]
names = [p["name"] for p in d["paths"]]
assert names == ["nccl-kernel", "nccl-policy", "zerocta-policy", "zerocta", "zerocta-auto",
                 "bare-ce"], names
assert all(r["redop"] == "premul-dev" for p in d["paths"] for r in p["rows"])
PY
ZCB_FAKE_FALLBACK=zerocta "$BENCH" --fake-gpus 2 --quick --op reducescatter --paths zerocta \
  >"$TMP/rsfb.txt" 2>&1
check "reducescatter fallback exits 1" test $? -eq 1
check "reducescatter fallback reported" contains "$TMP/rsfb.txt" \
  "reduce-scatters did not take zerocta's ce route"
ZCB_FAKE_WRONG=sum-kernel "$BENCH" --fake-gpus 2 --quick --op reducescatter --paths sum-kernel \
  >"$TMP/rswrong.txt" 2>&1
check "sum-kernel wrong data exits 1" test $? -eq 1
check "sum-kernel wrong data reported" contains "$TMP/rswrong.txt" "Path sum-kernel: FAILED"
"$BENCH" --fake-gpus 2 --op alltoall >"$TMP/u4.txt" 2>&1
check "unknown op exits 2" test $? -eq 2

# 1d. zerocta-policy fails when the shim did not give a communicator the zero-CTA policy.
ZCB_FAKE_NO_POLICY=zerocta-policy "$BENCH" --fake-gpus 2 --quick --op allreduce \
  >"$TMP/nopol.txt" 2>&1
check "missing policy exits 1" test $? -eq 1
check "missing policy reported" contains "$TMP/nopol.txt" \
  "zerocta-policy: FAILED.*0 of 2 communicators.*NCCL_CTA_POLICY_ZERO"
check "other paths still OK" contains "$TMP/nopol.txt" "Path nccl-policy: OK"

# 1e. --rounds: the path set again in rotated order, every round in the JSON, and the table of
# each path's busbw and its ratio to nccl-ce paired by round.
"$BENCH" --fake-gpus 2 --quick --paths nccl-ce,zerocta --rounds 3 --json "$TMP/rounds.json" \
  >"$TMP/rounds.txt" 2>&1
check "rounds run OK" test $? -eq 0
check "rounds banner" contains "$TMP/rounds.txt" "^# round 3 of 3"
check "rounds table" contains "$TMP/rounds.txt" "^# Rounds: 3 runs of the path set"
check "rounds ratio column" contains "$TMP/rounds.txt" "zerocta  x/nccl-ce  >="
check "rounds rows" contains "$TMP/rounds.txt" "^ *ip  .*|  .*(.*\.\..*)  [0-3]/3$"
python3 - "$TMP/rounds.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["options"]["rounds"] == 3, d["options"]
runs = [(p["name"], p["round"]) for p in d["paths"]]
assert sorted(runs) == sorted((n, r) for n in ("nccl-ce", "zerocta") for r in range(3)), runs
assert [n for n, r in runs if r == 1][0] == "zerocta", runs  # round 2 starts with the second path
PY
check "rounds JSON" test $? -eq 0

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
ZCB_FAKE_FIRST_FALLBACK=zerocta "$BENCH" --fake-gpus 2 --quick --paths zerocta >"$TMP/fb3.txt" 2>&1
check "first-op fallback exits 1" test $? -eq 1
check "first-op fallback reported" contains "$TMP/fb3.txt" \
  "Path zerocta: FAILED .*: 2 all-gathers did not take zerocta's ce route"
check "first-op fallback in the route column" grep -qE "^ +1048576 .*  ce first:passthrough$" \
  "$TMP/fb3.txt"

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

# 5b. --multicast-off: multicast off, printed; without it, nothing set.
"$BENCH" --fake-gpus 2 --quick --paths nccl-kernel --multicast-off >"$TMP/th.txt" 2>&1
check "--multicast-off run exits 0" test $? -eq 0
check "--multicast-off prints what it sets" contains "$TMP/th.txt" \
  "# --multicast-off: every worker runs with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1"
check "no --multicast-off line by default" bash -c "! grep -q -- '--multicast-off' '$TMP/ok.txt'"
"$BENCH" --help >"$TMP/help.txt" 2>&1
for p in nccl-kernel nccl-policy zerocta-policy nccl-ce zerocta zerocta-auto ceiling bare-ce \
  sum-kernel; do
  check "--help lists $p" grep -qE "^  $p " "$TMP/help.txt"
done

# 5c. -g N or --procs N without a GPU is an error (exit 2), not "nothing to measure" (only
# checkable here when this machine has no GPU).
"$BENCH" --dry-run >"$TMP/nogpu.txt" 2>&1
if grep -q "no GPU found" "$TMP/nogpu.txt"; then
  "$BENCH" -g 2 >"$TMP/g2.txt" 2>&1
  check "-g 2 without a GPU exits 2" test $? -eq 2
  check "-g 2 without a GPU explained" contains "$TMP/g2.txt" "-g 2 but only 0 GPU(s) visible"
  "$BENCH" --procs 2 >"$TMP/p2.txt" 2>&1
  check "--procs 2 without a GPU exits 2" test $? -eq 2
  check "--procs 2 without a GPU explained" contains "$TMP/p2.txt" "--procs 2 but only 0 GPU(s) visible"
fi
# 5d. -t means threads per process, as in nccl-tests: only 1 here, with a reason.
"$BENCH" --fake-gpus 2 -t 2 >"$TMP/t2.txt" 2>&1
check "-t 2 is a usage error" test $? -eq 2
check "-t 2 says why" contains "$TMP/t2.txt" "threads per process, as in nccl-tests"

# 6. The plot script: a style of its own for every path, then PNGs where matplotlib exists,
# the one-line message where it does not.
check "every path has its own colour" python3 - "$PLOT" "$TMP/ok.json" <<'PY'
import importlib.machinery, importlib.util, json, sys
loader = importlib.machinery.SourceFileLoader("zerocta_plot", sys.argv[1])
spec = importlib.util.spec_from_loader("zerocta_plot", loader)
plot = importlib.util.module_from_spec(spec)
loader.exec_module(plot)
d = json.load(open(sys.argv[2]))
names = {p["name"] for p in d["paths"]} | {c["path"] for c in d["contention"]}
assert names <= set(plot.PATH_STYLE), names - set(plot.PATH_STYLE)
colors = [s["color"] for s in plot.PATH_STYLE.values()]
assert len(set(colors)) == len(colors), colors
styles = [(s["color"], s.get("marker"), s.get("linestyle")) for s in
          [plot.style_for("new-%d" % i) for i in range(24)] + list(plot.PATH_STYLE.values())]
assert len(set(styles)) == len(styles), styles
# The contention panels: every path per placement, median inside min..max.
series = plot.contention_series(d)
assert set(series) == {"out_of_place", "in_place"}, series
for place, rows in series.items():
    assert [n for n, _ in rows] == [c["path"] for c in d["contention"]], rows
    for _, row in rows:
        for key, (med, lo, hi) in row.items():
            assert lo <= med <= hi, (place, key, med, lo, hi)
PY
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
