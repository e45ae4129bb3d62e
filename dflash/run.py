"""The run setup, written once: what each role builds from its config, and what a
checkpoint holds.

Every loop starts from `build_run`: the single-process trainer (train.py), the
pipeline's target and drafter ranks (dflash/distributed/), the bench worker and the
capacity measurement (dflash/bench/). A role builds only what it runs:

  single   tokenizer, target, drafter, draft step, optimizer, data stream, anchor RNG
  target   tokenizer, target, data stream (it packs batches and runs the frozen target)
  drafter  tokenizer, the target's embedding and LM head only, drafter, draft step,
           optimizer, anchor RNG (its batches and features arrive over the wire)
"""

from __future__ import annotations

import contextlib
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dflash.components import (
    build_draft_step,
    build_drafter,
    build_optimizer,
    compute_dtype,
    load_target,
    load_tokenizer,
    make_stream,
    resolve_attn,
    resolve_device,
)
from dflash.config import TrainConfig
from dflash.target import TargetFeatures

ROLES = ("single", "target", "drafter")


@dataclass
class Run:
    cfg: TrainConfig
    role: str
    device: torch.device
    dtype: torch.dtype  # the frozen target's (and autocast's on GPU)
    attn: str
    tokenizer: Any
    target: TargetFeatures  # the whole feature pass, or embedding + LM head (drafter role)
    drafter: Any = None  # DFlashDraftModel, fp32 master weights
    step_fn: Any = None  # DraftStep: drafter + the target's frozen embedding and LM head
    # Unset (None) in the roles that do not train or do not read data (see ROLES).
    opt: Any = None  # AdamW
    sched: Any = None
    stream: Any = None  # packed batches (single and target roles)
    gen: Any = None  # torch.Generator for anchors; reseeded per micro-batch (step.anchor_seed)

    def state_dict(self, step: int, data: dict[str, Any] | None = None) -> dict[str, Any]:
        """A checkpoint's contents. `data`: the data position when this role has no stream
        (a pipeline drafter's is the step: batch g is a function of g)."""
        return {
            "model": self.drafter.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "data": self.stream.state_dict() if data is None else data,
            "rng": rng_state(self.gen),
            "step": step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restore a checkpoint; returns its step."""
        self.drafter.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        if self.stream is not None:
            self.stream.load_state_dict(state["data"])
        set_rng_state(self.gen, state["rng"])
        return int(state["step"])


def build_run(
    cfg: TrainConfig,
    role: str = "single",
    device: torch.device | None = None,
    make_target: Callable[..., TargetFeatures] | None = None,
) -> Run:
    """Build `role`'s pieces. `device`: a rank's own device (default: from --device).
    `make_target(tokenizer, device, dtype, attn)`: builds the target instead of the
    preset's tiny one or --target's HF directory (the bench's workload shapes)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    device = device if device is not None else resolve_device(cfg)
    dtype = compute_dtype(device)
    attn = resolve_attn(cfg, device)
    tokenizer = load_tokenizer(cfg)
    make = make_target or (lambda tok, dev, dt, at: load_target(cfg, tok, dev, dt, at))
    if role == "drafter":
        # The drafter's device never holds the target's decoder stack: build on the host,
        # drop the layers, move what is left (embedding, LM head).
        target = make(tokenizer, torch.device("cpu"), dtype, attn)
        target.layers = torch.nn.ModuleList()
        target = target.to(device)
    else:
        # TargetFeatures stops after the deepest selected layer: no later layers, no LM head.
        target = make(tokenizer, device, dtype, attn)
    run = Run(cfg, role, device, dtype, attn, tokenizer, target)
    if role in ("single", "drafter"):  # build_drafter seeds torch's RNG with --seed first
        run.drafter = build_drafter(cfg, target, tokenizer).to(device)  # type: ignore[arg-type]
        run.step_fn = build_draft_step(cfg, run.drafter, target, device, attn)
    if role in ("single", "target"):
        run.stream = make_stream(cfg, tokenizer)
    if role in ("single", "drafter"):
        run.opt, run.sched = build_optimizer(cfg, run.drafter.parameters())
        run.gen = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    return run


def rng_state(gen: torch.Generator) -> dict[str, Any]:
    return {
        "anchor_gen": gen.get_state(),
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def set_rng_state(gen: torch.Generator, state: dict[str, Any]) -> None:
    gen.set_state(state["anchor_gen"])
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


class StopFlag:
    """SIGINT/SIGTERM ask for a clean stop: finish the step, checkpoint, exit."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum, frame) -> None:
        self.signum = signum


@contextlib.contextmanager
def catch_signals(flag: StopFlag):
    old = {s: signal.signal(s, flag) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def open_logger(run_dir, cfg: TrainConfig, step: int, record: dict | None, env_record: dict | None):
    """The run's metrics logger (metrics.jsonl, and wandb when cfg.wandb says so),
    resuming at `step`; a new wandb run's id goes into the run record, so a resume
    continues the same wandb run."""
    from dflash import checkpoint as ckpt
    from dflash.metrics import MetricsLogger

    extra = {"dirty_env": True} if env_record and env_record.get("dirty") else {}
    known = (record or {}).get("wandb_id")
    logger = MetricsLogger(
        run_dir,
        config=cfg.to_dict(),
        wandb_mode=cfg.wandb,
        resume_step=step,
        wandb_id=known,
        extra=extra,
    )
    if logger.wandb_id and not known:
        ckpt.update_run_record(run_dir, wandb_id=logger.wandb_id)
    return logger
