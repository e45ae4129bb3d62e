"""The bench times the trainer's step: the bench worker's steps and `dflash train`'s give
bit-identical losses, gradients and weights on the same batches (one setup, one step)."""

from __future__ import annotations

import json

import torch

from dflash.bench.worker import StageClock, run_steps
from dflash.checkpoint import latest_checkpoint, load_checkpoint
from dflash.config import TrainConfig
from dflash.run import build_run
from dflash.step import train_step
from dflash.train import train

STEPS = 3


def _cfg(out) -> TrainConfig:
    return TrainConfig(out=str(out), max_steps=STEPS, log_every=1, wandb="off", device="cpu")


def _grads(run) -> list[list[torch.Tensor]]:
    """Every parameter's gradient at every step, captured when it has finished
    accumulating (before the optimizer consumes and clears it): [param][step]."""
    params = [p for p in run.drafter.parameters() if p.requires_grad]
    seen: list[list[torch.Tensor]] = [[] for _ in params]
    for i, p in enumerate(params):
        p.register_post_accumulate_grad_hook(lambda p, i=i: seen[i].append(p.grad.clone()))
    return seen


def test_bench_worker_step_is_the_trainers_step(tmp_path):
    train(_cfg(tmp_path / "train"))
    logged = [json.loads(x)["loss"] for x in (tmp_path / "train/metrics.jsonl").open()]
    trained = load_checkpoint(latest_checkpoint(tmp_path / "train"))["model"]

    bench = build_run(_cfg(tmp_path / "bench"))
    bench_grads = _grads(bench)
    bench.drafter.train()
    rows = run_steps(bench, STEPS, 0, StageClock(bench.device))

    direct = build_run(_cfg(tmp_path / "direct"))
    direct_grads = _grads(direct)
    direct.drafter.train()
    losses = [float(train_step(direct, s).loss) for s in range(STEPS)]

    assert [r["loss"] for r in rows] == losses == logged  # exact, not approximately
    assert all(len(g) == STEPS for g in bench_grads + direct_grads)
    for a, b in zip(bench_grads, direct_grads, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    for name, value in bench.drafter.state_dict().items():
        assert torch.equal(value, trained[name]), name
        assert torch.equal(value, direct.drafter.state_dict()[name]), name
    # The stage hook saw every stage of the step, in order.
    assert list(rows[0]["stages"]) == [
        "data", "transfer", "target", "anchors", "drafter_fwd", "drafter_bwd", "optimizer", "wait",
    ]  # fmt: skip
