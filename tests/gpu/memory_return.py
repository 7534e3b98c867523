"""What the route holds of memory the application freed, and how it copes with few descriptors.

Two processes, one GPU each, PyTorch with expandable segments (its 20 MiB cuMem allocations, what
the route imports across processes); run it under the library (zerocta-run --allgather auto, or
LD_PRELOAD with ZEROCTA_ALLGATHER=auto) and without it, the reference.

  python3 memory_return.py free   [GIB]   all-gathers into outputs of GIB GiB (default 2), frees
                                          them, empty_cache(), then NO collective: prints each
                                          rank's free GPU memory (cudaMemGetInfo) before, right
                                          after, and every 250 ms for 3 s, and its open
                                          descriptors; "returned_after_s" is when free memory
                                          came back to the baseline (within 64 MiB)
  python3 memory_return.py fds    [GIB]   the same all-gather (default 10 GiB outputs) after
                                          setrlimit(RLIMIT_NOFILE, 1024): result checked exactly

Prints "memory_return <mode> rank=R key=value ..." lines; exit 0 when every check passed.
Skips (exit 0, a SKIP line) without two GPUs.
"""
import os
import resource
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 1 << 20
BASELINE_SLACK = 64 * MIB  # what the context, NCCL and the caching allocator may keep


def open_fds():
    return len(os.listdir("/proc/self/fd"))


def say(mode, rank, **kv):
    print(f"memory_return {mode} rank={rank} " + " ".join(f"{k}={v}" for k, v in kv.items()),
          flush=True)


def gather_once(rank, gib):
    """One all-gather into a fresh output of `gib` GiB, its result checked exactly."""
    per_rank = int(gib * (1 << 30)) // 2 // 4  # fp32 elements
    out = torch.empty(2 * per_rank, dtype=torch.float32, device="cuda")
    mine = out.narrow(0, rank * per_rank, per_rank)
    mine.fill_(float(rank + 1))
    dist.all_gather_into_tensor(out, mine)  # in place, as FSDP2
    torch.cuda.synchronize()
    ok = all(bool((out.narrow(0, r * per_rank, per_rank) == float(r + 1)).all()) for r in range(2))
    return out, ok


def run(rank, mode, gib, path):
    torch.cuda.set_device(rank)
    store = dist.FileStore(path, 2)
    if mode == "fds":
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    dist.init_process_group("nccl", rank=rank, world_size=2, store=store,
                            device_id=torch.device("cuda", rank))
    warm, _ = gather_once(rank, 0.0625)  # the route prepared, NCCL's buffers made
    del warm
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    store.set(f"warm{rank}", "1")
    store.wait([f"warm{1 - rank}"])
    base_free, _ = torch.cuda.mem_get_info()
    base_fds = open_fds()
    out, ok = gather_once(rank, gib)
    say(mode, rank, gathered_gib=gib, data_ok=int(ok), fds_during=open_fds())
    passed = ok
    if mode == "free":
        del out
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        t0 = time.monotonic()
        returned = None
        samples = []
        while time.monotonic() - t0 < 3.0:
            free, _ = torch.cuda.mem_get_info()
            samples.append(f"{time.monotonic() - t0:.2f}:{(base_free - free) // MIB}")
            if returned is None and base_free - free <= BASELINE_SLACK:
                returned = time.monotonic() - t0
            time.sleep(0.25)
        say(mode, rank, held_mib_over_time=",".join(samples),
            returned_after_s=f"{returned:.2f}" if returned is not None else "never",
            fds_before=base_fds, fds_after=open_fds())
        passed = passed and returned is not None and returned <= 1.0
    store.set(f"done{rank}", "1")  # no collective: the store only
    store.wait([f"done{1 - rank}"])
    dist.destroy_process_group()
    say(mode, rank, passed=int(passed))
    sys.exit(0 if passed else 1)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "free"
    gib = float(sys.argv[2]) if len(sys.argv) > 2 else (10.0 if mode == "fds" else 2.0)
    if torch.cuda.device_count() < 2:
        print("memory_return SKIP: needs 2 GPUs")
        return 0
    path = tempfile.mktemp(prefix="memory_return_")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run, args=(r, mode, gib, path)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    codes = [p.exitcode for p in procs]
    print(f"memory_return {mode} exit_codes={codes}", flush=True)
    return 0 if codes == [0, 0] else 1


if __name__ == "__main__":
    sys.exit(main())
