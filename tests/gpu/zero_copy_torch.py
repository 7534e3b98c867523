#!/usr/bin/env python3
"""The zero-copy all-gather under PyTorch, across processes (torchrun, one GPU per rank).

    torchrun --standalone --nproc-per-node=N zero_copy_torch.py [--bench]

Checks, bitwise, all_gather_into_tensor in place (FSDP2's way: the input is the output's own
slice) and out of place, over odd and large sizes and several dtypes (and 1.75 GiB per rank,
past 160 of PyTorch's 20 MiB allocations), on fresh tensors each
time (so buffers move, are freed and reused), then reports how many all-gathers took each
route (zerocta_get_stats, when the shim is loaded). With --bench it also times a 256 MiB-per-
rank all-gather alone, in and out of place (median and spread of 20 after 5 warm-ups, and the
time the call takes on the host). With ZG_EXPECT=ce it also checks that memory a rank frees
comes back although a peer had imported it. With ZG_ISOLATE=1 each rank sees only its own GPU
(CUDA_VISIBLE_DEVICES set per rank).

Run it with the shim (LD_PRELOAD=libzerocta.so ZEROCTA_ALLGATHER=zerocta) and with and without
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: with them every op must take the copy
engines; with PyTorch's default allocator (cudaMalloc segments, unreachable from another
process) every op goes to NCCL, the same on every rank. ZG_EXPECT=ce|nccl makes the script fail
when a route other than the expected one was taken. Exit status 0 = every check passed.
"""

import ctypes
import os
import statistics
import sys
import time


def routes():
    """(copy-engine calls, pass-through calls) of all-gathers, or None without the shim."""

    lib = ctypes.CDLL(None)
    try:
        get = lib.zerocta_get_stats
    except AttributeError:
        return None
    # zerocta_stats_t begins with counters[op][route] of {calls, bytes} (include/zerocta.h):
    # all-gather is op 0; routes: passthrough 0, ce 1, nccl_ce 2 (3 in all).
    buf = (ctypes.c_uint64 * 4096)()
    if get(ctypes.byref(buf)) != 0:
        return None
    op, nroutes = 0, 3
    calls = lambda r: buf[(op * nroutes + r) * 2]
    return calls(1), calls(0) + calls(2)


def freed_memory_returns(rank, world, dev):
    """A peer's import must not keep memory alive that its owner freed: all-gather into 1 GiB
    outputs, free them (empty_cache() hands the allocations back to the driver), then run 160
    small all-gathers - past the owners' sweep of their exports and the peers' question about
    them (every 64 ops each) - and see the freed memory come back as free device memory. The
    peers imported about 1 GiB in all (the halves they write into, or read); the sum over the
    ranks of what came back must be at least 3/4 of it. Returns the number of failures."""

    import torch
    import torch.distributed as dist

    n = (512 << 20) // 2  # bf16 elements per rank: 1 GiB outputs on 2 ranks
    out = torch.empty(n * world, dtype=torch.bfloat16, device=dev)
    dist.all_gather_into_tensor(out, out.narrow(0, n * rank, n))
    torch.cuda.synchronize()
    del out
    torch.cuda.empty_cache()
    dist.barrier()
    free_before = torch.cuda.mem_get_info()[0]
    small = torch.ones(1 << 16, dtype=torch.bfloat16, device=dev)
    for _ in range(160):
        gathered = torch.empty(small.numel() * world, dtype=small.dtype, device=dev)
        dist.all_gather_into_tensor(gathered, small)
    torch.cuda.synchronize()
    dist.barrier()
    came_back = torch.tensor([torch.cuda.mem_get_info()[0] - free_before], device=dev)
    dist.all_reduce(came_back)
    total = came_back.item()
    want = world * (world - 1) * n * 2 * 3 // 4
    ok = total >= want
    print(f"rank {rank}: freed outputs, 160 ops later {total / 2**20:.0f} MiB came back on all "
          f"ranks (want >= {want / 2**20:.0f}): {'ok' if ok else 'STILL HELD by a peer'}",
          flush=True)
    return 0 if ok else 1


