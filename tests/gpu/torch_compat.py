#!/usr/bin/env python3
"""Compatibility matrix of zerocta against the ways PyTorch programs reach NCCL.

Each cell is one small scenario, run in its own torchrun job, once without and once with
libzerocta.so preloaded (tests/gpu/run_torch_compat.sh does both and calls --report):

    torchrun --standalone --nproc-per-node=N torch_compat.py --cell NAME --out DIR
    torch_compat.py --list                      cells: name, time limit, expected outcome
    torch_compat.py --report OUTDIR [--cells a,b] [--ngpu N]
                                                the table, from what the runs left in OUTDIR

A cell checks every output against the value each rank computes itself and records a digest
(sha256 of the output bytes) per output, so the two runs can be compared bitwise. Every rank
writes DIR/result.rank<R>.json: status ok | wrong | skip | error, digests, details, whether
zerocta was loaded, which libnccl files the process mapped. A cell whose API is missing skips
with the reason. The report reads those files, the runner's DIR/run.json (exit status,
seconds, timed out) and zerocta's own ZEROCTA_STATS files (DIR/stats-<pid>.json, the
all-gather routes), and prints a markdown table.

Only --cell imports torch (after the cell's environment is set); --list and --report need
nothing beyond the standard library.
"""

import argparse
import ctypes
import datetime
import glob
import hashlib
import json
import os
import re
import sys
import time
import traceback

# Bound by run_cell() after the cell's environment variables are set: several of them
# (TORCH_NCCL_*) are read when torch.distributed initialises.
torch = None
dist = None

# Every all-gather below is at least this large in total (bytes), so that the runner's
# ZEROCTA_MIN_BYTES=1M makes zerocta's `auto` route take it, unless a cell says otherwise.
TOTAL_BYTES = 4 << 20
SENTINEL = -1000.0  # outputs are filled with it first: a byte left unwritten shows


class Skip(Exception):
    """The API this cell needs is missing: not a failure."""


class Cell:
    def __init__(self, fn, env, init, expect, timeout_s):
        self.name = fn.__name__
        self.fn = fn
        self.doc = (fn.__doc__ or "").strip().split("\n")[0]
        self.env = env or {}
        self.init = init  # "nccl" | "gloo" | "none": what run_cell initialises before fn
        self.expect = expect  # "ok" | "error" (the run must fail, the same way, both times)
        self.timeout_s = timeout_s


CELLS = {}


def cell(env=None, init="nccl", expect="ok", timeout_s=60):
    def register(fn):
        CELLS[fn.__name__] = Cell(fn, env, init, expect, timeout_s)
        return fn
    return register


# --- what cells share --------------------------------------------------------------------------

def pattern_formula(i, rank, tag):
    """Integers in [-125, 125]: exact in fp32, bf16 and fp16, and different per rank/tag."""
    return (i * 40503 + rank * 7919 + tag * 104729) % 251 - 125


def tensor_bytes(t):
    host = t.detach().contiguous().cpu()
    return ctypes.string_at(host.data_ptr(), host.numel() * host.element_size())


class Ctx:
    """A running cell: rank facts, inputs, checks and the result being built."""

    def __init__(self, name, outdir):
        self.name = name
        self.outdir = outdir
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.digests = {}
        self.wrong = []
        self.details = {}

    def per_rank(self, dtype=None, extra=0):
        """Elements per rank so that the all-gather's total is TOTAL_BYTES (+extra elements)."""
        size = torch.tensor([], dtype=dtype or torch.float32).element_size()
        return TOTAL_BYTES // size // self.world + extra

    def pattern(self, tag, n, rank=None, dtype=None):
        i = torch.arange(n, dtype=torch.int64, device=self.device)
        r = self.rank if rank is None else rank
        return pattern_formula(i, r, tag).to(dtype or torch.float32)

    def gathered(self, tag, n, dtype=None, ranks=None):
        """What an all-gather of pattern(tag, n) over `ranks` (default all) must produce."""
        ranks = range(self.world) if ranks is None else ranks
        return torch.cat([self.pattern(tag, n, r, dtype) for r in ranks])

    def output(self, numel, dtype=None):
        return torch.full((numel,), SENTINEL, dtype=dtype or torch.float32, device=self.device)

    def check_bytes(self, what, got, want):
        self.digests[what] = hashlib.sha256(got).hexdigest()[:16]
        if got != want:
            n = min(len(got), len(want))
            first = next((k for k in range(n) if got[k] != want[k]), n)
            self.wrong.append("%s: %d of %d bytes, first difference at byte %d" %
                              (what, len(got), len(want), first))

    def check(self, what, got, want):
        """got (a tensor) must equal want bitwise; records got's digest either way."""
        torch.cuda.synchronize(self.device)
        self.check_bytes(what, tensor_bytes(got), tensor_bytes(want))


