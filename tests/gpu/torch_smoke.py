#!/usr/bin/env python3
"""PyTorch smoke test for zerocta: torchrun --nproc-per-node=N tests/gpu/torch_smoke.py

Runs the collectives PyTorch programs issue (all_reduce, all_gather_into_tensor on the
current/default stream and with async_op=True, list all_gather with equal and unequal sizes,
a coalesced group of all-gathers, reduce_scatter_tensor, broadcast, an all-gather on a
new_group) on deterministic inputs. Every rank checks what it can exactly (gathers and
broadcasts against regenerated inputs); rank 0 prints one line per op

    digest <name> <sha256 of the result's bytes>

so that a run with LD_PRELOAD=libzerocta.so and one without can be compared with
`grep ^digest | diff`. It also prints `zerocta-loaded yes|no` and, when the shim is loaded,
its all-gather counters per route. Exit status 0 only if every check passed.
"""
import ctypes
import datetime
import hashlib
import os
import struct
import sys

# The shared GPU hosts must never use NVLink multicast.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SEED = 1234


def sha256(t):
    data = t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def make_input(rank, tag, numel, dtype):
    """Rank `rank`'s input for op `tag`: any rank can regenerate any other rank's input."""
    g = torch.Generator().manual_seed(SEED + rank + 1000 * tag)
    return torch.randn(numel, generator=g, dtype=torch.float32).to(dtype)


