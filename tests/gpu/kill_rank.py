"""A rank killed with SIGKILL in the middle of a stream of all-gathers; the others must end.

    torchrun --nproc-per-node=N kill_rank.py

Rank 1 SIGKILLs itself after its 5th all-gather; the other ranks keep issuing all-gathers
until PyTorch's watchdog ends them (TORCH_NCCL_ASYNC_ERROR_HANDLING=3: the process exits;
=1: the communicators are aborted first, then the process exits). The process group timeout
is ZCTEST_KILL_PG_TIMEOUT_S (default 20 s). A surviving rank that gets past 200 all-gathers
after the kill has not noticed it and exits with 3.
"""
import datetime
import os
import signal

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(dev)
    timeout = datetime.timedelta(seconds=int(os.environ.get("ZCTEST_KILL_PG_TIMEOUT_S", "20")))
    dist.init_process_group("nccl", device_id=dev, timeout=timeout)
    world = dist.get_world_size()
    per_rank = 64 << 20
    mine = torch.full((per_rank,), rank, dtype=torch.uint8, device=dev)
    out = torch.empty(per_rank * world, dtype=torch.uint8, device=dev)
    for i in range(205):
        dist.all_gather_into_tensor(out, mine)
        torch.cuda.synchronize()
        if rank == 1 and i == 4:
            print("rank 1: killing myself", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    print(f"rank {rank}: 200 all-gathers after the kill went through", flush=True)
    raise SystemExit(3)


if __name__ == "__main__":
    main()
