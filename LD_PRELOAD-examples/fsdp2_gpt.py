"""FSDP2 training of a small GPT with explicit all-gather prefetching, timed and bitwise logged.

    torchrun --standalone --nproc-per-node=2 fsdp2_gpt.py --config compute|comm|comm-narrow|host-bound|tiny
        [--steps 60] [--warmup 10] [--prefetch 2] [--seed 1234]
        [--deterministic strict|warn|off] [--out run.json] [--profile-steps N [--keep-trace]]
        [--grad-divide F]

Precision: fp32 sharded master weights and optimizer state; MixedPrecisionPolicy(param_dtype
bf16, reduce_dtype fp32), so blocks compute in bf16, all-gathers move bf16 and gradients are
reduce-scattered in fp32. The loss is computed in fp32. FSDP2 reduces them with ncclAvg; with
--grad-divide F (not the number of ranks) it divides by F instead, which PyTorch 2.11 does with a
pre-multiplied sum by 1/F (ncclRedOpCreatePreMulSum, a host scalar) - the reduce-scatter route's
other reduction.

FSDP2 (`fully_shard`) per block, then the root (embeddings, final LN, head). Every FSDP module
prefetches the all-gathers of the next --prefetch blocks in forward and of the previous ones in
backward (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch), so all-gathers
run on FSDP's all-gather stream while the current block computes - the overlap zerocta's
copy-engine route is meant to improve.

Rank 0 prints every step's loss (repr of the Python float, and the fp32 tensor's bits in hex)
and its step time, and with --out writes a JSON record that compare_runs.py reads: per-rank
loss bits, per-step time (slowest rank), median, a checksum of every rank's parameter shards
after the last step, versions, and zerocta's counters when it is preloaded.

--profile-steps N profiles the last N steps with torch.profiler on every rank and measures how
much of the step the all-gathers are exposed, i.e. run on the GPU while no compute kernel does
(exposed_comm.py says how activities are classified); rank 0 prints one line for all ranks and
the record's "profile" holds every rank's numbers. Profiling only observes: the losses and
weights are those of an unprofiled run, but the profiled steps run slower and are left out of
the timing. Each rank's trace is written next to --out (NAME.trace-rankR.json; without --out
into the temporary directory) and deleted after the analysis unless --keep-trace.
"""

import json
import sys

import train_common  # first: sets the environment NCCL and cuBLAS read at start-up

import torch  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

import gpt_model  # noqa: E402

# Pinned configurations (batch sequences of seq tokens per rank), meant for H200s, 2 ranks
# and up. A block has 12 * width^2 parameters, all-gathered in bf16 once in forward and once
# in backward:
# - compute: long sequences and several of them per rank, so each block's all-gather hides
#   behind its matmuls and attention (a compute-bound step).
# - comm: twice the width (4x the all-gather bytes per block) and 512 tokens per rank, so
#   little compute hides the all-gathers and reduce-scatters (a communication-bound step).
#   Memory is dominated by the sharded fp32 weights, gradients and AdamW state; the record
#   has each rank's peak (peak_gib).
# - comm-narrow: 8 blocks of width 4096, one sequence of 256 tokens per rank: the all-gathers
#   (about 400 MB per block) and the host's launches both weigh on a short step.
# - host-bound: width 2048, 128 tokens: so little compute that the host's launches and calls
#   pace the GPU, and any host time a call adds comes straight out of the step.
# - tiny: a seconds-long smoke run of the same code.
CONFIGS = {
    "compute": dict(width=4096, depth=8, heads=32, seq=4096, batch=4, vocab=32768,
                    mlp_ratio=4, lr=2e-4),
    "comm": dict(width=8192, depth=8, heads=64, seq=512, batch=1, vocab=32768,
                 mlp_ratio=4, lr=1e-4),
    "comm-narrow": dict(width=4096, depth=8, heads=32, seq=256, batch=1, vocab=32768,
                        mlp_ratio=4, lr=2e-4),
    "host-bound": dict(width=2048, depth=8, heads=16, seq=128, batch=1, vocab=32768,
                       mlp_ratio=4, lr=2e-4),
    "tiny": dict(width=256, depth=2, heads=4, seq=128, batch=2, vocab=1024,
                 mlp_ratio=4, lr=1e-3),
}
PRECISION = "fp32 master + AdamW state; bf16 compute and all-gather; fp32 reduce-scatter"


