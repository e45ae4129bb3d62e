"""Single-process trainer: frozen target -> features -> drafter step, with exact resume.

Per optimizer step: `grad_accum` micro-batches, each one packed batch through the
target (no grad) and the drafter (loss / grad_accum). Loss and accuracy counters stay
on the device and are read only on logging steps, the only host-device sync points.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from dflash import checkpoint as ckpt
from dflash.config import TrainConfig
from dflash.metrics import StepTimer
from dflash.run import StopFlag, build_run, catch_signals, open_logger
from dflash.step import Accumulator, NonFiniteLoss, nonfinite_error, train_step

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
    run = build_run(cfg, "single")
    drafter, stream = run.drafter, run.stream

    step = 0
    last = ckpt.latest_checkpoint(run_dir) if cfg.resume else None
    if last is not None:
        step = run.load_state_dict(ckpt.load_checkpoint(last, drafter.config))
        print(f"resumed from {last} at step {step}")

    logger = open_logger(run_dir, cfg, step, record, env_record)
    if env_record is not None:
        ckpt.update_run_record(run_dir, environment=env_record)

    def save(at: int) -> Path:
        return ckpt.save_checkpoint(run_dir, at, run.state_dict(at), cfg.keep_last, drafter.config)

    acc = Accumulator(cfg.block_size, run.device)
    timer = StepTimer()
    flag = StopFlag()
    last_rec: dict[str, Any] = {}
    saved_at = step if last is not None else None
    bar = tqdm(total=cfg.max_steps, initial=step, desc="train", unit="step", dynamic_ncols=True)

    drafter.train()
    with catch_signals(flag):
        while step < cfg.max_steps:
            res = train_step(run, step, acc=acc)
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
                dt = timer.lap()
                tokens = rec.pop("_tokens")
                last_rec = {
                    **rec,
                    "lr": res.lr,
                    "grad_norm": float(res.grad_norm),
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