def write_result(outdir, rank, result):
    path = os.path.join(outdir, "result.rank%d.json" % rank)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def zerocta_loaded():
    return hasattr(ctypes.CDLL(None), "zerocta_version")


def mapped_libnccl():
    """Paths of every libnccl this process has mapped (two would mean two NCCLs)."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libnccl" in os.path.basename(path):
                paths.add(path)
    return sorted(paths)


# --- the cells ---------------------------------------------------------------------------------

@cell()
def ag_sync(ctx):
    """all_gather_into_tensor, synchronous, on the default (legacy NULL) stream"""
    assert torch.cuda.current_stream(ctx.device) == torch.cuda.default_stream(ctx.device)
    # fp32, and bf16 with an element count that is not a multiple of anything convenient.
    for tag, dtype, extra in ((1, torch.float32, 0), (2, torch.bfloat16, 3)):
        n = ctx.per_rank(dtype, extra)
        out = ctx.output(n * ctx.world, dtype)
        dist.all_gather_into_tensor(out, ctx.pattern(tag, n, dtype=dtype))
        ctx.check("sync.%s" % str(dtype).split(".")[-1], out, ctx.gathered(tag, n, dtype))


@cell()
def ag_async(ctx):
    """all_gather_into_tensor with async_op=True (the process group's own stream)"""
    n = ctx.per_rank()
    out = ctx.output(n * ctx.world)
    work = dist.all_gather_into_tensor(out, ctx.pattern(3, n), async_op=True)
    work.wait()
    ctx.check("async", out, ctx.gathered(3, n))


@cell()
def ag_list(ctx):
    """all_gather into a list of tensors (equal sizes)"""
    n = ctx.per_rank()
    outs = [ctx.output(n) for _ in range(ctx.world)]
    dist.all_gather(outs, ctx.pattern(4, n))
    ctx.check("list", torch.cat(outs), ctx.gathered(4, n))


@cell()
def ag_coalesced(ctx):
    """three all_gather_into_tensor in _coalescing_manager (one NCCL group), one below 1 MiB"""
    manager = getattr(dist, "_coalescing_manager", None)
    if manager is None:
        raise Skip("torch.distributed._coalescing_manager is missing")
    # Totals 4 MiB, 64 KiB (under ZEROCTA_MIN_BYTES: NCCL's own path) and 2 MiB + odd.
    sizes = [ctx.per_rank(), (64 << 10) // 4 // ctx.world, ctx.per_rank() // 2 + 5]
    outs = [ctx.output(n * ctx.world) for n in sizes]
    ins = [ctx.pattern(10 + k, n) for k, n in enumerate(sizes)]
    with manager(device=ctx.device, async_ops=True) as cm:
        for out, inp in zip(outs, ins):
            dist.all_gather_into_tensor(out, inp)
    cm.wait()
    for k, (out, n) in enumerate(zip(outs, sizes)):
        ctx.check("coalesced.%d" % k, out, ctx.gathered(10 + k, n))


@cell()
def new_group(ctx):
    """new_group of all ranks (PyTorch splits the default communicator), all-gather on it"""
    group = dist.new_group(ranks=list(range(ctx.world)))
    n = ctx.per_rank()
    out = ctx.output(n * ctx.world)
    dist.all_gather_into_tensor(out, ctx.pattern(20, n), group=group)
    ctx.check("new_group", out, ctx.gathered(20, n))
    dist.destroy_process_group(group)


@cell(env={"TORCH_NCCL_USE_COMM_NONBLOCKING": "1"})
def nonblocking(ctx):
    """TORCH_NCCL_USE_COMM_NONBLOCKING=1 (non-blocking communicators): sync and async"""
    n = ctx.per_rank()
    for tag, async_op in ((21, False), (22, True)):
        out = ctx.output(n * ctx.world)
        work = dist.all_gather_into_tensor(out, ctx.pattern(tag, n), async_op=async_op)
        if work is not None:
            work.wait()
        ctx.check("nonblocking.%s" % ("async" if async_op else "sync"), out,
                  ctx.gathered(tag, n))


def import_symm_mem():
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:
        raise Skip("torch.distributed._symmetric_memory: %s" % e)
    for name in ("empty", "rendezvous"):
        if not hasattr(symm_mem, name):
            raise Skip("torch.distributed._symmetric_memory.%s is missing" % name)
    return symm_mem


@cell()
def symm_mem(ctx):
    """symm_mem (CUDA backend): peer reads through the handle, then NCCL all-gather on it"""
    sm = import_symm_mem()
    n = ctx.per_rank()
    inp = sm.empty(n, dtype=torch.float32, device=ctx.device)
    inp.copy_(ctx.pattern(30, n))
    handle = sm.rendezvous(inp, dist.group.WORLD)
    ctx.details["backend"] = str(getattr(sm, "get_backend", lambda d: "?")(ctx.device))
    # symm_mem's own all-gather: every rank reads every peer's buffer directly.
    handle.barrier(channel=0)
    peers = ctx.output(n * ctx.world)
    for r in range(ctx.world):
        peers[r * n:(r + 1) * n].copy_(handle.get_buffer(r, (n,), torch.float32))
    handle.barrier(channel=0)
    ctx.check("symm_mem.peer_reads", peers, ctx.gathered(30, n))
    # NCCL on symm_mem buffers (to NCCL and zerocta plain device memory, not windows).
    out = sm.empty(n * ctx.world, dtype=torch.float32, device=ctx.device)
    out.fill_(SENTINEL)
    sm.rendezvous(out, dist.group.WORLD)
    dist.all_gather_into_tensor(out, inp)
    ctx.check("symm_mem.nccl_all_gather", out, ctx.gathered(30, n))


@cell()
def symm_mem_nccl(ctx):
    """symm_mem with set_backend("NCCL"): NCCL windows, all-gather on them (NCCL's CE path)"""
    sm = import_symm_mem()
    if not hasattr(sm, "set_backend"):
        raise Skip("torch.distributed._symmetric_memory.set_backend is missing")
    sm.set_backend("NCCL")
    n = ctx.per_rank()
    inp = sm.empty(n, dtype=torch.float32, device=ctx.device)
    out = sm.empty(n * ctx.world, dtype=torch.float32, device=ctx.device)
    sm.rendezvous(inp, dist.group.WORLD)
    sm.rendezvous(out, dist.group.WORLD)
    ctx.details["backend"] = str(getattr(sm, "get_backend", lambda d: "?")(ctx.device))
    inp.copy_(ctx.pattern(31, n))
    out.fill_(SENTINEL)
    dist.all_gather_into_tensor(out, inp)
    ctx.check("symm_mem_nccl", out, ctx.gathered(31, n))


@cell()
def mempool(ctx):
    """torch.cuda.MemPool of ProcessGroupNCCL's allocator + register_mem_pool (plain, symm)"""
    backend = dist.distributed_c10d._get_default_group()._get_backend(ctx.device)
    for name in ("mem_allocator", "register_mem_pool", "deregister_mem_pool"):
        if not hasattr(backend, name):
            raise Skip("ProcessGroupNCCL.%s is missing" % name)
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
        raise Skip("torch.cuda.MemPool/use_mem_pool is missing")
    n = ctx.per_rank()
    # symm=False: ncclCommRegister (buffer registration; plain buffers to zerocta).
    # symm=True: ncclCommWindowRegister (application windows: NCCL's CE path).
    for tag, symm in ((40, False), (41, True)):
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            inp = ctx.pattern(tag, n)
            out = ctx.output(n * ctx.world)
        if symm:
            try:
                backend.register_mem_pool(pool, True)  # symm (positional: named differently
            except TypeError as e:  # in some versions); an older binding has no such argument
                ctx.details["symm"] = "skipped: %s" % e
                continue
        else:
            backend.register_mem_pool(pool)
        dist.all_gather_into_tensor(out, inp)
        ctx.check("mempool.%s" % ("symm" if symm else "registered"), out, ctx.gathered(tag, n))
        backend.deregister_mem_pool(pool)
        del inp, out
        del pool


@cell()
def cuda_graph(ctx):
    """all_gather_into_tensor captured in torch.cuda.graph, replayed 10x with new inputs"""
    n = ctx.per_rank()
    static_in = ctx.pattern(50, n)
    static_out = ctx.output(n * ctx.world)
    # Eager once first: the communicator and zerocta's pool are set up outside capture.
    dist.all_gather_into_tensor(static_out, static_in)
    ctx.check("graph.eager_before", static_out, ctx.gathered(50, n))
    graph = torch.cuda.CUDAGraph()
    # thread_local: PyTorch's watchdog thread may query events while we capture.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        dist.all_gather_into_tensor(static_out, static_in)
    replays = hashlib.sha256()
    for k in range(10):
        static_in.copy_(ctx.pattern(60 + k, n))
        static_out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize(ctx.device)
        got, want = tensor_bytes(static_out), tensor_bytes(ctx.gathered(60 + k, n))
        replays.update(got)
        if got != want:
            ctx.wrong.append("graph replay %d: output differs" % k)
    ctx.digests["graph.replays"] = replays.hexdigest()[:16]
    # Eager again after the replays: graph and eager all-gathers of one communicator mix.
    out = ctx.output(n * ctx.world)
    dist.all_gather_into_tensor(out, ctx.pattern(70, n))
    ctx.check("graph.eager_after", out, ctx.gathered(70, n))
    del graph


@cell(timeout_s=120)
def compile_funcol(ctx):
    """torch.compile (inductor) of a function calling funcol.all_gather_tensor"""
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError as e:
        raise Skip("torch.distributed._functional_collectives: %s" % e)
    group = dist.group.WORLD

    def f(x):
        return funcol.all_gather_tensor(x * 2, gather_dim=0, group=group) + 1

    compiled = torch.compile(f, fullgraph=True)
    n = ctx.per_rank()
    for tag in (80, 81):  # twice: the second call runs the cached compiled code
        out = compiled(ctx.pattern(tag, n))
        ctx.check("compile.%d" % tag, out, ctx.gathered(tag, n) * 2 + 1)


@cell()
def reinit(ctx):
    """destroy_process_group, then init_process_group again, an all-gather each time"""
    n = ctx.per_rank()
    out = ctx.output(n * ctx.world)
    dist.all_gather_into_tensor(out, ctx.pattern(90, n))
    ctx.check("reinit.first", out, ctx.gathered(90, n))
    # A fresh key prefix on the same store: the second default group would otherwise use the
    # same store keys as the first, and a rank could read the first communicator's stale NCCL
    # id (PyTorch's key reuse, not zerocta's business).
    store = dist.PrefixStore("zerocta-compat-reinit", dist.distributed_c10d._get_default_store())
    dist.destroy_process_group()
    dist.init_process_group(backend="nccl", store=store, rank=ctx.rank, world_size=ctx.world,
                            device_id=ctx.device)
    out = ctx.output(n * ctx.world)
    dist.all_gather_into_tensor(out, ctx.pattern(91, n))
    ctx.check("reinit.second", out, ctx.gathered(91, n))


WATCHDOG_TIMEOUT_S = 5


# PyTorch 2.11's watchdog detects the timeout within 5 s, but its abort can then hang (seen with
# and without zerocta); the heartbeat monitor is what ends the process, after 10 s here
# instead of the default 8 minutes.
@cell(env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
           "TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "10"},
      expect="error")
def watchdog(ctx):
    """rank 0 all-reduces, the others skip it: the watchdog must tear rank 0 down in time"""
    # A group with a short timeout; the default group keeps the default one, so start-up
    # is not at the mercy of a short timeout.
    group = dist.new_group(ranks=list(range(ctx.world)),
                           timeout=datetime.timedelta(seconds=WATCHDOG_TIMEOUT_S))
    n = ctx.per_rank()
    out = ctx.output(n * ctx.world)
    dist.all_gather_into_tensor(out, ctx.pattern(95, n), group=group)
    ctx.check("watchdog.before", out, ctx.gathered(95, n))
    # What the report reads if this process is torn down from here on.
    write_result(ctx.outdir, ctx.rank, {"status": "running", "wrong": ctx.wrong,
                                        "zerocta_loaded": zerocta_loaded()})
    if ctx.rank == 0:
        t0 = time.time()
        dist.all_reduce(torch.ones(n, device=ctx.device), group=group)
        # Blocks until the watchdog aborts the communicator; TearDown then ends the process
        # (an exception here is an error too, which is what the cell expects).
        torch.cuda.synchronize(ctx.device)
        ctx.details["all_reduce_returned_after_s"] = time.time() - t0
        if time.time() - t0 < WATCHDOG_TIMEOUT_S:
            ctx.wrong.append("rank 0's all_reduce completed although the others skipped it")
        else:
            # Aborted by the watchdog: the TearDown must now end the process.
            time.sleep(30)
            ctx.wrong.append("rank 0 outlived the watchdog's abort by 30 s")
    else:
        time.sleep(45)  # torchrun stops this rank once rank 0 is gone
        ctx.wrong.append("rank 0 was not torn down within 45 s")


@cell(init="gloo")
def cupy_nccl(ctx):
    """CuPy's NCCL binding: NcclCommunicator.allGather (unique id sent over gloo)"""
    try:
        import cupy
        import numpy as np
        from cupy.cuda import nccl
    except Exception as e:  # ImportError, or CuPy failing to load its CUDA libraries
        raise Skip("cupy.cuda.nccl not importable: %s: %s" % (type(e).__name__, e))
    if not getattr(nccl, "available", True):
        raise Skip("cupy.cuda.nccl.available is False")
    cupy.cuda.Device(ctx.local_rank).use()
    uid = [nccl.get_unique_id() if ctx.rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = nccl.NcclCommunicator(ctx.world, uid[0], ctx.rank)
    n = ctx.per_rank()
    i = np.arange(n, dtype=np.int64)

    def host_pattern(r):
        return pattern_formula(i, r, 100).astype(np.float32)

    send = cupy.asarray(host_pattern(ctx.rank))
    recv = cupy.full(n * ctx.world, SENTINEL, dtype=cupy.float32)
    stream = cupy.cuda.get_current_stream()
    comm.allGather(send.data.ptr, recv.data.ptr, n, nccl.NCCL_FLOAT32, stream.ptr)
    stream.synchronize()
    ctx.check_bytes("cupy.allGather", cupy.asnumpy(recv).tobytes(),
                    np.concatenate([host_pattern(r) for r in range(ctx.world)]).tobytes())
    comm.destroy()


# --- running one cell --------------------------------------------------------------------------

def run_cell(name, outdir):
    global torch, dist
    c = CELLS[name]
    os.environ.update(c.env)
    # NVLink multicast must stay off on the project's GPU machines.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch as torch_module
    import torch.distributed as dist_module
    torch, dist = torch_module, dist_module

    os.makedirs(outdir, exist_ok=True)
    rank = int(os.environ["RANK"])
    result = {"cell": name, "rank": rank, "world": int(os.environ["WORLD_SIZE"]),
              "torch": torch.__version__, "zerocta_loaded": zerocta_loaded(),
              "status": "started"}
    write_result(outdir, rank, result)  # a crash leaves this behind
    ctx = None
    try:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        ctx = Ctx(name, outdir)
        if c.init == "nccl":
            dist.init_process_group(backend="nccl", device_id=ctx.device)
        elif c.init == "gloo":
            dist.init_process_group(backend="gloo")
        c.fn(ctx)
        torch.cuda.synchronize(ctx.device)
        result["status"] = "wrong" if ctx.wrong else "ok"
    except Skip as e:
        result["status"] = "skip"
        result["reason"] = str(e)
    except Exception as e:  # the cell's failure is its result
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]
        result["status"] = "error"
        result["reason"] = "%s: %s" % (type(e).__name__, first[:300])
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as e:
                result.setdefault("reason", "destroy_process_group: %s" % e)
    if ctx is not None:
        result.update(digests=ctx.digests, wrong=ctx.wrong, details=ctx.details)
    result["libnccl"] = mapped_libnccl()
    write_result(outdir, rank, result)
    why = result.get("reason") or "; ".join(result.get("wrong", []))
    print("torch_compat %s rank %d: %s%s" % (name, rank, result["status"],
                                             ": " + why if why else ""), flush=True)
    return 0 if result["status"] in ("ok", "skip") else 1


# --- the report --------------------------------------------------------------------------------

# What a watchdog timeout looks like in PyTorch's log ("Watchdog caught collective operation
# timeout: WorkNCCL(...) ran for 5012 milliseconds before timing out").
TIMEOUT_EVIDENCE = re.compile(r"collective operation timeout|milliseconds before timing out",
                              re.IGNORECASE)


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def outcome(c, rundir, ngpu, with_shim):
    """(class, text): class works | fails | timeout | skip | not run, for one run of a cell."""
    run = load_json(os.path.join(rundir, "run.json"))
    if run is None:
        return "not run", "not run"
    results = [load_json(p) for p in sorted(glob.glob(os.path.join(rundir,
                                                                   "result.rank*.json")))]
    results = [r for r in results if r]
    skips = [r for r in results if r.get("status") == "skip"]
    if skips:
        return "skip", "skip: %s" % skips[0].get("reason", "")
    secs = "%.0f s" % run["elapsed_s"]
    if run["timed_out"]:
        return "timeout", "timeout (%d s limit)" % run["timeout_s"]
    loaded = {r.get("zerocta_loaded") for r in results if "zerocta_loaded" in r}
    if loaded and loaded != {with_shim}:
        return "fails", "fails: zerocta %s loaded" % ("not" if with_shim else "was")
    if c.expect == "error":
        wrong = [w for r in results for w in r.get("wrong", [])]
        if wrong:
            return "fails", "fails: %s" % wrong[0]
        log = ""
        if os.path.exists(os.path.join(rundir, "log")):
            with open(os.path.join(rundir, "log"), errors="replace") as f:
                log = f.read()
        if run["rc"] == 0:
            return "fails", "fails: no error (%s)" % secs
        if not TIMEOUT_EVIDENCE.search(log):
            return "fails", "fails: exit %d without a watchdog timeout (%s)" % (run["rc"], secs)
        return "works", "errors as expected (%s)" % secs
    bad = [r for r in results if r.get("status") != "ok"]
    if run["rc"] != 0 or bad or len(results) != ngpu:
        why = next((r.get("reason") or "; ".join(r.get("wrong", [])) or r.get("status")
                    for r in bad), None) or "exit %d, %d of %d ranks reported" % (
                        run["rc"], len(results), ngpu)
        return "fails", "fails: %s" % why
    return "works", "works (%s)" % secs


def digests(rundir):
    return {r.get("rank"): r.get("digests") for r in
            (load_json(p) for p in glob.glob(os.path.join(rundir, "result.rank*.json"))) if r}


def routes(rundir):
    """All-gather routes from zerocta's ZEROCTA_STATS files (summed over ranks)."""
    files = glob.glob(os.path.join(rundir, "stats-*.json"))
    totals = {}
    for s in filter(None, (load_json(p) for p in files)):
        for route, counter in s.get("ops", {}).get("allgather", {}).items():
            totals[route] = totals.get(route, 0) + counter["calls"]
    if not files:
        return "no stats (process did not exit normally)"
    return ", ".join("%s %d" % kv for kv in sorted(totals.items())) or "no all-gathers"


def report(outdir, names, ngpu):
    rows, regressions, lines, same_and_working = [], [], [], 0
    for name in names:
        c = CELLS[name]
        plain_dir, shim_dir = (os.path.join(outdir, name, m) for m in ("plain", "shim"))
        pc, pt = outcome(c, plain_dir, ngpu, with_shim=False)
        sc, st = outcome(c, shim_dir, ngpu, with_shim=True)
        bitwise = "-"
        if pc == sc == "works" and c.expect == "ok":
            bitwise = "yes" if digests(plain_dir) == digests(shim_dir) else "**no**"
        route = routes(shim_dir) if sc != "not run" else "-"
        if pc != sc or bitwise == "**no**":
            regressions.append(name)
        elif pc == "works":
            same_and_working += 1
        rows.append("| %s | %s | %s | %s | %s |" % (name, pt, st, bitwise, route))
        lines.append("- `%s`: %s%s" % (name, c.doc,
                                       " (expected: an error, both runs)" if c.expect == "error"
                                       else ""))
    table = ["| cell | without shim | with shim | bitwise | zerocta all-gather routes |",
             "|---|---|---|---|---|"] + rows
    verdict = ("torch_compat: %d cells, %d behave the same with zerocta, %d differ%s" %
               (len(names), len(names) - len(regressions), len(regressions),
                ": " + ", ".join(regressions) if regressions else ""))
    text = "\n".join(["# zerocta compatibility matrix (%d GPUs)" % ngpu, ""] + table +
                     ["", "Cells:", ""] + lines +
                     ["", "bitwise: every output digest of every rank equal in both runs. "
                      "routes: all-gather calls per zerocta route, all ranks, from "
                      "ZEROCTA_STATS (ZEROCTA_ALLGATHER=auto, ZEROCTA_MIN_BYTES=1M).", "",
                      "%d cells work (or error as expected) in both runs." % same_and_working,
                      "",
                      verdict, ""])
    with open(os.path.join(outdir, "compat.md"), "w") as f:
        f.write(text)
    print("\n".join(table))
    print(verdict)
    return 1 if regressions else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--cell", choices=sorted(CELLS), help="run this cell (under torchrun)")
    mode.add_argument("--list", action="store_true", help="print: name timeout_s expect")
    mode.add_argument("--report", metavar="OUTDIR", help="print and write OUTDIR/compat.md")
    p.add_argument("--out", help="--cell: directory for result.rank<R>.json")
    p.add_argument("--cells", help="--report: comma-separated cells (default: all, in order)")
    p.add_argument("--ngpu", type=int, default=2, help="--report: ranks per run")
    args = p.parse_args()
    if args.list:
        for c in CELLS.values():
            print("%s %d %s" % (c.name, c.timeout_s, c.expect))
        return 0
    if args.report:
        names = args.cells.split(",") if args.cells else list(CELLS)
        unknown = [n for n in names if n not in CELLS]
        if unknown:
            p.error("unknown cells: %s" % ", ".join(unknown))
        return report(args.report, names, args.ngpu)
    if not args.out:
        p.error("--cell needs --out DIR")
    return run_cell(args.cell, args.out)


if __name__ == "__main__":
    sys.exit(main())
