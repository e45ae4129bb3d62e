"""What a pipeline drafter's step adds to the bare training step, in one process (CPU).

Times `dflash.step.train_step` over the same micro-batches in four variants, interleaved
round by round so that the host's drift weighs on each alike: plain; with the device-side
metrics Accumulator (every trainer's loop keeps one); wrapped in DDP over a 1-rank gloo
group; both. Prints tokens/s per round and each variant's median ratio to plain.

    .venv/bin/python bench/drafter_step_variants.py --rounds 5 --batches 60
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dflash.run import build_run
from dflash.step import Accumulator, FeatureBatch, train_step
from dflash.train_cli import config_of


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("flags", nargs="*", help="more `dflash train` flags, after --")
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    with tempfile.TemporaryDirectory(prefix="dflash-variants-") as out:  # build_run never writes it
        cfg = config_of(["--wandb", "off", "--out", out, *args.flags])
    run = build_run(cfg, "single")
    data = [next(run.stream).to(run.device) for _ in range(args.batches)]
    feats = [run.target(b.input_ids, b.positions, b.doc_ids) for b in data]
    n_tokens = sum(b.n_tokens for b in data)
    acc = Accumulator(cfg.block_size, run.device)
    ddp = DDP(run.step_fn, broadcast_buffers=False)
    variants: dict[str, dict[str, Any]] = {
        "plain": {},
        "acc": {"acc": acc},
        "ddp": {"model": ddp},
        "ddp+acc": {"model": ddp, "acc": acc},
    }
    rates: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, kw in variants.items():
            t = time.perf_counter()
            for i, b in enumerate(data):
                train_step(run, i, [FeatureBatch(i, b, feats[i], b.n_tokens)], n_micro=1, **kw)
            rates[name].append(n_tokens / (time.perf_counter() - t))
            acc.reset()
    for name, v in rates.items():
        ratio = statistics.median(a / b for a, b in zip(v, rates["plain"], strict=True))
        print(f"{name:8s} tok/s {[round(x) for x in v]}  median ratio to plain {ratio:.3f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
