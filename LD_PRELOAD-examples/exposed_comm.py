"""Exposed all-gather time of training steps, measured from a torch.profiler (Kineto) trace.

An all-gather costs a step only where it is on the critical path: while all-gather work runs
on the GPU and no compute kernel does. The step time alone cannot tell an all-gather that
hides behind the blocks' matmuls from one the next block waits for, and the GPU hosts have no
nsys; a Kineto trace (CUPTI activities: every kernel and copy with its stream, start and
duration) has what is needed. Standard library only: fsdp2_gpt.py runs it on each rank's
exported trace (train_common.StepProfiler), test_exposed_comm.py on synthetic ones.

Classification of the GPU activities. These are heuristics on names, categories and streams,
not knowledge of what the work belongs to:

- a kernel whose function name starts with `nccl` (`ncclDevKernel_AllGather_RING_LL`,
  `ncclKernel_AllGather_...`, NCCL's symmetric kernels) is NCCL's: `AllGather` in the name
  makes it all-gather, `ReduceScatter` reduce-scatter, anything else (AllReduce, SendRecv,
  Generic, ...) other communication;
- a kernel named `zc_chunk_sum_*` is zerocta's reduce-scatter summing the chunks its copy
  engines brought (ZEROCTA_REDUCESCATTER=auto|zerocta): reduce-scatter;
- every other kernel is compute, and a stream that runs at least one compute kernel anywhere
  in the trace is a compute stream;
- a device-to-device or peer copy (category `gpu_memcpy`, named `Memcpy DtoD (...)` or
  `Memcpy PtoP (...)`) on a stream that is not a compute stream is all-gather: that is how
  zerocta's copy-engine route appears, its copies running on streams of its own that launch
  no kernel;
- everything else (copies on compute streams, host copies, memsets) is none of these: it
  keeps the GPU from being idle but neither is an all-gather nor hides one.

Where the heuristics can be wrong: NCCL names a kernel after the first collective of its
launch, so a group mixing collectives counts under that one; any library's device copies on
a kernel-free stream (NCCL's own copy-engine collectives included) count as all-gather, and so
do the copies of zerocta's reduce-scatter route (its chunks move on the all-gather's streams;
only its summing kernels count as reduce-scatter); FSDP's
own copy-in and copy-out kernels (casts, foreach copies, split copies) are compute, even on
its all-gather streams, and hide whatever all-gather overlaps them; and zerocta's route waits
for its peers with stream memory operations, which are no activity, so a compute stream held
up by such a wait shows as idle, whereas NCCL's kernel spins while it waits and that time
counts as all-gather. Compare idle_us across runs, not only the share. Profiled steps also
run slower than unprofiled ones (CUPTI, and torch.profiler recording every CPU op): a step
bound by its kernel launches shows more idle time than it has without the profiler.

Definitions (unions of intervals, clipped to the step windows, in microseconds):

- window: the profiled steps' GPU spans, each from the first GPU activity that starts inside
  a step marker (a CPU range named STEP_MARKER) to the end of the last one, summed;
- allgather / compute / reducescatter / other_comm: the time during which at least one
  activity of that class runs;
- exposed_allgather: all-gather time during which no compute kernel runs (likewise
  exposed_reducescatter);
- idle: window time during which no GPU activity at all runs;
- exposed_allgather_share = exposed_allgather / window.
"""

import bisect
import collections
import json
import re

# The CPU range (torch.profiler.record_function) that marks one profiled step.
STEP_MARKER = "exposed_comm.step"

# One GPU activity. cat: Kineto's category (kernel, gpu_memcpy, gpu_memset); stream: anything
# hashable that tells the streams apart ((device, stream id) from a trace).
GpuEvent = collections.namedtuple("GpuEvent", "name cat stream start_us dur_us")

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
CLASSES = ("allgather", "reducescatter", "other_comm", "compute", "other")
# Summed by combine(); the share is recomputed from them.
TIMES = ("window_us", "allgather_us", "compute_us", "reducescatter_us", "other_comm_us",
         "exposed_allgather_us", "exposed_reducescatter_us", "idle_us")

_NCCL_KERNEL = re.compile(r"(?:void\s+)?(nccl\w*)")
_DEVICE_COPY = re.compile(r"Memcpy (?:DtoD|PtoP)\b")


_ZEROCTA_SUM_KERNEL = re.compile(r"(?:void\s+)?zc_chunk_sum_")


def _nccl_class(name):
    """The class of a kernel by its name if it is NCCL's (or zerocta's reduce-scatter sum),
    else None."""
    if _ZEROCTA_SUM_KERNEL.match(name):
        return "reducescatter"
    m = _NCCL_KERNEL.match(name)
    if not m:
        return None
    func = m.group(1)
    if "AllGather" in func:
        return "allgather"
    if "ReduceScatter" in func:
        return "reducescatter"
    return "other_comm"


def classify(events):
    """The class (one of CLASSES) of every event, in order; the rules are the module's."""
    compute_streams = {e.stream for e in events
                       if e.cat == "kernel" and _nccl_class(e.name) is None}
    classes = []
    for e in events:
        if e.cat == "kernel":
            classes.append(_nccl_class(e.name) or "compute")
        elif (e.cat == "gpu_memcpy" and _DEVICE_COPY.match(e.name)
              and e.stream not in compute_streams):
            classes.append("allgather")
        else:
            classes.append("other")
    return classes


