"""GEMM overlapped with an all-gather or a reduce-scatter on a side stream (after PyTorch PR
#172714's benchmark).

    torchrun --standalone --nproc-per-node=2 overlap_172714.py [--m 8192 --n 8192 --k 8192]
        [--ag-mib 64] [--dtype bf16] [--iters 50] [--warmup 10] [--buffers plain|nccl-windows]
        [--op allgather|reducescatter [--rs-mib 64] [--rs-dtype bf16|fp32] [--redop sum|avg]]
        [--json FILE]

Compute runs on the default stream and the collective on a side stream, as FSDP does: by
default the all-gather (all_gather_into_tensor, total output --ag-mib, in --dtype); with --op
reducescatter the reduce-scatter (reduce_scatter_tensor, --rs-mib of input per rank, in
--rs-dtype, --redop sum or avg), as FSDP2 reduce-scatters its gradients. Reported, as the
slowest rank's mean per iteration: GEMM alone, the collective alone, sequential (GEMM then the
collective), overlapped (both at once), T_ideal = max(GEMM alone, collective alone) - what
perfect overlap would give - and how long each side took while overlapped. Run it once plain
and once under zerocta-run (--allgather or --reducescatter auto|zerocta) to compare
(run_overlap.sh does all variants in one go).

--buffers nccl-windows is what an application gets from NCCL's own copy-engine path by changing
its code (run it without zerocta): the process group is created with the zero-CTA policy and the
all-gather's buffers come from symmetric memory with the NCCL backend (ncclMemAlloc, windows
registered at rendezvous). With --op reducescatter both of the reduce-scatter's buffers are such
windows.

The collective's result is checked once before timing: the all-gather's bitwise; the
reduce-scatter's inputs are small integers (chunk + element % 4 + rank), so its sum is exact in
any order and checked bitwise, and so is its average on a power-of-two number of ranks (to 1 %
on others, where 1/ranks is inexact).
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

import zerocta_stats

# What the report and the record call each collective.
OP_NAMES = {"allgather": "all-gather", "reducescatter": "reduce-scatter"}


def row(label, ms, note=""):
    print("  %-28s %8.3f ms  %s" % (label, ms, note))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--m", type=int, default=8192)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--op", choices=sorted(OP_NAMES), default="allgather",
                   help="the collective overlapped with the GEMM")
    p.add_argument("--ag-mib", type=int, default=64, help="all-gather total output, MiB")
    p.add_argument("--rs-mib", type=int, default=64,
                   help="reduce-scatter input per rank (world x its output), MiB")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16",
                   help="the GEMM's and the all-gather's")
    p.add_argument("--rs-dtype", choices=["bf16", "fp32"], default="bf16",
                   help="the reduce-scatter's (FSDP2 reduces in fp32 under reduce_dtype=fp32)")
    p.add_argument("--redop", choices=["sum", "avg"], default="sum",
                   help="the reduce-scatter's reduction")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--buffers", choices=["plain", "nccl-windows"], default="plain",
                   help="plain tensors, or NCCL windows + zero-CTA policy (NCCL's own CE path)")
    p.add_argument("--json", help="write the slowest rank's times here (rank 0)")
    args = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rs_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.rs_dtype]
    op_name = OP_NAMES[args.op]

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
    if args.op == "allgather":
        comm_dtype, comm_mib = dtype, args.ag_mib
        per_rank = (args.ag_mib << 20) // (2 * world)  # 2-byte elements
        in_numel, out_numel = per_rank, per_rank * world
        comm_bytes = out_numel * 2  # the whole output: what every rank receives
    else:
        comm_dtype, comm_mib = rs_dtype, args.rs_mib
        per_rank = (args.rs_mib << 20) // (rs_dtype.itemsize * world)  # output elements
        in_numel, out_numel = per_rank * world, per_rank
        comm_bytes = in_numel * rs_dtype.itemsize  # the whole input of a rank
    if args.buffers == "nccl-windows":
        import torch.distributed._symmetric_memory as symm_mem
        symm_mem.set_backend("NCCL")
        comm_in = symm_mem.empty(in_numel, dtype=comm_dtype, device=device)
        comm_out = symm_mem.empty(out_numel, dtype=comm_dtype, device=device)
        symm_mem.rendezvous(comm_in, dist.group.WORLD)
        symm_mem.rendezvous(comm_out, dist.group.WORLD)
    else:
        comm_in = torch.empty(in_numel, dtype=comm_dtype, device=device)
        comm_out = torch.empty(out_numel, dtype=comm_dtype, device=device)
    if args.op == "allgather":
        comm_in.fill_(float(rank))
        expected = torch.arange(world, device=device, dtype=dtype).repeat_interleave(per_rank)
    else:
        # Chunk c of rank r holds c + (element % 4) + r: small integers, exact in bf16 and in
        # every partial sum up to 8 ranks; rank r's output is the sum over the ranks of chunk r.
        lane = torch.arange(per_rank, device=device) % 4
        chunk = torch.arange(world, device=device).unsqueeze(1)
        comm_in.copy_((chunk + lane.unsqueeze(0) + rank).flatten().to(rs_dtype))
        total = (world * (rank + lane) + world * (world - 1) // 2).to(torch.float64)
        if args.redop == "avg":
            total = total / world
        expected = total.to(rs_dtype)
    redop = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}[args.redop]

    main_stream = torch.cuda.current_stream()  # the default stream
    side = torch.cuda.Stream()

    def gemm():
        torch.matmul(a, b, out=c)

    def collective():
        if args.op == "allgather":
            dist.all_gather_into_tensor(comm_out, comm_in)
        else:
            dist.reduce_scatter_tensor(comm_out, comm_in, op=redop)

    def comm_alone():
        # The side stream starts after the work before it on the main stream, and the main
        # stream continues only after the collective: one iteration is fully ordered.
        side.wait_stream(main_stream)
        with torch.cuda.stream(side):
            collective()
        main_stream.wait_stream(side)

    def overlapped(marks):
        side.wait_stream(main_stream)
        start = torch.cuda.Event(enable_timing=True)
        start.record(main_stream)
        with torch.cuda.stream(side):
            collective()
            comm_end = torch.cuda.Event(enable_timing=True)
            comm_end.record(side)
        gemm()
        gemm_end = torch.cuda.Event(enable_timing=True)
        gemm_end.record(main_stream)
        main_stream.wait_stream(side)
        marks.append((start, gemm_end, comm_end))

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
    comm_alone()
    torch.cuda.synchronize()
    route = zerocta_stats.routes_between(before, zerocta_stats.snapshot(), op=args.op)
    exact = args.op == "allgather" or args.redop == "sum" or (world & (world - 1)) == 0
    if exact:
        correct = torch.equal(comm_out, expected)
    else:
        correct = torch.allclose(comm_out.float(), expected.float(), rtol=1e-2, atol=0)

    t = {}
    t["gemm"] = timed(gemm)
    t["comm"] = timed(comm_alone)
    t["seq"] = timed(lambda: (gemm(), comm_alone()))
    marks = []
    t["ovl"] = timed(lambda: overlapped(marks))
    timed_marks = marks[-args.iters:]  # the timed iterations, not the warm-up
    t["ovl_gemm"] = sum(s.elapsed_time(e) for s, e, _ in timed_marks) / args.iters
    t["ovl_comm"] = sum(s.elapsed_time(e) for s, _, e in timed_marks) / args.iters

    # The slowest rank decides (a collective finishes when its last rank does).
    keys = sorted(t)
    worst = torch.tensor([t[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    ok = torch.tensor([1 if correct else 0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    t = dict(zip(keys, worst.tolist()))
    dist.destroy_process_group()

    if rank == 0:
        tflops = 2.0 * args.m * args.n * args.k / (t["gemm"] * 1e-3) / 1e12
        busbw = comm_bytes * (world - 1) / world / (t["comm"] * 1e-3) / 1e9
        ideal = max(t["gemm"], t["comm"])
        if args.op == "allgather":
            what = "all-gather %d MiB total" % args.ag_mib
        else:
            what = "reduce-scatter %d MiB input per rank %s %s" % (args.rs_mib, args.rs_dtype,
                                                                   args.redop)
        print("overlap_172714: %d ranks, GEMM %dx%dx%d %s, %s, buffers %s, "
              "zerocta %s, %s route %s, output %s" %
              (world, args.m, args.n, args.k, args.dtype, what, args.buffers,
               zerocta_stats.version() or "not loaded", op_name, route,
               "correct" if ok.item() else "WRONG"))
        row("GEMM alone", t["gemm"], "(%.0f TFLOP/s)" % tflops)
        row("%s alone" % op_name, t["comm"], "(busbw %.1f GB/s)" % busbw)
        row("sequential", t["seq"])
        row("overlapped", t["ovl"],
            "(%.3f x T_ideal; 1.000 = perfect overlap)" % (t["ovl"] / ideal))
        row("T_ideal = max(alone)", ideal)
        row("GEMM while overlapped", t["ovl_gemm"],
            "(%+.1f %% vs alone)" % (100.0 * (t["ovl_gemm"] / t["gemm"] - 1)))
        row("%s while overlapped" % op_name, t["ovl_comm"],
            "(%+.1f %% vs alone)" % (100.0 * (t["ovl_comm"] / t["comm"] - 1)))
        print("  (slowest rank's mean over %d iterations after %d warm-up)" %
              (args.iters, args.warmup))
        if args.json:
            record = dict(t, ranks=world, buffers=args.buffers, route=str(route),
                          correct=bool(ok.item()), zerocta=zerocta_stats.version(),
                          op=args.op, comm_mib=comm_mib, comm_dtype=str(comm_dtype),
                          gemm_mnk=[args.m, args.n, args.k])
            if args.op == "allgather":
                # The keys this record had before --op: older summaries read them.
                record.update(ag=t["comm"], ovl_ag=t["ovl_comm"], ag_mib=args.ag_mib)
            else:
                record.update(redop=args.redop)
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
    return 0 if ok.item() else 1


if __name__ == "__main__":
    sys.exit(main())
