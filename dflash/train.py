"""Single-process trainer: frozen target -> features -> drafter step, with exact resume.

Per optimizer step: `grad_accum` micro-batches, each one packed batch through the
target (no grad) and the drafter (loss / grad_accum). Loss and accuracy counters stay
on the device and are read only on logging steps, the only host-device sync points.
"""

from __future__ import annotations

import contextlib
import math
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from dflash import checkpoint as ckpt
from dflash.anchors import sample_anchors
from dflash.components import (
    build_drafter,
    load_target,
    load_tokenizer,
    make_stream,
    resolve_attn,
    resolve_device,
)
from dflash.config import TrainConfig
from dflash.draft_step import DraftStep
from dflash.loss import accuracy_per_slot
from dflash.metrics import MetricsLogger, StepTimer


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


class _StopFlag:
    """SIGINT/SIGTERM ask for a clean stop: finish the step, checkpoint, exit."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum, frame) -> None:
        self.signum = signum


@contextlib.contextmanager
def _catch_signals(flag: _StopFlag):
    old = {s: signal.signal(s, flag) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _rng_state(gen: torch.Generator) -> dict[str, Any]:
    return {
        "anchor_gen": gen.get_state(),
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def _set_rng_state(gen: torch.Generator, state: dict[str, Any]) -> None:
    gen.set_state(state["anchor_gen"])
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def train(cfg: TrainConfig, *, stop_after: int | None = None, env_record=None) -> dict[str, Any]:
    """Run (or resume) training. `stop_after` stops like a signal would after that step
    (used by tests to interrupt deterministically). Returns a summary dict."""
    run_dir = Path(cfg.out)
    record = ckpt.claim_run_dir(run_dir, cfg.to_dict(), cfg.resume, TrainConfig.RESUMABLE_CHANGES)
    device = resolve_device(cfg)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    attn = resolve_attn(cfg, device)

    tokenizer = load_tokenizer(cfg)
    target = load_target(cfg, tokenizer, device, dtype, attn)
    drafter = build_drafter(cfg, target, tokenizer).to(device)  # fp32 master weights
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

    stream = make_stream(cfg, tokenizer)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, cosine_lambda(cfg.max_steps, cfg.warmup_ratio, cfg.min_lr_ratio)
    )
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 1)

    step = 0
    last = ckpt.latest_checkpoint(run_dir) if cfg.resume else None
    if last is not None:
        state = ckpt.load_checkpoint(last)
        drafter.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        stream.load_state_dict(state["data"])
        _set_rng_state(gen, state["rng"])
        step = state["step"]
        print(f"resumed from {last} at step {step}")

    extra = {"dirty_env": True} if env_record and env_record.get("dirty") else {}
    logger = MetricsLogger(
        run_dir,
        config=cfg.to_dict(),
        wandb_mode=cfg.wandb,
        resume_step=step,
        wandb_id=record.get("wandb_id"),
        extra=extra,
    )
    if logger.wandb_id and not record.get("wandb_id"):
        ckpt.update_run_record(run_dir, wandb_id=logger.wandb_id)
    if env_record is not None:
        ckpt.update_run_record(run_dir, environment=env_record)

    def save(at: int) -> Path:
        state = {
            "model": drafter.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "data": stream.state_dict(),
            "rng": _rng_state(gen),
            "step": at,
        }
        return ckpt.save_checkpoint(run_dir, at, state, cfg.keep_last)

    bs = cfg.block_size
    zeros = lambda: torch.zeros(bs, device=device)  # noqa: E731
    acc_correct, acc_count = zeros(), zeros()
    loss_sum = torch.zeros((), device=device)
    nonfinite = torch.zeros((), dtype=torch.bool, device=device)
    timer = StepTimer()
    flag = _StopFlag()
    last_rec: dict[str, Any] = {}
    saved_at = step if last is not None else None
    bar = tqdm(total=cfg.max_steps, initial=step, desc="train", unit="step", dynamic_ncols=True)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else None

    drafter.train()
    with _catch_signals(flag):
        while step < cfg.max_steps:
            for _ in range(cfg.grad_accum):
                batch = next(stream).to(device, non_blocking=True)
                feats = target(batch.input_ids, batch.positions, batch.doc_ids)
                anchors, valid = sample_anchors(
                    batch.loss_mask, batch.doc_ids, bs, cfg.max_anchors, generator=gen
                )
                with autocast or contextlib.nullcontext():
                    loss, stats = step_fn(
                        batch.input_ids,
                        batch.loss_mask,
                        batch.doc_ids,
                        batch.positions,
                        feats,
                        anchors,
                        valid,
                    )
                (loss / cfg.grad_accum).backward()
                nonfinite |= ~torch.isfinite(loss.detach())
                loss_sum += loss.detach() / cfg.grad_accum
                acc_correct += stats["correct"]
                acc_count += stats["count"]
                timer.add_tokens(batch.n_tokens)
            max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), max_norm)
            lr = sched.get_last_lr()[0]
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            n_logged = step % cfg.log_every or cfg.log_every
            is_log = step % cfg.log_every == 0 or step == cfg.max_steps
            stopping = flag.signum is not None or (stop_after is not None and step >= stop_after)
            if is_log or stopping:
                if bool(nonfinite):  # sync point: logging steps only
                    logger.close()
                    bar.close()
                    where = f"at or before step {step}"
                    keep = f"; last good checkpoint: step {saved_at}" if saved_at else ""
                    raise NonFiniteLoss(
                        f"loss became NaN/inf {where}{keep}. Lower --lr, check the data, "
                        "or raise --grad-clip; the run was stopped without saving."
                    )
                _, tok_s = timer.lap()
                per_slot = accuracy_per_slot(acc_correct, acc_count)
                seen = [a for a in per_slot if not math.isnan(a)]
                last_rec = {
                    "step": step,
                    "loss": loss_sum.item() / n_logged,
                    "acc": sum(seen) / len(seen) if seen else math.nan,
                    "acc_per_slot": per_slot,
                    "lr": lr,
                    "grad_norm": float(grad_norm),
                    "tok_per_s": tok_s,
                    "data": stream.stats(),
                }
                bar.write(logger.log(last_rec))
                acc_correct.zero_()
                acc_count.zero_()
                loss_sum.zero_()
            bar.update(1)
            if stopping or (cfg.save_every and step % cfg.save_every == 0):
                save(step)
                saved_at = step
            if stopping:
                break

    bar.close()
    interrupted = step < cfg.max_steps
    if not interrupted:
        if saved_at != step:
            save(step)
        ckpt.export_drafter(drafter, run_dir)
    logger.close()
    how = "interrupted" if interrupted else "finished"
    print(f"{how} at step {step}; run directory {run_dir}")
    return {"step": step, "interrupted": interrupted, "signal": flag.signum, "last": last_rec}
