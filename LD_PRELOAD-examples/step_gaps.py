"""Why the compute stream of a profiled step goes idle: waiting for the host, or for other work.

    python3 step_gaps.py TRACE.json [TRACE.json ...]

Reads the Kineto traces fsdp2_gpt.py keeps (--profile-steps N --keep-trace) and, per trace,
walks the compute stream (the one that runs the most kernel time) through the profiled steps
(exposed_comm.STEP_MARKER). Every gap of at least 20 us between two of its activities is put
down to one of two causes, by when the activity that ends the gap was launched:

- host: it was launched less than 20 us before it started, so the stream waited for the CPU.
  The gap is charged to the CPU operations that ran on the launching thread between the gap's
  start and the launch (the outermost ones, by name), which says whose host time it was;
- wait: it was launched earlier and waited for another stream (an all-gather, a
  reduce-scatter). The gap is charged to the class (exposed_comm.classify) of the activity on
  another stream that ended last before the gap's end, which says whose work it waited for.

Prints, per trace, the gap time per step by cause and the largest charges, and, for the
all-gathers (CPU ops whose name holds "all_gather"), their host time per call. Standard library
only: it runs on the GPU hosts beside the traces.
"""

import bisect
import collections
import gzip
import json
import sys

import exposed_comm

MIN_GAP_US = 20.0
LAUNCH_SLACK_US = 20.0
LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaMemsetAsync", "cudaLaunchCooperativeKernel")


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def complete(raw, cat):
    return [ev for ev in raw if ev.get("ph") == "X" and ev.get("cat") == cat]


def outermost(ops, lo, hi):
    """Time per name of the outermost CPU ops of one thread inside [lo, hi] (clipped)."""
    spans = sorted((float(o["ts"]), float(o["ts"]) + float(o.get("dur", 0)), o["name"])
                   for o in ops if float(o["ts"]) < hi and float(o["ts"]) + float(o.get("dur", 0)) > lo)
    out = collections.Counter()
    end = lo
    for s, e, name in spans:
        if e <= end:
            continue  # nested in an op already charged
        s = max(s, end, lo)
        e2 = min(e, hi)
        if e2 > s:
            out[name] += e2 - s
        end = max(end, e)
    return out


def analyze(raw):
    """The gaps of the compute stream in the profiled steps of `raw` (a trace's events): a dict
    with steps, host_us / wait_us / unknown_us (sums), host (CPU op name -> us), waited
    ("class: name" -> us), cpu_ops (all-gather CPU op name -> durations) and compute_stream."""
    events = exposed_comm.events_from_trace(raw)
    windows = exposed_comm.step_windows(raw, events)
    classes = exposed_comm.classify(events)
    kernel_time = collections.Counter()
    for e, c in zip(events, classes):
        if e.cat == "kernel" and c == "compute":
            kernel_time[e.stream] += e.dur_us
    compute = kernel_time.most_common(1)[0][0] if kernel_time else None
    # The launch of each GPU activity, by correlation id.
    gpu_corr = {}
    for ev in raw:
        if ev.get("ph") == "X" and ev.get("cat") in exposed_comm.GPU_CATEGORIES:
            corr = ev.get("args", {}).get("correlation")
            if corr is not None:
                gpu_corr[(float(ev["ts"]), (ev.get("pid"), ev.get("tid")))] = corr
    launches = {}
    for ev in complete(raw, "cuda_runtime") + complete(raw, "cuda_driver"):
        corr = ev.get("args", {}).get("correlation")
        if corr is not None:
            launches[corr] = (float(ev["ts"]), ev.get("tid"))
    cpu_ops = collections.defaultdict(list)
    for ev in raw:
        if ev.get("ph") == "X" and ev.get("cat") in ("cpu_op", "user_annotation") \
                and ev.get("name") != exposed_comm.STEP_MARKER:
            cpu_ops[ev.get("tid")].append(ev)

    mine = sorted((e for e in events if e.stream == compute), key=lambda e: e.start_us)
    others = sorted(((e.start_us + e.dur_us, c, e.name) for e, c in zip(events, classes)
                     if e.stream != compute), key=lambda t: t[0])
    other_ends = [t[0] for t in others]
    host = collections.Counter()
    waited = collections.Counter()
    totals = collections.Counter()
    for lo, hi in windows:
        end = None
        for e in (e for e in mine if lo <= e.start_us <= hi):
            if end is not None and e.start_us - end >= MIN_GAP_US:
                gap = e.start_us - end
                launch = launches.get(gpu_corr.get((e.start_us, e.stream)))
                if launch and launch[0] > e.start_us - LAUNCH_SLACK_US:
                    totals["host"] += gap
                    charged = outermost(cpu_ops.get(launch[1], []), end, launch[0])
                    host.update(charged)
                    unclaimed = gap - sum(charged.values())
                    if unclaimed > 0:
                        host["(no CPU op)"] += unclaimed
                else:
                    totals["wait" if launch else "unknown"] += gap
                    i = bisect.bisect_right(other_ends, e.start_us) - 1
                    waited["%s: %s" % (others[i][1], others[i][2][:60]) if i >= 0 else "?"] += gap
            end = max(end or 0, e.start_us + e.dur_us)
    ag = collections.defaultdict(list)
    for ops in cpu_ops.values():
        for o in ops:
            if "all_gather" in o["name"] and any(lo <= float(o["ts"]) <= hi for lo, hi in windows):
                ag[o["name"]].append(float(o.get("dur", 0)))
    return {"steps": len(windows), "compute_stream": compute, "host_us": totals["host"],
            "wait_us": totals["wait"], "unknown_us": totals["unknown"], "host": dict(host),
            "waited": dict(waited), "cpu_ops": dict(ag)}


def report(path, r):
    """Prints `r` (analyze's) for the trace at `path`."""
    steps = max(r["steps"], 1)
    print("== %s: %d steps, compute stream %s" % (path, r["steps"], r["compute_stream"]))
    print("   compute-stream gaps >= %.0f us per step: host %.2f ms, wait %.2f ms, unknown %.2f ms"
          % (MIN_GAP_US, r["host_us"] / steps / 1e3, r["wait_us"] / steps / 1e3,
             r["unknown_us"] / steps / 1e3))
    for name, t in collections.Counter(r["host"]).most_common(8):
        print("   host  %7.2f ms/step  %s" % (t / steps / 1e3, name[:90]))
    for name, t in collections.Counter(r["waited"]).most_common(8):
        print("   wait  %7.2f ms/step  %s" % (t / steps / 1e3, name[:90]))
    for name, durs in sorted(r["cpu_ops"].items()):
        durs = sorted(durs)
        print("   CPU op %s: %d in the steps, median %.0f us, max %.0f us, sum %.2f ms/step"
              % (name[:60], len(durs), durs[len(durs) // 2], durs[-1], sum(durs) / steps / 1e3))


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for path in argv[1:]:
        report(path, analyze(load(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