class Smoke:
    def __init__(self):
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        self.failures = []

    def emit(self, name, result):
        torch.cuda.synchronize(self.device)
        if self.rank == 0:
            print(f"digest {name} {sha256(result)}", flush=True)

    def expect_equal(self, name, got, want):
        torch.cuda.synchronize(self.device)
        got_b = got.detach().contiguous().cpu().view(torch.uint8)
        want_b = want.detach().contiguous().cpu().view(torch.uint8)
        if got_b.shape != want_b.shape:
            self.fail(name, f"shape {tuple(got.shape)} != {tuple(want.shape)}")
            return
        diff = (got_b != want_b).nonzero()
        if diff.numel():
            self.fail(name, f"{diff.numel()} bytes differ, first at byte {int(diff[0])}")

    def fail(self, name, why):
        msg = f"FAIL {name} rank={self.rank}: {why}"
        print(msg, file=sys.stderr, flush=True)
        self.failures.append(msg)

    def inputs(self, tag, numel, dtype):
        return [make_input(q, tag, numel, dtype) for q in range(self.world)]

    def gathered_expectation(self, tag, numel, dtype):
        return torch.cat(self.inputs(tag, numel, dtype))

    # --- the ops ---------------------------------------------------------------------------

    def all_reduce(self):
        numel = (1 << 20) + 5
        x = make_input(self.rank, 1, numel, torch.float32).to(self.device)
        dist.all_reduce(x)
        want = torch.stack(self.inputs(1, numel, torch.float32)).sum(0)
        if not torch.allclose(x.cpu(), want, rtol=1e-5, atol=1e-5):
            self.fail("all_reduce", "sum differs from the host sum beyond rounding")
        self.emit("all_reduce_f32", x)

    def all_gather_sync(self):
        # The caller's current stream: PyTorch's default, i.e. the legacy NULL stream.
        for tag, numel, dtype in [(2, 7, torch.bfloat16), (3, (1 << 20) + 13, torch.bfloat16),
                                  (4, 16 << 20, torch.float32)]:
            x = make_input(self.rank, tag, numel, dtype).to(self.device)
            out = torch.empty(numel * self.world, dtype=dtype, device=self.device)
            out.fill_(7)
            dist.all_gather_into_tensor(out, x)
            name = f"all_gather_into_tensor_sync_{str(dtype)[6:]}_{numel}"
            self.expect_equal(name, out, self.gathered_expectation(tag, numel, dtype))
            self.emit(name, out)

    def all_gather_on_side_stream(self):
        numel = (4 << 20) + 1
        x = make_input(self.rank, 5, numel, torch.bfloat16).to(self.device)
        out = torch.empty(numel * self.world, dtype=torch.bfloat16, device=self.device)
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            dist.all_gather_into_tensor(out, x)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        name = "all_gather_into_tensor_user_stream"
        self.expect_equal(name, out, self.gathered_expectation(5, numel, torch.bfloat16))
        self.emit(name, out)

    def all_gather_async(self):
        numel = (8 << 20) + 3
        x = make_input(self.rank, 6, numel, torch.float16).to(self.device)
        out = torch.empty(numel * self.world, dtype=torch.float16, device=self.device)
        work = dist.all_gather_into_tensor(out, x, async_op=True)
        work.wait()
        name = "all_gather_into_tensor_async"
        self.expect_equal(name, out, self.gathered_expectation(6, numel, torch.float16))
        self.emit(name, out)

    def all_gather_list(self):
        numel = (2 << 20) + 9
        x = make_input(self.rank, 7, numel, torch.float32).to(self.device)
        outs = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(outs, x)
        got = torch.cat(outs)
        self.expect_equal("all_gather_list", got, self.gathered_expectation(7, numel,
                                                                             torch.float32))
        self.emit("all_gather_list", got)

    def all_gather_list_uneven(self):
        # Unequal sizes: PyTorch issues a group of broadcasts.
        sizes = [1000 + 4097 * q for q in range(self.world)]
        x = make_input(self.rank, 8, sizes[self.rank], torch.float32).to(self.device)
        outs = [torch.empty(s, dtype=torch.float32, device=self.device) for s in sizes]
        dist.all_gather(outs, x)
        got = torch.cat(outs)
        want = torch.cat([make_input(q, 8, sizes[q], torch.float32) for q in range(self.world)])
        self.expect_equal("all_gather_list_uneven", got, want)
        self.emit("all_gather_list_uneven", got)

    def all_gather_coalesced(self):
        cm_factory = getattr(dist, "_coalescing_manager", None)
        if cm_factory is None:
            print("skip all_gather_coalesced: no torch.distributed._coalescing_manager",
                  flush=True)
            return
        specs = [(9, (1 << 20) + 1, torch.bfloat16), (10, 3, torch.bfloat16),
                 (11, (6 << 20) + 7, torch.bfloat16)]
        ins = [make_input(self.rank, t, n, d).to(self.device) for t, n, d in specs]
        outs = [torch.empty(n * self.world, dtype=d, device=self.device) for _, n, d in specs]
        with cm_factory(device=self.device, async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.all_gather_into_tensor(o, i)
        cm.wait()
        for (t, n, d), o in zip(specs, outs):
            name = f"all_gather_coalesced_{n}"
            self.expect_equal(name, o, self.gathered_expectation(t, n, d))
            self.emit(name, o)

    def reduce_scatter(self):
        numel = (1 << 20) + 3
        x = make_input(self.rank, 12, numel * self.world, torch.bfloat16).to(self.device)
        out = torch.empty(numel, dtype=torch.bfloat16, device=self.device)
        dist.reduce_scatter_tensor(out, x)
        self.emit("reduce_scatter_tensor_bf16", out)

    def broadcast(self):
        numel = (3 << 20) + 11
        root = self.world - 1
        x = make_input(self.rank, 13, numel, torch.float32).to(self.device)
        dist.broadcast(x, src=root)
        self.expect_equal("broadcast", x, make_input(root, 13, numel, torch.float32))
        self.emit("broadcast", x)

    def new_group_all_gather(self):
        group = dist.new_group(ranks=list(range(self.world)))
        numel = (5 << 20) + 17
        x = make_input(self.rank, 14, numel, torch.bfloat16).to(self.device)
        out = torch.empty(numel * self.world, dtype=torch.bfloat16, device=self.device)
        dist.all_gather_into_tensor(out, x, group=group)
        name = "new_group_all_gather"
        self.expect_equal(name, out, self.gathered_expectation(14, numel, torch.bfloat16))
        self.emit(name, out)
        dist.destroy_process_group(group)

    def run(self):
        for op in [self.all_reduce, self.all_gather_sync, self.all_gather_on_side_stream,
                   self.all_gather_async, self.all_gather_list, self.all_gather_list_uneven,
                   self.all_gather_coalesced, self.reduce_scatter, self.broadcast,
                   self.new_group_all_gather]:
            op()
            dist.barrier(device_ids=[self.device.index])


def shim_report(rank):
    """Says whether libzerocta.so is in the process and prints its all-gather counters."""
    lib = ctypes.CDLL(None)
    if not hasattr(lib, "zerocta_get_stats"):
        print(f"zerocta-loaded no rank={rank}", flush=True)
        return
    # zerocta_stats_t begins with counters[op][route] of {uint64 calls, uint64 bytes}, and
    # all-gather is op 0: its routes are the first entries. Names come from the shim itself.
    buf = ctypes.create_string_buffer(1 << 16)
    if lib.zerocta_get_stats(buf) != 0:
        print(f"zerocta-loaded yes rank={rank} (zerocta_get_stats failed)", flush=True)
        return
    route_name = lib.zerocta_route_name
    route_name.restype = ctypes.c_char_p
    route_name.argtypes = [ctypes.c_int]
    rows = []
    for r in range(64):
        name = route_name(r)
        if not name:
            break
        calls, nbytes = struct.unpack_from("<QQ", buf, 16 * r)
        rows.append(f"{name.decode()}={calls}/{nbytes}B")
    print(f"zerocta-loaded yes rank={rank} allgather " + " ".join(rows), flush=True)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(SEED + int(os.environ.get("RANK", local_rank)))
    timeout = datetime.timedelta(seconds=int(os.environ.get("ZCTEST_TORCH_TIMEOUT_S", "300")))
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank), timeout=timeout)
    smoke = Smoke()
    if smoke.rank == 0:
        print(f"torch {torch.__version__} nccl {torch.cuda.nccl.version()} "
              f"world {smoke.world}", flush=True)
    smoke.run()
    shim_report(smoke.rank)
    dist.destroy_process_group()
    if smoke.failures:
        print(f"torch_smoke: {len(smoke.failures)} FAILED checks on rank {smoke.rank}",
              file=sys.stderr, flush=True)
        return 1
    if smoke.rank == 0:
        print("torch_smoke: all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