def build_model(cfg, prefetch, device, grad_divide=None):
    """The GPT on the meta device, sharded with fully_shard, then materialised (uninitialised)
    on `device`: no rank ever holds the whole fp32 model. grad_divide: every FSDP module's
    gradient divide factor (None: FSDP2's default, the average)."""
    with torch.device("meta"):
        model = gpt_model.GPT(cfg["vocab"], cfg["width"], cfg["depth"], cfg["heads"],
                              cfg["seq"], cfg["mlp_ratio"])
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = list(model.blocks)
    for block in blocks:
        fully_shard(block, mp_policy=mp)
    # The root's parameters (head, final LN) are needed again at the start of backward:
    # keeping them unsharded after forward saves one all-gather per step.
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    if prefetch > 0:
        for i, block in enumerate(blocks):
            ahead = blocks[i + 1:i + 1 + prefetch]
            behind = blocks[max(0, i - prefetch):i][::-1]  # nearest first
            if ahead:
                block.set_modules_to_forward_prefetch(ahead)
            if behind:
                block.set_modules_to_backward_prefetch(behind)
        # The root runs first in forward and its head first in backward: let it start the
        # first blocks' all-gathers too.
        model.set_modules_to_forward_prefetch(blocks[:prefetch])
        model.set_modules_to_backward_prefetch(blocks[::-1][:prefetch])
    if grad_divide is not None:
        for module in [*blocks, model]:
            module.set_gradient_divide_factor(grad_divide)
    model.to_empty(device=device)
    return model


@torch.no_grad()
def init_params(model, cfg, seed, rank, world, device):
    """Each parameter's full value is generated (identically on every rank) and the rank
    keeps its dim-0 shard, the rows fully_shard gives it (chunks of ceil(n/world) rows)."""
    for index, (name, p) in enumerate(model.named_parameters()):
        full = gpt_model.full_init_value(name, index, tuple(p.shape), cfg["depth"], seed, device)
        local = p.to_local() if isinstance(p, DTensor) else p
        if isinstance(p, DTensor):
            n = full.shape[0]
            rows = -(-n // world)
            start = min(rank * rows, n)
            expected = max(0, min(n, start + rows) - start)
            if local.shape[0] != expected or tuple(local.shape[1:]) != tuple(full.shape[1:]):
                raise RuntimeError("unexpected shard of %s: %s (expected %d rows of %s)" %
                                   (name, tuple(local.shape), expected, tuple(full.shape)))
            full = full[start:start + expected]
        local.copy_(full)


def main():
    p = train_common.common_args(__doc__.split("\n")[0], steps=60, warmup=10)
    p.add_argument("--config", choices=sorted(CONFIGS), default="compute")
    p.add_argument("--prefetch", type=int, default=2, help="blocks prefetched ahead (0 = off)")
    p.add_argument("--profile-steps", type=int, default=0, metavar="N",
                   help="profile the last N steps for the exposed all-gather share (0 = off)")
    p.add_argument("--keep-trace", action="store_true",
                   help="keep each rank's exported trace of the profiled steps")
    p.add_argument("--grad-divide", type=float, default=None, metavar="F",
                   help="divide gradients by F (a pre-multiplied sum when F is not the ranks)")
    args = p.parse_args()
    if args.grad_divide is not None and args.grad_divide <= 0:
        p.error("--grad-divide must be positive")
    if args.profile_steps < 0:
        p.error("--profile-steps must not be negative")
    if args.steps <= args.warmup + args.profile_steps:
        p.error("--steps must be larger than --warmup plus --profile-steps")
    cfg = dict(CONFIGS[args.config])

    train_common.set_determinism(args.deterministic)
    torch.manual_seed(args.seed)
    rank, world, device = train_common.init_distributed()
    if rank == 0:
        print("fsdp2_gpt: config %s %s" % (args.config, json.dumps(cfg, sort_keys=True)))
        print("fsdp2_gpt: %d ranks, %s, prefetch %d, deterministic %s, zerocta %s" %
              (world, PRECISION, args.prefetch, args.deterministic,
               train_common.zerocta_stats.version() or "not loaded"), flush=True)

    model = build_model(cfg, args.prefetch, device, args.grad_divide)
    init_params(model, cfg, args.seed, rank, world, device)
    n_params = sum(q.numel() for q in model.parameters())  # DTensor numel: the global size
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95),
                            weight_decay=0.1, fused=True)
    profiler = (train_common.StepProfiler(args.steps - args.profile_steps, args.profile_steps,
                                          args.out, rank, args.keep_trace)
                if args.profile_steps else None)
    bits, values, step_ms = train_common.train(model, opt, cfg, args, rank, world, device,
                                               profiler=profiler)
    header = {"name": args.config, "precision": PRECISION, "params": n_params,
              "prefetch": args.prefetch, "grad_divide": args.grad_divide}
    shards = [q.to_local() if isinstance(q, DTensor) else q for q in model.parameters()]
    status = train_common.report("fsdp2_gpt", args, cfg, header, shards, bits, values, step_ms,
                                 rank, device, profiler)
    torch.distributed.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
