"""The training step, written once: anchors -> drafter loss -> backward per micro-batch,
then clip + optimizer + schedule. The single-process trainer, the pipeline's drafter
ranks, the bench worker and the capacity measurement all call `train_step`, so what the
bench times is what `dflash train` runs, and a T + D pipeline computes what one process
would (anchors are a function of the global micro-batch index, not of a rank's history).

`mark(stage)` is called as each stage ends (data, transfer, target, anchors,
drafter_fwd, drafter_bwd, optimizer): the bench's stage clock; the trainer passes none.
It adds no synchronisation: a CPU clock reads host time, a CUDA clock records events.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dflash.anchors import sample_anchors
from dflash.config import TrainConfig
from dflash.data.packing import PackedBatch
from dflash.loss import accuracy_per_slot

Mark = Callable[[str], None]


def _no_mark(stage: str) -> None:
    pass


class NonFiniteLoss(RuntimeError):
    pass


@dataclass
class FeatureBatch:
    """One micro-batch as it reaches the drafter: the packed batch and its target features."""

    index: int  # global micro-batch index g: seeds its anchors
    batch: PackedBatch  # on the device
    feats: Tensor  # [R, S, k*H] the target's features for it
    tokens: int | Tensor  # non-padding tokens (a device scalar on pipeline drafters)


@dataclass
class StepResult:
    loss: Tensor  # the last micro-batch's loss (device)
    grad_norm: Tensor  # before clipping (device)
    lr: float  # the learning rate this step used
    tokens: int | Tensor  # summed over the step's micro-batches


def anchor_seed(seed: int, batch_index: int) -> int:
    """Seed of the anchor draw of global micro-batch `batch_index`.

    A pure function of (seed, index), not the state of a per-process generator: the
    drafter rank that trains batch g draws the same anchors as a single process would,
    whichever rank that is and however many batches it saw before.
    """
    state = np.random.SeedSequence([seed, batch_index, 0xA7C]).generate_state(2, np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1  # < 2**63: a valid manual_seed


def autocast(device: torch.device):
    """bf16 autocast on GPU (fp32 master weights); nothing on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def micro_step(
    cfg: TrainConfig,
    step_fn,
    gen: torch.Generator,
    fb: FeatureBatch,
    *,
    scale: int,
    mark: Mark = _no_mark,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Anchors for global batch `fb.index`, drafter loss, backward of loss / scale."""
    b = fb.batch
    gen.manual_seed(anchor_seed(cfg.seed, fb.index))  # host-side, no device sync
    anchors, valid = sample_anchors(
        b.loss_mask, b.doc_ids, cfg.block_size, cfg.max_anchors, generator=gen
    )
    mark("anchors")
    with autocast(b.input_ids.device):
        loss, stats = step_fn(b, fb.feats, anchors, valid)
    mark("drafter_fwd")
    (loss / scale).backward()
    mark("drafter_bwd")
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


def local_batches(run, step: int, mark: Mark = _no_mark) -> Iterator[FeatureBatch]:
    """The step's micro-batches from this process's stream and target (single role)."""
    for i in range(run.cfg.grad_accum):
        host = next(run.stream)
        mark("data")
        b = host.to(run.device, non_blocking=True)
        mark("transfer")
        feats = run.target(b.input_ids, b.positions, b.doc_ids)
        mark("target")
        yield FeatureBatch(step * run.cfg.grad_accum + i, b, feats, b.n_tokens)


def train_step(
    run,
    step: int,
    batches: Iterable[FeatureBatch] | None = None,
    *,
    n_micro: int | None = None,
    model=None,
    acc: Accumulator | None = None,
    mark: Mark = _no_mark,
) -> StepResult:
    """One optimizer step of `run` (dflash.run.Run) over `n_micro` micro-batches
    (default grad_accum) from `batches` (default: local_batches). `model`: what computes
    the loss (default run.step_fn; a pipeline drafter passes its DDP wrapper, whose
    gradients are reduced once, on the last micro-batch)."""
    cfg = run.cfg
    n = n_micro or cfg.grad_accum
    model = model if model is not None else run.step_fn
    source = local_batches(run, step, mark) if batches is None else batches
    loss: Tensor | None = None
    tokens: int | Tensor = 0
    for a, fb in enumerate(islice(source, n)):
        last = a == n - 1
        sync = (
            model.no_sync() if not last and hasattr(model, "no_sync") else contextlib.nullcontext()
        )
        with sync:
            loss, stats = micro_step(cfg, model, run.gen, fb, scale=n, mark=mark)
        if acc is not None:
            acc.add(loss, stats, n, fb.tokens)
        tokens = tokens + fb.tokens
    if loss is None:
        raise RuntimeError(f"step {step}: no micro-batch arrived")
    grad_norm, lr = optimizer_step(cfg, run.drafter.parameters(), run.opt, run.sched)
    mark("optimizer")
    return StepResult(loss, grad_norm, lr, tokens)


class Accumulator:
    """Loss, per-slot accuracy counters, token count and a NaN flag, kept on the device
    between logging steps (reading them is a host-device sync). A DFlash2 drafter's loss
    also counts, per slot, its selector's teacher-forced hits and the true token's
    coverage by the unary top-k (loss_dflash2.py): logged as sel_acc and cand_cover."""

    def __init__(self, block_size: int, device: torch.device) -> None:
        bs = block_size
        # Layout of `flat` (one tensor: the pipeline all_reduces it in one call):
        # [loss_sum, nonfinite, tokens, correct x bs, count x bs, selector_correct x bs,
        #  covered x bs]; the last two stay zero for DFlash.
        self.flat = torch.zeros(3 + 4 * bs, device=device, dtype=torch.float64)
        self.slots = {
            name: slice(3 + i * bs, 3 + (i + 1) * bs)
            for i, name in enumerate(("correct", "count", "selector_correct", "covered"))
        }
        self.selector = False  # set by the first DFlash2 loss added (same on every rank)

    def add(self, loss: Tensor, stats: dict[str, Tensor], scale: int, tokens) -> None:
        f = self.flat
        f[0] += loss.detach() / scale
        f[1] += (~torch.isfinite(loss.detach())).double()
        f[2] += tokens  # host int (single process) or device scalar (pipeline metadata)
        self.selector |= "covered" in stats
        for name, where in self.slots.items():
            if name in stats:
                f[where] += stats[name]

    def reset(self) -> None:
        self.flat.zero_()

    def record(self, step: int, n_logged: int, n_ranks: int = 1) -> dict[str, Any]:
        """Host values (a sync point). `flat` may hold the sum over `n_ranks` drafters."""
        f = self.flat.cpu()
        count = f[self.slots["count"]]
        per_slot = accuracy_per_slot(f[self.slots["correct"]], count)
        seen = [a for a in per_slot if not math.isnan(a)]
        rec = {
            "step": step,
            "loss": f[0].item() / n_ranks / n_logged,
            "acc": sum(seen) / len(seen) if seen else math.nan,
            "acc_per_slot": per_slot,
            "_nonfinite": bool(f[1] > 0),
            "_tokens": int(f[2]),
        }
        if self.selector:  # DFlash2: fractions of every counted position
            total = max(count.sum().item(), 1.0)
            rec["sel_acc"] = f[self.slots["selector_correct"]].sum().item() / total
            rec["cand_cover"] = f[self.slots["covered"]].sum().item() / total
        return rec


def nonfinite_error(step: int, saved_at: int | None) -> NonFiniteLoss:
    where = f"at or before step {step}"
    keep = f"; last good checkpoint: step {saved_at}" if saved_at else ""
    return NonFiniteLoss(
        f"loss became NaN/inf {where}{keep}. Lower --lr, check the data, "
        "or raise --grad-clip; the run was stopped without saving."
    )