def _merge(intervals):
    """Sorted, disjoint union of (start, end) intervals; empty ones dropped."""
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _intersect(a, b):
    """Intersection of two merged interval lists, merged."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(a, b):
    """a minus b, both merged interval lists; merged."""
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while s < e and k < len(b) and b[k][0] < e:
            if b[k][0] > s:
                out.append((s, b[k][0]))
            s = max(s, b[k][1])
            k += 1
        if s < e:
            out.append((s, e))
    return out


def _total(intervals):
    return sum(e - s for s, e in intervals)


def _share(exposed, window):
    return exposed / window if window > 0 else None


def analyze(events, windows=None):
    """Union and exposed times of `events` (GpuEvent) inside `windows` ([(start_us, end_us)],
    one per step; None: one window over all events). Returns a JSON-able dict: steps (number
    of windows), the TIMES in microseconds, exposed_allgather_share (None for an empty
    window) and events, the number of activities per "class/category" that overlap a window.
    """
    if windows is None:
        ends = [(e.start_us, e.start_us + e.dur_us) for e in events]
        windows = [(min(s for s, _ in ends), max(e for _, e in ends))] if ends else []
    win = _merge(windows)
    starts = [s for s, _ in win]
    spans = {c: [] for c in CLASSES}
    counts = collections.Counter()
    for e, c in zip(events, classify(events)):
        s, end = e.start_us, e.start_us + e.dur_us
        spans[c].append((s, end))
        i = bisect.bisect_right(starts, s) - 1  # the last window starting at or before s
        if (i >= 0 and s < win[i][1]) or (i + 1 < len(win) and win[i + 1][0] < end):
            counts["%s/%s" % (c, e.cat)] += 1
    union = {c: _intersect(_merge(spans[c]), win) for c in CLASSES}
    busy = _merge([iv for c in CLASSES for iv in union[c]])
    result = {
        "steps": len(windows),
        "window_us": _total(win),
        "allgather_us": _total(union["allgather"]),
        "compute_us": _total(union["compute"]),
        "reducescatter_us": _total(union["reducescatter"]),
        "other_comm_us": _total(union["other_comm"]),
        "exposed_allgather_us": _total(_subtract(union["allgather"], union["compute"])),
        "exposed_reducescatter_us": _total(_subtract(union["reducescatter"],
                                                     union["compute"])),
        "idle_us": _total(win) - _total(busy),
    }
    result = {k: (round(v, 3) if k in TIMES else v) for k, v in result.items()}
    result["exposed_allgather_share"] = _share(result["exposed_allgather_us"],
                                               result["window_us"])
    result["events"] = dict(sorted(counts.items()))
    return result


def combine(results):
    """The sums of several analyze() results (e.g. every rank's), share recomputed."""
    out = {"steps": sum(r["steps"] for r in results)}
    for k in TIMES:
        out[k] = round(sum(r[k] for r in results), 3)
    out["exposed_allgather_share"] = _share(out["exposed_allgather_us"], out["window_us"])
    counts = collections.Counter()
    for r in results:
        counts.update(r["events"])
    out["events"] = dict(sorted(counts.items()))
    return out


def events_from_trace(trace):
    """The GPU activities of a Chrome trace as Kineto exports it (a dict with traceEvents, or
    the list itself): complete events ("ph": "X") of the GPU_CATEGORIES. Kineto writes a GPU
    activity with pid = device and tid = stream."""
    raw = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [GpuEvent(ev.get("name", ""), ev["cat"], (ev.get("pid"), ev.get("tid")),
                     float(ev["ts"]), float(ev.get("dur", 0)))
            for ev in raw if ev.get("ph") == "X" and ev.get("cat") in GPU_CATEGORIES]


def step_windows(trace, events, marker=STEP_MARKER):
    """One window per CPU range named `marker` (category user_annotation): from the first of
    `events` that starts inside the range to the latest end among them. A step that ends by
    waiting for the GPU (train_common.StepTimer) has finished all its GPU work inside its
    range. Ranges with no GPU activity give no window."""
    raw = trace["traceEvents"] if isinstance(trace, dict) else trace
    ranges = sorted((float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0)))
                    for ev in raw if ev.get("ph") == "X" and ev.get("name") == marker
                    and ev.get("cat") == "user_annotation")
    by_start = sorted(events, key=lambda e: e.start_us)
    starts = [e.start_us for e in by_start]
    windows = []
    for lo, hi in ranges:
        inside = by_start[bisect.bisect_left(starts, lo):bisect.bisect_right(starts, hi)]
        if inside:
            windows.append((inside[0].start_us, max(e.start_us + e.dur_us for e in inside)))
    return windows


def analyze_trace_file(path, marker=STEP_MARKER):
    """analyze() over the step windows of an exported Chrome trace (steps 0: no marker)."""
    with open(path) as f:
        trace = json.load(f)
    events = events_from_trace(trace)
    return analyze(events, step_windows(trace, events, marker))


def describe(result):
    """One line for a log: the exposed all-gather share and time per step, and the rest."""
    steps, window = result["steps"], result["window_us"]
    if not steps or window <= 0:
        return "no profiled step with GPU activity found in the trace"

    def pct(key):
        return 100.0 * result[key] / window

    return ("exposed all-gather %.1f %% of the step (%.2f ms/step), exposed reduce-scatter "
            "%.1f %%; all-gather %.1f %%, compute %.1f %%, idle %.1f %%; %.2f ms/step "
            "profiled" % (pct("exposed_allgather_us"),
                          result["exposed_allgather_us"] / steps / 1000,
                          pct("exposed_reducescatter_us"), pct("allgather_us"),
                          pct("compute_us"), pct("idle_us"), window / steps / 1000))
