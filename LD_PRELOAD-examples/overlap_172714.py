"""GEMM overlapped with an all-gather on a side stream (after PyTorch PR #172714's benchmark).

    torchrun --standalone --nproc-per-node=2 overlap_172714.py [--m 8192 --n 8192 --k 8192]
        [--ag-mib 64] [--dtype bf16] [--iters 50] [--warmup 10] [--buffers plain|nccl-windows]
        [--json FILE]

Compute runs on the default stream and the all-gather (all_gather_into_tensor, total output
--ag-mib) on a side stream, as FSDP does. Reported, as the slowest rank's mean per iteration:
GEMM alone, all-gather alone, sequential (GEMM then all-gather), overlapped (both at once),
T_ideal = max(GEMM alone, all-gather alone) - what perfect overlap would give - and how long
each side took while overlapped. Run it once plain and once under zerocta-run to compare
(run_overlap.sh does all variants in one go).

--buffers nccl-windows is what an application gets from NCCL's own copy-engine path by changing
its code (run it without zerocta): the process group is created with the zero-CTA policy and the
all-gather's buffers come from symmetric memory with the NCCL backend (ncclMemAlloc, windows
registered at rendezvous).
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

import zerocta_stats



def row(label, ms, note=""):
    print("  %-28s %8.3f ms  %s" % (label, ms, note))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, default=8192)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--ag-mib", type=int, default=64, help="all-gather total output, MiB")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--buffers", choices=["plain", "nccl-windows"], default="plain",
                   help="plain tensors, or NCCL windows + zero-CTA policy (NCCL's own CE path)")
    p.add_argument("--json", help="write the slowest rank's times here (rank 0)")
    args = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if args.buffers == "nccl-windows":
        # NCCL 2.28 takes its CE path only with CTA policy ZERO (2) and both buffers in
        # symmetric windows. The policy via the process group's config where PyTorch has it.
        opts = dist.ProcessGroupNCCL.Options()
        try:
            opts.config.cta_policy = 2
        except AttributeError:
            os.environ["NCCL_CTA_POLICY"] = "2"  # read by NCCL at its first init
        dist.init_process_group(backend="nccl", device_id=device, pg_options=opts)
    else:
        dist.init_process_group(backend="nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()

    g = torch.Generator(device=device).manual_seed(1234 + rank)
    a = torch.randn(args.m, args.k, dtype=dtype, device=device, generator=g)
    b = torch.randn(args.k, args.n, dtype=dtype, device=device, generator=g)
    c = torch.empty(args.m, args.n, dtype=dtype, device=device)
    per_rank = (args.ag_mib << 20) // (2 * world)  # 2-byte elements
    if args.buffers == "nccl-windows":
        import torch.distributed._symmetric_memory as symm_mem
        symm_mem.set_backend("NCCL")
        ag_in = symm_mem.empty(per_rank, dtype=dtype, device=device)
        ag_out = symm_mem.empty(per_rank * world, dtype=dtype, device=device)
        symm_mem.rendezvous(ag_in, dist.group.WORLD)
        symm_mem.rendezvous(ag_out, dist.group.WORLD)
        ag_in.fill_(float(rank))
    else:
        ag_in = torch.full((per_rank,), float(rank), dtype=dtype, device=device)
        ag_out = torch.empty(per_rank * world, dtype=dtype, device=device)

    main_stream = torch.cuda.current_stream()  # the default stream
    side = torch.cuda.Stream()

    def gemm():
        torch.matmul(a, b, out=c)

    def all_gather():
        # The side stream starts after the work before it on the main stream, and the main
        # stream continues only after the all-gather: one iteration is fully ordered.
        side.wait_stream(main_stream)
        with torch.cuda.stream(side):
            dist.all_gather_into_tensor(ag_out, ag_in)
        main_stream.wait_stream(side)

    def overlapped(marks):
        side.wait_stream(main_stream)
        start = torch.cuda.Event(enable_timing=True)
        start.record(main_stream)
        with torch.cuda.stream(side):
            dist.all_gather_into_tensor(ag_out, ag_in)
            ag_end = torch.cuda.Event(enable_timing=True)
            ag_end.record(side)
        gemm()
        gemm_end = torch.cuda.Event(enable_timing=True)
        gemm_end.record(main_stream)
        main_stream.wait_stream(side)
        marks.append((start, gemm_end, ag_end))

    def timed(step):
        """Mean ms per iteration of step() on this rank, after warm-up, ranks started together."""
        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(main_stream)
        for _ in range(args.iters):
            step()
        end.record(main_stream)
        end.synchronize()
        return start.elapsed_time(end) / args.iters

    before = zerocta_stats.snapshot()
    all_gather()
    torch.cuda.synchronize()
    route = zerocta_stats.routes_between(before, zerocta_stats.snapshot())
    expected = torch.arange(world, device=device, dtype=dtype).repeat_interleave(per_rank)
    correct = torch.equal(ag_out, expected)

    t = {}
    t["gemm"] = timed(gemm)
    t["ag"] = timed(all_gather)
    t["seq"] = timed(lambda: (gemm(), all_gather()))
    marks = []
    t["ovl"] = timed(lambda: overlapped(marks))
    timed_marks = marks[-args.iters:]  # the timed iterations, not the warm-up
    t["ovl_gemm"] = sum(s.elapsed_time(e) for s, e, _ in timed_marks) / args.iters
    t["ovl_ag"] = sum(s.elapsed_time(e) for s, _, e in timed_marks) / args.iters

    # The slowest rank decides (an all-gather finishes when its last rank does).
    keys = sorted(t)
    worst = torch.tensor([t[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    ok = torch.tensor([1 if correct else 0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    t = dict(zip(keys, worst.tolist()))
    dist.destroy_process_group()

    if rank == 0:
        tflops = 2.0 * args.m * args.n * args.k / (t["gemm"] * 1e-3) / 1e12
        ag_bytes = per_rank * world * 2
        busbw = ag_bytes * (world - 1) / world / (t["ag"] * 1e-3) / 1e9
        ideal = max(t["gemm"], t["ag"])
        print("overlap_172714: %d ranks, GEMM %dx%dx%d %s, all-gather %d MiB total, buffers %s, "
              "zerocta %s, all-gather route %s, output %s" %
              (world, args.m, args.n, args.k, args.dtype, args.ag_mib, args.buffers,
               zerocta_stats.version() or "not loaded", route,
               "correct" if ok.item() else "WRONG"))
        row("GEMM alone", t["gemm"], "(%.0f TFLOP/s)" % tflops)
        row("all-gather alone", t["ag"], "(busbw %.1f GB/s)" % busbw)
        row("sequential", t["seq"])
        row("overlapped", t["ovl"],
            "(%.3f x T_ideal; 1.000 = perfect overlap)" % (t["ovl"] / ideal))
        row("T_ideal = max(alone)", ideal)
        row("GEMM while overlapped", t["ovl_gemm"],
            "(%+.1f %% vs alone)" % (100.0 * (t["ovl_gemm"] / t["gemm"] - 1)))
        row("all-gather while overlapped", t["ovl_ag"],
            "(%+.1f %% vs alone)" % (100.0 * (t["ovl_ag"] / t["ag"] - 1)))
        print("  (slowest rank's mean over %d iterations after %d warm-up)" %
              (args.iters, args.warmup))
        if args.json:
            record = dict(t, ranks=world, buffers=args.buffers, route=str(route),
                          correct=bool(ok.item()), zerocta=zerocta_stats.version(),
                          ag_mib=args.ag_mib, gemm_mnk=[args.m, args.n, args.k])
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
    return 0 if ok.item() else 1


if __name__ == "__main__":
    sys.exit(main())
