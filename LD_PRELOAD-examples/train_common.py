"""What the training examples (fsdp2_gpt.py, ddp.py) share: environment and determinism
settings, process-group start-up, per-step timing, exact loss bits, a parameter checksum,
profiling of the last steps for their exposed communication, and the JSON record that
compare_runs.py reads.

Import this module before torch: it sets the environment variables that must be in place
before CUDA, cuBLAS and NCCL initialise.
"""

import argparse
import contextlib
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile

# cuBLAS is deterministic only with a fixed workspace configuration, read when its first
# handle is created; torch.use_deterministic_algorithms(True) refuses matmuls without it.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.utils.deterministic  # noqa: E402,F401  (fill_uninitialized_memory lives here)

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import exposed_comm  # noqa: E402
import gpt_model  # noqa: E402
import zerocta_stats  # noqa: E402


def set_determinism(mode):
    """mode: strict (error on a non-deterministic op), warn (warn only), off.

    strict matters for attention: with warn_only=True PyTorch keeps flash attention's
    backward on its non-deterministic (atomic) algorithm; only strict mode switches it to the
    deterministic one. The uninitialised-memory fill that deterministic mode adds to every
    torch.empty is turned off: it costs a memset per buffer (timings) and changes no result
    of a correct program.
    """
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if mode != "off":
        torch.use_deterministic_algorithms(True, warn_only=(mode == "warn"))
        torch.utils.deterministic.fill_uninitialized_memory = False


def init_distributed():
    """init_process_group with device_id (PyTorch creates the NCCL communicator at once).
    Returns (rank, world, device)."""
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl", device_id=device)
    return dist.get_rank(), dist.get_world_size(), device


def loss_bits(loss):
    """The fp32 loss tensor's own 4 bytes as an unsigned integer (bitwise comparable)."""
    assert loss.dtype == torch.float32 and loss.numel() == 1
    return loss.detach().reshape(1).view(torch.int32).item() & 0xFFFFFFFF


class StepTimer:
    """Times one step on the current stream with CUDA events.

    Everything a step does (FSDP's all-gather and reduce-scatter streams included) is joined
    back into the current stream before the optimizer step returns, so the end event marks
    the end of the whole step. stop() waits for the event: steps do not overlap.
    """

    def __init__(self):
        self.start_ev = torch.cuda.Event(enable_timing=True)
        self.end_ev = torch.cuda.Event(enable_timing=True)

    def start(self):
        self.start_ev.record()

    def stop(self):
        """Milliseconds since start()."""
        self.end_ev.record()
        self.end_ev.synchronize()
        return self.start_ev.elapsed_time(self.end_ev)


class StepProfiler:
    """Profiles steps [first, first + count) with torch.profiler and measures their exposed
    communication from the exported trace (exposed_comm.py).

    CPU activity is recorded as well as CUDA: the step markers (record_function) that delimit
    the steps in the trace are CPU ranges. The profiler only observes, so the steps compute
    exactly what they would without it, but they run slower (CUPTI, and the recording of every
    CPU op); timing_summary leaves them out. The trace goes next to the record (--out:
    NAME.trace-rankR.json) or into the temporary directory, and is deleted after the analysis
    unless keep.
    """

    def __init__(self, first, count, out, rank, keep):
        self.first, self.count, self.keep = first, count, keep
        stem = (os.path.splitext(os.path.abspath(out))[0] if out else
                os.path.join(tempfile.gettempdir(), "profile-%d" % os.getpid()))
        self.trace_path = "%s.trace-rank%d.json" % (stem, rank)
        self.result = None  # exposed_comm.analyze's dict, after the last profiled step
        self._prof = None

    def profiled(self, step):
        return self.first <= step < self.first + self.count

    def step(self, step):
        """A context for the timed part of `step`: a marked range while profiling, nothing
        outside the profiled steps."""
        return self._profile(step) if self.profiled(step) else contextlib.nullcontext()

    @contextlib.contextmanager
    def _profile(self, step):
        if step == self.first:
            self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                            torch.profiler.ProfilerActivity.CUDA])
            self._prof.start()
        with torch.profiler.record_function(exposed_comm.STEP_MARKER):
            yield
        if step == self.first + self.count - 1:
            self._prof.stop()
            self._prof.export_chrome_trace(self.trace_path)
            self.result = exposed_comm.analyze_trace_file(self.trace_path)
            if not self.keep:
                os.remove(self.trace_path)

    def rank_result(self):
        """This rank's analysis, with the path of its trace if it was kept (else null)."""
        return dict(self.result, trace=self.trace_path if self.keep else None)

    def record(self, per_rank):
        """The record's "profile": the steps, every rank's result and all ranks combined."""
        return {"steps": [self.first, self.first + self.count - 1], "ranks": per_rank,
                "all_ranks": exposed_comm.combine(per_rank)}


