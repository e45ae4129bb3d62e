"""Pipeline efficiency: tokens/s of a T-target + D-drafter run divided by the capacity of
its slowest stage measured alone (T x one target's tokens/s, D x one drafter's).

1.0 means the pipeline costs nothing beyond its slowest stage; the gap is transfer,
waiting and imbalance. `measure(...)` returns the figures (for `dflash bench`);
run as a script it prints them as JSON:

    .venv/bin/python bench/pipeline_efficiency.py --targets 1 --drafters 1 --out /tmp/eff \
        -- --max-steps 30 --log-every 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from dflash.components import (
    build_drafter,
    load_target,
    load_tokenizer,
    make_stream,
    resolve_attn,
    resolve_device,
)
from dflash.config import TrainConfig
from dflash.distributed.launch import torchrun_command
from dflash.loop import build_draft_step, build_optimizer, micro_step, optimizer_step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stage_capacity(cfg: TrainConfig, batches: int = 12, warmup: int = 3) -> dict[str, float]:
    """Tokens/s of one target and of one drafter, each alone in this process."""
    device = resolve_device(cfg)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    attn = resolve_attn(cfg, device)
    tok = load_tokenizer(cfg)
    target = load_target(cfg, tok, device, dtype, attn)
    stream = make_stream(cfg, tok)
    data = [next(stream).to(device) for _ in range(batches + warmup)]
    n_tokens = sum(b.n_tokens for b in data[warmup:])

    def timed(fn) -> float:
        for b in data[:warmup]:
            fn(b)
        _sync(device)
        t = time.perf_counter()
        for b in data[warmup:]:
            fn(b)
        _sync(device)
        return n_tokens / (time.perf_counter() - t)

    target_rate = timed(lambda b: target(b.input_ids, b.positions, b.doc_ids))
    feats = {id(b): target(b.input_ids, b.positions, b.doc_ids) for b in data}
    drafter = build_drafter(cfg, target, tok).to(device)
    step_fn = build_draft_step(cfg, drafter, target, device, attn)
    opt, sched = build_optimizer(cfg, drafter.parameters())
    gen = torch.Generator(device=device)

    def train_one(b) -> None:  # one micro-batch + an optimizer step (grad_accum 1)
        micro_step(
            cfg, step_fn, gen, 0, b.input_ids, b.loss_mask, b.doc_ids, b.positions,
            feats[id(b)], scale=1,
        )  # fmt: skip
        optimizer_step(cfg, drafter.parameters(), opt, sched)

    drafter_rate = timed(train_one)
    return {"target_tok_per_s": target_rate, "drafter_tok_per_s": drafter_rate}


def pipeline_rate(cfg: TrainConfig, nproc: int, timeout: float = 600) -> float:
    """Drafter-side tokens/s of a torchrun job, averaged over its logging intervals after
    the first (which holds start-up)."""
    cmd = torchrun_command(cfg, nproc, module="dflash.distributed.rank_cli")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run(cmd, env=env, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
    lines = (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()
    rates = [json.loads(x)["pipe/drafter_tok_per_s"] for x in lines][1:]
    if not rates:
        raise ValueError("need at least two logging steps: raise --max-steps or lower --log-every")
    return sum(rates) / len(rates)


def measure(cfg: TrainConfig) -> dict[str, float | int | str]:
    if not (cfg.targets and cfg.drafters):
        raise ValueError("set --targets and --drafters")
    alone = stage_capacity(cfg)
    stages = {
        "targets": cfg.targets * alone["target_tok_per_s"],
        "drafters": cfg.drafters * alone["drafter_tok_per_s"],
    }
    slowest = min(stages, key=stages.get)
    measured = pipeline_rate(cfg, cfg.targets + cfg.drafters)
    return {
        "targets": cfg.targets,
        "drafters": cfg.drafters,
        "target_alone_tok_per_s": alone["target_tok_per_s"],
        "drafter_alone_tok_per_s": alone["drafter_tok_per_s"],
        "slowest_stage": slowest,
        "capacity_tok_per_s": stages[slowest],
        "measured_tok_per_s": measured,
        "efficiency": measured / stages[slowest],
        "device": str(resolve_device(cfg)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, required=True)
    parser.add_argument("--drafters", type=int, required=True)
    parser.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    parser.add_argument("flags", nargs="*", help="more `dflash train` flags, after --")
    args = parser.parse_args(argv)
    from dflash.train_cli import add_arguments, config_from_args

    train_parser = argparse.ArgumentParser()
    add_arguments(train_parser)
    out = args.out or tempfile.mkdtemp(prefix="dflash-eff-") + "/run"
    base = ["--out", out, "--wandb", "off", "--targets", str(args.targets)]
    base += ["--drafters", str(args.drafters)]
    cfg = config_from_args(train_parser.parse_args(base + args.flags))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(measure(cfg), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
