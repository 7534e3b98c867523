"""A torchrun job that makes one kind of collective and checks its bits.

    torchrun --nproc-per-node=N one_collective.py allreduce|allgather [--nonblocking]

allreduce: one all-reduce (the job of the "Do no harm" measurements). allgather: a few
all_gather_into_tensor calls (in place, as FSDP2 does, and out of place) of random bytes,
checked against the concatenation every rank computes for itself; with --coalesced the first
use of the process group sits inside a coalescing block. Prints "OK <what>" on every rank.
"""
import os
import sys

import torch
import torch.distributed as dist


def main():
    what = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    if what == "allreduce":
        t = torch.full((1024,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        assert torch.all(t == world * (world + 1) / 2), t[:4]
    else:
        gens = [torch.Generator().manual_seed(1000 + r) for r in range(world)]
        for per_rank in (4096, 40 << 20, 64 << 20):
            parts = [torch.randint(0, 256, (per_rank,), dtype=torch.uint8, generator=g)
                     for g in gens]
            want = torch.cat(parts).to(dev)
            out = torch.full((per_rank * world,), 0xEE, dtype=torch.uint8, device=dev)
            mine = parts[rank].to(dev)
            if "--coalesced" in sys.argv and per_rank == 4096:
                with dist._coalescing_manager(device=dev):
                    dist.all_gather_into_tensor(out, mine)
            else:
                dist.all_gather_into_tensor(out, mine)  # out of place
            assert torch.equal(out, want), f"out of place, {per_rank} B per rank"
            out.fill_(0xEE)
            out.narrow(0, per_rank * rank, per_rank).copy_(mine)
            dist.all_gather_into_tensor(out, out.narrow(0, per_rank * rank, per_rank))
            assert torch.equal(out, want), f"in place, {per_rank} B per rank"
    torch.cuda.synchronize()
    dist.destroy_process_group()
    print(f"OK {what} rank {rank}", flush=True)


if __name__ == "__main__":
    main()