# Odd multipliers: a multiplication by an odd number is invertible modulo 2**64, so changing
# any one element always changes its term, and thus the sum.
_CHUNK = 1 << 24


def params_checksum(tensors):
    """Hex digest over the exact bits of `tensors`, computed on the GPU.

    Per chunk: sum of bits(x_i) * w_i with odd weights w_i, in int64 (wrapping). Integer
    addition is associative, so the sum does not depend on the reduction order; the chunk sums
    are then hashed on the host. Costs one small copy per 16M elements instead of moving
    gigabytes of parameters to the host.
    """
    h = hashlib.sha256()
    for t in tensors:
        flat = t.detach().reshape(-1)
        if flat.element_size() == 4:
            bits = flat.view(torch.int32)
        elif flat.element_size() == 2:
            bits = flat.view(torch.int16)
        else:
            raise TypeError("params_checksum: unsupported dtype %s" % t.dtype)
        sums = []
        for off in range(0, bits.numel(), _CHUNK):
            part = bits[off:off + _CHUNK].to(torch.int64)
            w = torch.arange(off, off + part.numel(), dtype=torch.int64, device=part.device)
            w = w * 2654435761 * 2 + 1
            sums.append((part * w).sum())
        h.update(str(list(t.shape)).encode())
        if sums:
            h.update(repr(torch.stack(sums).tolist()).encode())  # exact Python ints
    return h.hexdigest()[:16]


def gather_from_ranks(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank (small Python objects)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def zerocta_record():
    """zerocta's in-process counters as JSON-able data, or None when it is not loaded."""
    snap = zerocta_stats.snapshot()
    if snap is None:
        return None
    rec = {k: v for k, v in snap.items() if k != "counters"}
    rec["version"] = zerocta_stats.version()
    rec["counters"] = {"%s/%s" % key: {"calls": c, "bytes": b}
                       for key, (c, b) in sorted(snap["counters"].items())}
    return rec


def timing_summary(step_ms, warmup, profiled=0):
    """Median/min/max of the steps after `warmup` and before the last `profiled` ones (each
    the slowest rank's time)."""
    timed = step_ms[warmup:len(step_ms) - profiled]
    if not timed:
        return {"timed_steps": 0}
    return {"timed_steps": len(timed), "median_step_ms": statistics.median(timed),
            "min_step_ms": min(timed), "max_step_ms": max(timed)}


def environment_record():
    """Versions and the settings that change NCCL's or zerocta's behaviour."""
    keys = sorted(k for k in os.environ
                  if k.startswith(("ZEROCTA_", "NCCL_", "TORCH_NCCL_", "TORCH_SYMM_MEM"))
                  or k in ("LD_PRELOAD", "CUBLAS_WORKSPACE_CONFIG"))
    nccl = torch.cuda.nccl.version()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "device": torch.cuda.get_device_name(),
        "python": sys.version.split()[0],
        "env": {k: os.environ[k] for k in keys},
    }


def write_json(path, record):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)  # a reader never sees half a file


