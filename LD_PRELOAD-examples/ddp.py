"""DDP training of a tiny GPT, logged bitwise: does zerocta change anything DDP computes?

    torchrun --standalone --nproc-per-node=2 ddp.py [--steps 20] [--warmup 5] [--out run.json]

DistributedDataParallel all-reduces the gradients (NCCL all-reduce, not all-gather), so under
zerocta only the communicators' CTA policy changes; the run shows that this leaves every loss
and the final weights bitwise unchanged. fp32 weights, bf16 autocast (so attention runs on
flash), fp32 loss. Every rank sees its own synthetic data; rank 0 prints each step's loss and
bits, and the record (--out) has the same layout as fsdp2_gpt.py's, for compare_runs.py.
"""

import json
import sys

import train_common  # first: sets the environment NCCL and cuBLAS read at start-up

import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

import gpt_model  # noqa: E402

CONFIG = dict(width=512, depth=4, heads=8, seq=256, batch=8, vocab=8192, mlp_ratio=4, lr=3e-4)


@torch.no_grad()
def init_params(model, cfg, seed, device):
    """The same init as fsdp2_gpt.py's (full values; DDP replicates them)."""
    for index, (name, p) in enumerate(model.named_parameters()):
        p.copy_(gpt_model.full_init_value(name, index, tuple(p.shape), cfg["depth"], seed,
                                          device))


def main():
    p = train_common.common_args(__doc__.split("\n")[0], steps=20, warmup=5)
    args = p.parse_args()
    if args.steps <= args.warmup:
        p.error("--steps must be larger than --warmup")
    cfg = dict(CONFIG)

    train_common.set_determinism(args.deterministic)
    torch.manual_seed(args.seed)
    rank, world, device = train_common.init_distributed()
    if rank == 0:
        print("ddp: config %s" % json.dumps(cfg, sort_keys=True))
        print("ddp: %d ranks, fp32 weights, bf16 autocast, deterministic %s, zerocta %s" %
              (world, args.deterministic, train_common.zerocta_stats.version() or "not loaded"),
              flush=True)

    model = gpt_model.GPT(cfg["vocab"], cfg["width"], cfg["depth"], cfg["heads"], cfg["seq"],
                          cfg["mlp_ratio"]).to(device)
    init_params(model, cfg, args.seed, device)
    n_params = sum(q.numel() for q in model.parameters())
    ddp = DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.AdamW(ddp.parameters(), lr=cfg["lr"], betas=(0.9, 0.95),
                            weight_decay=0.1, fused=True)
    bits, values, step_ms = train_common.train(ddp, opt, cfg, args, rank, world, device,
                                               autocast_dtype=torch.bfloat16)
    # replicated: DDP keeps every rank's weights identical, so compare_runs.py also requires
    # equal checksums across the ranks of one run.
    header = {"name": "ddp", "precision": "fp32 weights, bf16 autocast", "params": n_params,
              "replicated": True}
    status = train_common.report("ddp", args, cfg, header, list(model.parameters()), bits,
                                 values, step_ms, rank, device)
    torch.distributed.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
