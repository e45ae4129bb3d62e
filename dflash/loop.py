"""Loop pieces shared by the single-process trainer and the pipeline's drafter ranks.

One source of truth for: the draft step and its compilation, the optimizer and LR
schedule, per-batch anchor seeding, one micro-batch (anchors -> loss -> backward), the
optimizer step, the on-device accumulators and the logged record. Both loops call these,
so a 2-target + 2-drafter run computes the same thing as one process would.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dflash.anchors import sample_anchors
from dflash.config import TrainConfig
from dflash.draft_step import DraftStep
from dflash.loss import accuracy_per_slot


class NonFiniteLoss(RuntimeError):
    pass


def cosine_lambda(total: int, warmup_ratio: float, min_ratio: float):
    warmup = max(1, math.ceil(total * warmup_ratio)) if warmup_ratio > 0 else 0

    def fn(step: int) -> float:  # step = number of optimizer steps taken so far
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


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


def anchor_seed(seed: int, batch_index: int) -> int:
    """Seed of the anchor draw of global micro-batch `batch_index`.

    A pure function of (seed, index), not the state of a per-process generator: the
    drafter rank that trains batch g draws the same anchors as a single process would,
    whichever rank that is and however many batches it saw before.
    """
    state = np.random.SeedSequence([seed, batch_index, 0xA7C]).generate_state(2, np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1  # < 2**63: a valid manual_seed


def build_draft_step(cfg: TrainConfig, drafter, target, device: torch.device, attn: str):
    """DraftStep over the drafter and the target's frozen embedding and LM head."""
    create_fn = None
    if attn == "flex" and (cfg.compile or device.type == "cuda"):
        from torch.nn.attention.flex_attention import create_block_mask

        # Uncompiled, create_block_mask materialises the dense Q x KV grid.
        create_fn = torch.compile(create_block_mask)
    step_fn = DraftStep(
        drafter,
        target.embed_tokens,
        target.lm_head,
        gamma=cfg.gamma,
        loss_chunk=cfg.loss_chunk,
        attn=attn,
        create_block_mask_fn=create_fn,
    )
    if cfg.compile:
        # Main thread, static shapes (fixed token budget and max_anchors): compiled once.
        drafter.forward = torch.compile(drafter.forward)
    return step_fn


def build_optimizer(cfg: TrainConfig, params):
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, cosine_lambda(cfg.max_steps, cfg.warmup_ratio, cfg.min_lr_ratio)
    )
    return opt, sched


class Accumulator:
    """Loss, per-slot accuracy counters, token count and a NaN flag, kept on the device
    between logging steps (reading them is a host-device sync)."""

    def __init__(self, block_size: int, device: torch.device) -> None:
        self.bs = block_size
        # Layout of `flat`: [loss_sum, nonfinite, tokens, correct x bs, count x bs]
        self.flat = torch.zeros(3 + 2 * block_size, device=device, dtype=torch.float64)

    def add(self, loss: Tensor, stats: dict[str, Tensor], scale: int, tokens) -> None:
        f = self.flat
        f[0] += loss.detach() / scale
        f[1] += (~torch.isfinite(loss.detach())).double()
        f[2] += tokens  # host int (single process) or device scalar (pipeline metadata)
        f[3 : 3 + self.bs] += stats["correct"]
        f[3 + self.bs :] += stats["count"]

    def reset(self) -> None:
        self.flat.zero_()

    def record(self, step: int, n_logged: int, n_ranks: int = 1) -> dict[str, Any]:
        """Host values (a sync point). `flat` may hold the sum over `n_ranks` drafters."""
        f = self.flat.cpu()
        per_slot = accuracy_per_slot(f[3 : 3 + self.bs], f[3 + self.bs :])
        seen = [a for a in per_slot if not math.isnan(a)]
        return {
            "step": step,
            "loss": f[0].item() / n_ranks / n_logged,
            "acc": sum(seen) / len(seen) if seen else math.nan,
            "acc_per_slot": per_slot,
            "_nonfinite": bool(f[1] > 0),
            "_tokens": int(f[2]),
        }


def micro_step(
    cfg: TrainConfig,
    step_fn,
    gen: torch.Generator,
    batch_index: int,
    input_ids: Tensor,
    loss_mask: Tensor,
    doc_ids: Tensor,
    positions: Tensor,
    feats: Tensor,
    *,
    scale: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Anchors for global batch `batch_index`, drafter loss, backward of loss / scale."""
    gen.manual_seed(anchor_seed(cfg.seed, batch_index))  # host-side, no device sync
    anchors, valid = sample_anchors(
        loss_mask, doc_ids, cfg.block_size, cfg.max_anchors, generator=gen
    )
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if input_ids.device.type == "cuda"
        else contextlib.nullcontext()
    )
    with autocast:
        loss, stats = step_fn(input_ids, loss_mask, doc_ids, positions, feats, anchors, valid)
    (loss / scale).backward()
    return loss, stats


def optimizer_step(cfg: TrainConfig, params, opt, sched) -> tuple[Tensor, float]:
    """Clip, step, schedule; returns (grad norm on the device, lr used)."""
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    lr = sched.get_last_lr()[0]
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return grad_norm, lr


def nonfinite_error(step: int, saved_at: int | None) -> NonFiniteLoss:
    where = f"at or before step {step}"
    keep = f"; last good checkpoint: step {saved_at}" if saved_at else ""
    return NonFiniteLoss(
        f"loss became NaN/inf {where}{keep}. Lower --lr, check the data, "
        "or raise --grad-clip; the run was stopped without saving."
    )
