#!/usr/bin/env python3
"""Summarizes copy_trace_inject.cc's files: per process and stream, the copies of at least
--min-bytes that started in the last --tail-ms of that stream's copies (a sweep's last loop),
their device time and the gap before each (from the end of the stream's previous copy of any
size), and the 4-byte-to-64-KiB copies in between (NCCL CE's flags are 4-byte copies).

  copy_trace_summary.py DIR [--min-bytes 1048576] [--tail-ms 200] [--ops PID,PID,...]

Prints one line per (process, stream, kind, bytes): n, device time median (p10..p90) in us,
gap before median (p10..p90) in us, the hardware channels seen, and the small copies' count.
With --ops, the processes of one collective (their GPU clocks are one timeline): each op's
copies aligned across them by start time, and per op the time from the last GPU's copy end to
the first and to the last GPU's next copy start — what the op's handshake costs — as a median
and every value sorted.
"""
import argparse
import bisect
import csv
import glob
import os
import statistics
import sys


def pct(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def load(path):
    with open(path) as f:
        return [dict(r, bytes=int(r["bytes"]), start=int(r["start_ns"]), end=int(r["end_ns"]),
                     count=int(r.get("count") or 1))
                for r in csv.DictReader(f)]


def summarize(path, min_bytes, tail_ns, out):
    rows = load(path)
    by_stream = {}
    for r in rows:
        by_stream.setdefault((r["device"], r["stream"]), []).append(r)
    pid = os.path.basename(path).split("-")[-1].split(".")[0]
    for (device, stream), rs in sorted(by_stream.items()):
        rs.sort(key=lambda r: r["start"])
        data = [r for r in rs if r["bytes"] >= min_bytes]
        if not data:
            continue
        since = data[-1]["start"] - tail_ns
        groups = {}
        prev_end = None
        small = 0
        for r in rs:
            if r["start"] >= since:
                if r["bytes"] < min_bytes:
                    small += 1
                else:
                    key = (r["kind"], r["bytes"], r["count"])
                    g = groups.setdefault(key, {"dur": [], "gap": [], "channels": set()})
                    g["dur"].append((r["end"] - r["start"]) / 1000.0)
                    if prev_end is not None:
                        g["gap"].append((r["start"] - prev_end) / 1000.0)
                    g["channels"].add(r["channel"])
            prev_end = r["end"]
        for (kind, nbytes, count), g in sorted(groups.items()):
            d, gp = g["dur"], g["gap"]
            out.write("pid %s dev %s stream %s %-6s %10d B x%d  n %4d  time %8.1f (%.1f..%.1f) us"
                      "  gap %7.1f (%.1f..%.1f) us  channels %s  small copies %d\n" % (
                          pid, device, stream, kind, nbytes, count, len(d),
                          statistics.median(d), pct(d, 0.1), pct(d, 0.9),
                          statistics.median(gp) if gp else float("nan"), pct(gp, 0.1),
                          pct(gp, 0.9), ",".join(sorted(g["channels"])), small))


def across(directory, pids, min_bytes, tail_ns, out):
    """Per op of the processes `pids`: last copy end -> next copies' first and last start."""
    traces = []
    for pid in pids:
        rows = [r for r in load(os.path.join(directory, "copy-trace-%s.csv" % pid))
                if r["bytes"] >= min_bytes]
        rows.sort(key=lambda r: r["start"])
        traces.append([(r["start"], r["end"]) for r in rows])
    if any(not t for t in traces):
        out.write("ops %s: a process has no copies of %d bytes or more\n" % (",".join(pids), min_bytes))
        return
    base = traces[0]
    since = base[-1][0] - tail_ns
    ops = []
    for s0, e0 in base:
        if s0 < since:
            continue
        row = [(s0, e0)]
        for t in traces[1:]:
            starts = [x[0] for x in t]
            i = bisect.bisect_left(starts, s0)
            j = min((j for j in (i - 1, i) if 0 <= j < len(t)), key=lambda j: abs(t[j][0] - s0))
            row.append(t[j])
        ops.append(row)
    first, last = [], []
    for a, b in zip(ops, ops[1:]):
        end = max(e for _, e in a)
        first.append((min(s for s, _ in b) - end) / 1000.0)
        last.append((max(s for s, _ in b) - end) / 1000.0)
    if not last:
        return
    out.write("ops %s: %d ops; last end -> first next start %.1f us, -> last next start %.1f us "
              "(median)\n  sorted: %s\n" % (",".join(pids), len(ops), statistics.median(first),
                                              statistics.median(last),
                                              " ".join("%.0f" % x for x in sorted(last))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--tail-ms", type=float, default=200.0)
    ap.add_argument("--ops", help="comma list of the PIDs of one collective's processes")
    a = ap.parse_args()
    if a.ops:
        across(a.dir, a.ops.split(","), a.min_bytes, int(a.tail_ms * 1e6), sys.stdout)
        return
    files = sorted(glob.glob(os.path.join(a.dir, "copy-trace-*.csv")))
    if not files:
        sys.exit("copy_trace_summary: no copy-trace-*.csv in %s" % a.dir)
    for f in files:
        summarize(f, a.min_bytes, int(a.tail_ms * 1e6), sys.stdout)


if __name__ == "__main__":
    main()
