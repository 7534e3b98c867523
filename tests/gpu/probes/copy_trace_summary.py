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
and every value sorted; the op's period, its copies' device time, how far apart the processes
start them, and per process (in the order given) its device time and start. Where the tracer also wrote api-trace-PID.csv (COPY_TRACE_API=1), per op
the host's lead: the last GPU's copy end minus the latest end, over the processes, of the driver
call that issued the next op's copies (negative: a host issued them after the GPUs were done with
the op before, and the GPUs waited for it); and which driver calls were running on the hosts
while the GPUs handed over (share of handovers each call overlapped, per process).
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


def load_calls(directory, pid):
    path = os.path.join(directory, "api-trace-%s.csv" % pid)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return sorted(((r["name"], int(r["start_ns"]), int(r["end_ns"]), r["correlation"])
                       for r in csv.DictReader(f)), key=lambda c: c[1])


def host_lead(ops, calls, out):
    """ops: per op, per process (start, end, correlation); calls: per process the API calls."""
    issued = [{c[3]: c[2] for c in cs} for cs in calls]
    call_starts = [[c[1] for c in cs] for cs in calls]
    leads, during = [], [dict() for _ in calls]
    windows = 0
    for a, b in zip(ops, ops[1:]):
        end = max(x[1] for x in a)
        last_start = max(x[0] for x in b)
        ends = [issued[k].get(x[2]) for k, x in enumerate(b)]
        if all(e is not None for e in ends):
            leads.append((end - max(ends)) / 1000.0)
        windows += 1
        for k, cs in enumerate(calls):
            i = bisect.bisect_left(call_starts[k], last_start)
            seen = set()
            for name, s, e, _ in cs[max(0, i - 200):i]:
                if e >= end and s <= last_start:
                    seen.add(name)
            for name in seen:
                during[k][name] = during[k].get(name, 0) + 1
    if leads:
        out.write("  host lead (last GPU's copy end - last issue of the next op's copies): median "
                  "%.0f us, min %.0f, p10 %.0f; %d of %d ops issued late\n" % (
                      statistics.median(leads), min(leads), pct(leads, 0.1),
                      sum(1 for x in leads if x < 0), len(leads)))
    for k, d in enumerate(during):
        top = sorted(d.items(), key=lambda kv: -kv[1])[:6]
        out.write("  process %d, calls running during a handover (share of %d): %s\n" % (
            k, windows, ", ".join("%s %.0f%%" % (n, 100.0 * c / windows) for n, c in top)
            or "none"))


def across(directory, pids, min_bytes, tail_ns, out):
    """Per op of the processes `pids`: last copy end -> next copies' first and last start."""
    traces = []
    for pid in pids:
        rows = [r for r in load(os.path.join(directory, "copy-trace-%s.csv" % pid))
                if r["bytes"] >= min_bytes]
        rows.sort(key=lambda r: r["start"])
        traces.append([(r["start"], r["end"], r.get("correlation")) for r in rows])
    if any(not t for t in traces):
        out.write("ops %s: a process has no copies of %d bytes or more\n" % (",".join(pids), min_bytes))
        return
    base = traces[0]
    since = base[-1][0] - tail_ns
    trace_starts = [[x[0] for x in t] for t in traces]
    ops = []
    for s0, e0, c0 in base:
        if s0 < since:
            continue
        row = [(s0, e0, c0)]
        for t, starts in zip(traces[1:], trace_starts[1:]):
            i = bisect.bisect_left(starts, s0)
            j = min((j for j in (i - 1, i) if 0 <= j < len(t)), key=lambda j: abs(t[j][0] - s0))
            row.append(t[j])
        ops.append(row)
    first, last = [], []
    for a, b in zip(ops, ops[1:]):
        end = max(x[1] for x in a)
        first.append((min(x[0] for x in b) - end) / 1000.0)
        last.append((max(x[0] for x in b) - end) / 1000.0)
    if not last:
        return
    out.write("ops %s: %d ops; last end -> first next start %.1f us, -> last next start %.1f us "
              "(median)\n  sorted: %s\n" % (",".join(pids), len(ops), statistics.median(first),
                                              statistics.median(last),
                                              " ".join("%.0f" % x for x in sorted(last))))
    op_shape(ops, out)
    calls = [load_calls(directory, pid) for pid in pids]
    if all(c is not None for c in calls):
        host_lead(ops, calls, out)


def op_shape(ops, out):
    """Medians over the ops: the period (last copy end to the next op's), the copies' device time
    (mean and max over the processes), how far apart the processes start and end their copies,
    and per process its device time and how long after the first process it starts."""
    med = statistics.median
    period = [(max(x[1] for x in b) - max(x[1] for x in a)) / 1000.0 for a, b in zip(ops, ops[1:])]
    dur = [[(x[1] - x[0]) / 1000.0 for x in op] for op in ops]
    starts = [[(x[0] - min(y[0] for y in op)) / 1000.0 for x in op] for op in ops]
    ends = [(max(x[1] for x in op) - min(x[1] for x in op)) / 1000.0 for op in ops]
    out.write("  period %.1f us; copies %.1f us mean, %.1f max; starts %.1f us apart, ends %.1f "
              "(median)\n" % (med(period), med([statistics.mean(d) for d in dur]),
                               med([max(d) for d in dur]), med([max(s) for s in starts]),
                               med(ends)))
    out.write("  per process, copies' device time: %s us; start after the first: %s us\n" % (
        " ".join("%.1f" % med([d[k] for d in dur]) for k in range(len(ops[0]))),
        " ".join("%.1f" % med([st[k] for st in starts]) for k in range(len(ops[0])))))


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
