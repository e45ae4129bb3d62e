"""Single-process trainer: frozen target -> features -> drafter step, with exact resume.

Per optimizer step: `grad_accum` micro-batches, each one packed batch through the
target (no grad) and the drafter (loss / grad_accum). Loss and accuracy counters stay
on the device and are read only on logging steps, the only host-device sync points.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dflash import checkpoint as ckpt
from dflash.components import (
    build_drafter,
    load_target,
    load_tokenizer,
    make_stream,
    resolve_attn,
    resolve_device,
)
from dflash.config import TrainConfig
from dflash.loop import (
    Accumulator,
    NonFiniteLoss,
    StopFlag,
    build_draft_step,
    build_optimizer,
    catch_signals,
    micro_step,
    nonfinite_error,
    optimizer_step,
    rng_state,
    set_rng_state,
)
from dflash.metrics import MetricsLogger, StepTimer

__all__ = ["NonFiniteLoss", "train"]


def train(
    cfg: TrainConfig, *, stop_after: int | None = None, env_record=None, recipe=None
) -> dict[str, Any]:
    """Run (or resume) training. `stop_after` stops like a signal would after that step
    (used by tests to interrupt deterministically). `recipe`: the recipe file's record
    (path, sha256) for run.json. Returns a summary dict."""
    run_dir = Path(cfg.out)
    record = ckpt.claim_run_dir(run_dir, cfg.to_dict(), cfg.resume, TrainConfig.RESUMABLE_CHANGES)
    if recipe is not None:
        ckpt.update_run_record(run_dir, recipe=recipe)
    device = resolve_device(cfg)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    attn = resolve_attn(cfg, device)

    tokenizer = load_tokenizer(cfg)
    target = load_target(cfg, tokenizer, device, dtype, attn)
    drafter = build_drafter(cfg, target, tokenizer).to(device)  # fp32 master weights
    step_fn = build_draft_step(cfg, drafter, target, device, attn)

    stream = make_stream(cfg, tokenizer)
    opt, sched = build_optimizer(cfg, drafter.parameters())
    # Reseeded per micro-batch from (seed, global batch index): see loop.anchor_seed.
    gen = torch.Generator(device=device).manual_seed(cfg.seed + 1)

    step = 0
    last = ckpt.latest_checkpoint(run_dir) if cfg.resume else None
    if last is not None:
        state = ckpt.load_checkpoint(last, drafter.config)
        drafter.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        stream.load_state_dict(state["data"])
        set_rng_state(gen, state["rng"])
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
            "rng": rng_state(gen),
            "step": at,
        }
        return ckpt.save_checkpoint(run_dir, at, state, cfg.keep_last, drafter.config)

    acc = Accumulator(cfg.block_size, device)
    timer = StepTimer()
    flag = StopFlag()
    last_rec: dict[str, Any] = {}
    saved_at = step if last is not None else None
    bar = tqdm(total=cfg.max_steps, initial=step, desc="train", unit="step", dynamic_ncols=True)

    drafter.train()
    with catch_signals(flag):
        while step < cfg.max_steps:
            for i in range(cfg.grad_accum):
                batch = next(stream).to(device, non_blocking=True)
                feats = target(batch.input_ids, batch.positions, batch.doc_ids)
                g = step * cfg.grad_accum + i  # global micro-batch index
                loss, stats = micro_step(
                    cfg,
                    step_fn,
                    gen,
                    g,
                    batch.input_ids,
                    batch.loss_mask,
                    batch.doc_ids,
                    batch.positions,
                    feats,
                    scale=cfg.grad_accum,
                )
                acc.add(loss, stats, cfg.grad_accum, batch.n_tokens)
            grad_norm, lr = optimizer_step(cfg, drafter.parameters(), opt, sched)
            step += 1
            n_logged = step % cfg.log_every or cfg.log_every
            is_log = step % cfg.log_every == 0 or step == cfg.max_steps
            stopping = flag.signum is not None or (stop_after is not None and step >= stop_after)
            if is_log or stopping:
                rec = acc.record(step, n_logged)  # sync point: logging steps only
                if rec.pop("_nonfinite"):
                    logger.close()
                    bar.close()
                    raise nonfinite_error(step, saved_at)
                dt, _ = timer.lap()
                tokens = rec.pop("_tokens")
                last_rec = {
                    **rec,
                    "lr": lr,
                    "grad_norm": float(grad_norm),
                    "tok_per_s": tokens / dt,
                    "data": stream.stats(),
                }
                bar.write(logger.log(last_rec))
                acc.reset()
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