def common_args(description, steps, warmup):
    """The options every training example takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps, help="total steps, warm-up included")
    p.add_argument("--warmup", type=int, default=warmup, help="first steps left out of timing")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--deterministic", choices=["strict", "warn", "off"], default="strict")
    p.add_argument("--out", help="JSON record (written by rank 0)")
    return p


def train(model, opt, cfg, args, rank, world, device, autocast_dtype=None, profiler=None):
    """args.steps steps of next-token prediction on synthetic_batch data, the steps of
    `profiler` (a StepProfiler) profiled.

    Returns (loss bits, loss values, step times in ms) of this rank. Rank 0 prints every step.
    """
    timer = StepTimer()
    bits, values, step_ms = [], [], []
    amp = (torch.autocast("cuda", dtype=autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    # Flash attention only: deterministic in backward under strict mode, and the same kernel
    # in every run (no backend choice left to heuristics).
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for step in range(args.steps):
            x, y = gpt_model.synthetic_batch(step, rank, world, cfg["batch"], cfg["seq"],
                                             cfg["vocab"], args.seed, device)
            opt.zero_grad(set_to_none=True)
            with profiler.step(step) if profiler else contextlib.nullcontext():
                timer.start()
                with amp:
                    logits = model(x)
                loss = gpt_model.lm_loss(logits, y)
                loss.backward()
                opt.step()
                ms = timer.stop()
            bits.append(loss_bits(loss))
            values.append(loss.item())
            step_ms.append(ms)
            if rank == 0:
                note = ("  (warm-up)" if step < args.warmup else
                        "  (profiled)" if profiler and profiler.profiled(step) else "")
                print("step %3d loss %r bits %08x %9.2f ms%s" %
                      (step, values[-1], bits[-1], ms, note), flush=True)
    return bits, values, step_ms


def report(script, args, cfg, header, local_tensors, bits, values, step_ms, rank, device,
           profiler=None):
    """Gathers every rank's results, prints the summary (rank 0), writes args.out (rank 0).

    header: script-specific fields of the record (name, precision, params, ...).
    local_tensors: this rank's parameters (its shards under FSDP) for the checksum.
    profiler: the StepProfiler train() ran with, if any: its steps are left out of the timing
    and the record's "profile" holds every rank's analysis (else null).
    Returns the exit status: 1 if any rank saw a non-finite loss.
    """
    zerocta = zerocta_record()  # before the gathers below add their own NCCL calls
    checksum = params_checksum(local_tensors)
    per_rank = gather_from_ranks({
        "losses_hex": ["%08x" % b for b in bits], "step_ms": step_ms, "checksum": checksum,
        "peak_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
        "zerocta": zerocta, "finite": all(math.isfinite(v) for v in values),
        "profile": profiler.rank_result() if profiler else None})
    slowest = [max(r["step_ms"][i] for r in per_rank) for i in range(len(step_ms))]
    timing = timing_summary(slowest, args.warmup, profiler.count if profiler else 0)
    finite = all(r["finite"] for r in per_rank)
    if rank == 0:
        record = dict(header)
        record.update({
            "script": script, "config": cfg, "world_size": len(per_rank),
            "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
            "deterministic": args.deterministic,
            "losses_hex": [r["losses_hex"] for r in per_rank],
            "losses_rank0": [repr(v) for v in values],
            "finite": finite, "step_ms": slowest, "timing": timing,
            "checksum": [r["checksum"] for r in per_rank],
            "peak_gib": [r["peak_gib"] for r in per_rank],
            "zerocta": [r["zerocta"] for r in per_rank] if zerocta is not None else None,
            "profile": profiler.record([r["profile"] for r in per_rank]) if profiler else None,
            "versions": environment_record(),
        })
        if args.out:
            write_json(args.out, record)
        print("%s: %s done: %d ranks, loss %r -> %r%s, median step %.2f ms (%d timed), "
              "peak %.1f GiB, checksum rank 0 %s" %
              (script, header.get("name", "-"), len(per_rank), values[0], values[-1],
               "" if finite else " (NON-FINITE)", timing.get("median_step_ms", float("nan")),
               timing["timed_steps"], max(r["peak_gib"] for r in per_rank), checksum))
        if profiler:
            print("%s: profiled steps %d-%d, all ranks: %s" %
                  (script, profiler.first, profiler.first + profiler.count - 1,
                   exposed_comm.describe(record["profile"]["all_ranks"])))
        for line in zerocta_stats.describe(zerocta_stats.snapshot()):
            print("zerocta-stats rank 0: %s" % line)
        sys.stdout.flush()
    return 0 if finite else 1
