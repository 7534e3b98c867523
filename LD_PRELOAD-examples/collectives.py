"""The collective patterns PyTorch programs use, on deterministic data, checked and digested.

    torchrun --standalone --nproc-per-node=2 collectives.py [--mib 64] [--out DIR]

Every rank checks each output against the value it computes itself, and prints (rank 0) or
writes (--out DIR/digests.rank<R>.txt) one digest per op: the first 16 hex digits of the
sha256 of the output bytes. The data depend only on (rank, op), so two runs - with and
without zerocta - must give the same digests; run_collectives.sh runs both and diffs them.
With zerocta preloaded each line also names the route zerocta counted for the op (its own
counters, read through ctypes); without it the route is "-". Exit status 1 if any output
is wrong.
"""

import argparse
import ctypes
import hashlib
import os
import sys

import torch
import torch.distributed as dist

import zerocta_stats



def pattern(rank, op, n, device):
    """n int16 values that depend only on (rank, op, index): deterministic and cheap to make."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    return ((i * 40503 + rank * 7919 + op * 104729) % 65536 - 32768).to(torch.int16)


def gathered(op, n, world, device):
    """What an all-gather of every rank's pattern(rank, op, n) must produce."""
    return torch.cat([pattern(r, op, n, device) for r in range(world)])


def digest(t):
    """sha256 of the tensor's bytes (no numpy needed: the bytes are read straight from memory)."""
    host = t.detach().contiguous().cpu()
    raw = ctypes.string_at(host.data_ptr(), host.numel() * host.element_size())
    return hashlib.sha256(raw).hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=64,
                        help="total output of the large all-gathers, MiB (default 64: above "
                        "ZEROCTA_MIN_BYTES=64M, so --allgather auto routes them)")
    parser.add_argument("--out", help="directory for digests.rank<R>.txt")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    # device_id= makes PyTorch create the NCCL communicator now (ncclCommInitRankConfig).
    dist.init_process_group(backend="nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    n = (args.mib << 20) // (2 * world)  # bf16 elements per rank
    small = (1 << 20) // (2 * world)  # a 1 MiB all-gather: under ZEROCTA_MIN_BYTES

    results = []  # (name, output, expected, route)

    def run(name, fn, expected, op="allgather"):
        before = zerocta_stats.snapshot()
        out = fn()
        torch.cuda.synchronize()
        route = zerocta_stats.routes_between(before, zerocta_stats.snapshot(), op)
        results.append((name, out, expected, route))

    def ag_into_tensor(op, count, **kwargs):
        inp = pattern(rank, op, count, device).view(torch.bfloat16)
        out = torch.empty(count * world, dtype=torch.bfloat16, device=device)
        work = dist.all_gather_into_tensor(out, inp, **kwargs)
        if work is not None:  # async_op=True
            work.wait()
        return out.view(torch.int16)

    # Synchronous: on the caller's current stream, here the default (legacy NULL) stream.
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    run("all_gather_into_tensor.sync", lambda: ag_into_tensor(1, n), gathered(1, n, world, device))
    # async_op=True: on the process group's internal NCCL stream.
    run("all_gather_into_tensor.async", lambda: ag_into_tensor(2, n, async_op=True),
        gathered(2, n, world, device))
    run("all_gather_into_tensor.1MiB", lambda: ag_into_tensor(3, small),
        gathered(3, small, world, device))

    def ag_list():
        # bf16 as everywhere here: NCCL has no 16-bit integer type.
        outs = [torch.empty(n, dtype=torch.bfloat16, device=device) for _ in range(world)]
        dist.all_gather(outs, pattern(rank, 4, n, device).view(torch.bfloat16))
        return torch.cat(outs).view(torch.int16)

    run("all_gather.list", ag_list, gathered(4, n, world, device))

    def all_reduce():
        # Integer-valued floats: the sum is exact in any order, so the digest is stable.
        x = pattern(rank, 5, n, device).float()
        dist.all_reduce(x)
        return x

    run("all_reduce.sum", all_reduce,
        sum(pattern(r, 5, n, device).float() for r in range(world)), op="allreduce")

    # A new group of every rank: PyTorch splits the default communicator (ncclCommSplit).
    group = dist.new_group(ranks=list(range(world)))
    run("new_group.all_gather_into_tensor", lambda: ag_into_tensor(6, n, group=group),
        gathered(6, n, world, device))

    wrong = 0
    lines = []
    for name, out, expected, route in results:
        ok = torch.equal(out, expected)
        wrong += not ok
        lines.append((name, digest(out), "ok" if ok else "WRONG", route))
    dist.destroy_process_group()

    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "digests.rank%d.txt" % rank), "w") as f:
            f.writelines("%s %s\n" % (name, d) for name, d, _, _ in lines)
    if rank == 0:
        print("collectives: %d ranks, %d MiB all-gathers, zerocta %s" %
              (world, args.mib, zerocta_stats.version() or "not loaded"))
        print("%-34s %-16s %-5s %s" % ("op", "digest", "check", "zerocta route"))
    for name, d, check, route in lines:
        if rank == 0 or check != "ok":
            print("%-34s %-16s %-5s %s%s" % (name, d, check, route,
                                             "" if rank == 0 else " (rank %d)" % rank))
    for line in zerocta_stats.describe(zerocta_stats.snapshot()):
        print("zerocta-stats rank %d: %s" % (rank, line))
    sys.stdout.flush()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