def large_buffers(rank, world, dev):
    """1.75 GiB per rank in bf16, in and out of place: with expandable segments the output spans
    over 160 of PyTorch's 20 MiB allocations (180 on 2 ranks), which a post must describe whole
    for the op to take the copy engines. The data is made on the GPU (the same seed gives every
    rank the same tensors): on the CPU it would take minutes."""

    import torch
    import torch.distributed as dist

    failures = 0
    n = (1792 << 20) // 2
    for in_place in (True, False):
        g = torch.Generator(device=dev).manual_seed(1792 + in_place)
        want = torch.randint(0, 255, (world * n * 2,), dtype=torch.uint8, device=dev,
                             generator=g)
        out = torch.full_like(want, 0xEE)
        mine = want.narrow(0, rank * n * 2, n * 2)
        if in_place:
            inp = out.view(torch.bfloat16).narrow(0, n * rank, n)
            inp.view(torch.uint8).copy_(mine)
        else:
            inp = mine.clone().view(torch.bfloat16)
        dist.all_gather_into_tensor(out.view(torch.bfloat16), inp)
        torch.cuda.synchronize()
        if not torch.equal(out, want):
            print(f"rank {rank}: WRONG 1.75 GiB/rank bf16 in_place={in_place}", flush=True)
            failures += 1
        del want, out, mine, inp
    torch.cuda.empty_cache()
    return failures


def main():
    # ZG_ISOLATE=1: each rank sees only its own GPU, as CUDA_VISIBLE_DEVICES=<local rank> from
    # SLURM's --gpu-bind or a one-GPU container gives it (set before CUDA starts).
    isolate = os.environ.get("ZG_ISOLATE") == "1"
    if isolate:
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("LOCAL_RANK", "0")
    import torch
    import torch.distributed as dist

    bench = "--bench" in sys.argv
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(0 if isolate else int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    failures = 0
    sizes = [1, 3, 4097, (1 << 20) + 5, 16 << 20, (64 << 20) + 12, 256 << 20]
    dtypes = [torch.uint8, torch.bfloat16, torch.float32]
    for size_bytes in sizes:
        for dtype in dtypes:
            esize = torch.tensor([], dtype=dtype).element_size()
            n = max(1, size_bytes // esize)
            for in_place in (True, False):
                g = torch.Generator(device="cpu").manual_seed(size_bytes * 31 + esize)
                inputs = [torch.randint(0, 255, (n * esize,), dtype=torch.uint8, generator=g)
                          for _ in range(world)]
                want = torch.cat(inputs).to(dev)
                out = torch.full((n * world * esize,), 0xEE, dtype=torch.uint8, device=dev)
                out_t = out.view(dtype)
                if in_place:
                    inp_t = out_t.narrow(0, n * rank, n)
                    inp_t.view(torch.uint8).copy_(inputs[rank].to(dev))
                else:
                    inp_t = inputs[rank].to(dev).view(dtype).clone()
                dist.all_gather_into_tensor(out_t, inp_t)
                torch.cuda.synchronize()
                if not torch.equal(out, want):
                    bad = (out != want).nonzero()
                    print(f"rank {rank}: WRONG {size_bytes} B {dtype} in_place={in_place}: "
                          f"{bad.numel()} bytes differ, first at {bad[0].item()}", flush=True)
                    failures += 1
                del out, out_t, inp_t, want
    # Before the large buffers: their peers' imports, released during its 160 ops, would count
    # as memory that came back.
    if os.environ.get("ZG_EXPECT", "") == "ce":
        failures += freed_memory_returns(rank, world, dev)
    failures += large_buffers(rank, world, dev)
    r = routes()
    if r is not None:
        print(f"rank {rank}: all-gathers on the copy engines {r[0]}, to NCCL {r[1]}", flush=True)
        expect = os.environ.get("ZG_EXPECT", "")
        if expect == "ce" and r[1] != 0:
            print(f"rank {rank}: expected every all-gather on the copy engines", flush=True)
            failures += 1
        if expect == "nccl" and r[0] != 0:
            print(f"rank {rank}: expected every all-gather to go to NCCL", flush=True)
            failures += 1
    if bench:
        n = (256 << 20) // 2
        for in_place in (True, False):
            out = torch.empty(n * world, dtype=torch.bfloat16, device=dev)
            inp = out.narrow(0, n * rank, n) if in_place else torch.empty(n, dtype=torch.bfloat16,
                                                                           device=dev)
            times, host = [], []
            for i in range(25):
                dist.barrier()
                torch.cuda.synchronize()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                t0 = time.perf_counter()
                dist.all_gather_into_tensor(out, inp)
                host.append((time.perf_counter() - t0) * 1000)
                e.record()
                e.synchronize()
                if i >= 5:
                    times.append(s.elapsed_time(e))
            med = statistics.median(times)
            busbw = (n * 2 * world) * (world - 1) / world / (med / 1000) / 1e9
            print(f"rank {rank}: 256 MiB/rank {'in place' if in_place else 'out of place'}: "
                  f"median {med:.3f} ms (min {min(times):.3f}, max {max(times):.3f}), busbw "
                  f"{busbw:.1f} GB/s; host enqueue median {statistics.median(host[5:]):.3f} ms",
                  flush=True)
            del out, inp
    dist.destroy_process_group()
    print(f"rank {rank}: {'PASS' if failures == 0 else 'FAIL'}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
