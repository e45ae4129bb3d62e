"""Pipeline efficiency: tokens/s of a T-target + D-drafter run divided by the capacity of
its slowest stage measured alone (T x one target's tokens/s, D x one drafter's).

1.0 means the pipeline costs nothing beyond its slowest stage; the gap is transfer,
waiting and imbalance. Each stage alone runs the trainer's own setup and step
(dflash/run.py, dflash/step.py). `measure(cfg)` returns the figures, the stages measured
alone before and after the pipeline run; bench/pipeline_efficiency.py repeats it and
prints them as JSON.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dflash.components import resolve_device
from dflash.config import TrainConfig
from dflash.distributed.launch import torchrun_command, worker_env
from dflash.distributed.roles import Layout
from dflash.run import build_run
from dflash.step import Accumulator, FeatureBatch, train_step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stages:
    """One target and one drafter, each alone in this process, built once (the run, its
    batches and their target features) so that they can be timed again and again."""

    def __init__(self, cfg: TrainConfig, batches: int = 12, warmup: int = 3) -> None:
        run = build_run(cfg, "single")
        self.run, self.device, self.warmup = run, run.device, warmup
        self.data = [next(run.stream).to(run.device) for _ in range(batches + warmup)]
        self.n_tokens = sum(b.n_tokens for b in self.data[warmup:])
        target = run.target
        self.feats = {id(b): target(b.input_ids, b.positions, b.doc_ids) for b in self.data}
        # The trainer's step over one micro-batch (grad_accum 1), its metrics accumulated
        # on the device as every trainer's loop does (train.py, drafter_rank.py).
        self.acc = Accumulator(cfg.block_size, run.device)

    def _timed(self, fn) -> tuple[float, float]:
        for b in self.data[: self.warmup]:
            fn(b)
        _sync(self.device)
        t, cpu = time.perf_counter(), time.process_time()
        for b in self.data[self.warmup :]:
            fn(b)
        _sync(self.device)
        n = self.n_tokens
        return n / (time.perf_counter() - t), n / (time.process_time() - cpu)

    def _train_one(self, b) -> None:
        batch = FeatureBatch(0, b, self.feats[id(b)], b.n_tokens)
        train_step(self.run, 0, [batch], n_micro=1, acc=self.acc)

    def measure(self) -> dict[str, float]:
        """Tokens/s of each stage, per wall second and per CPU-second of this process; with
        --pin-cpus each on the CPU its rank is pinned to (`rank_cpus`)."""
        target = self.run.target
        cpus = rank_cpus(self.run.cfg)
        with on_cpu(cpus["target"] if cpus else None):
            t_rate, t_cpu = self._timed(lambda b: target(b.input_ids, b.positions, b.doc_ids))
        with on_cpu(cpus["drafter"] if cpus else None):
            d_rate, d_cpu = self._timed(self._train_one)
        return {
            "target_tok_per_s": t_rate,
            "drafter_tok_per_s": d_rate,
            "target_tok_per_cpu_s": t_cpu,
            "drafter_tok_per_cpu_s": d_cpu,
        }


def rank_cpus(cfg: TrainConfig) -> dict[str, int] | None:
    """With --pin-cpus, the CPUs that drafter 0 and target 0 of a one-node job run their
    steps on (distributed/pipeline.py::_pin: local rank i on the i-th allowed CPU), so that
    each stage alone is timed on the CPU its rank runs on, not on whichever CPU this
    process is given (docs/bench.md, "Pinned ranks' stages are timed alone on their ranks'
    CPUs"). None when the ranks are not pinned."""
    if not (cfg.pin_cpus and cfg.targets and cfg.drafters):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < cfg.targets + cfg.drafters:
        return None  # too few CPUs: the ranks refuse to start (pipeline._pin says why)
    layout = Layout(cfg.targets, cfg.drafters, cfg.grad_accum)  # one node: rank = local rank
    return {"drafter": cpus[layout.drafter_rank(0)], "target": cpus[layout.target_rank(0)]}


@contextlib.contextmanager
def on_cpu(cpu: int | None):
    """Run the block with this thread on `cpu` alone (None: leave it where it may run)."""
    if cpu is None:
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def stage_capacity(cfg: TrainConfig, batches: int = 12, warmup: int = 3) -> dict[str, float]:
    """Tokens/s of one target and of one drafter, each alone in this process, per wall
    second and per CPU-second of this process."""
    return Stages(cfg, batches, warmup).measure()


def cpu_bound(
    cpus_left: float, target_tok_per_cpu_s: float, drafter_tok_per_cpu_s: float, capacity: float
) -> float:
    """The highest efficiency that `cpus_left` cores allow: every token costs one target
    pass and one drafter step, at the CPU-seconds per token of each stage alone, so those
    cores make at most cpus_left / (1/target + 1/drafter) tokens/s; 1.0 when that exceeds
    the slowest stage's capacity (the CPU is then not what limits).

    Beside another tenant this is the part of the shortfall that is arithmetic, not the
    pipeline's: on 2 cores with a tenant taking 0.7 of one, a drafter at 17.4K and a
    target at 24.8K tok/s per CPU-second make at most 1.3 / (1/24.8K + 1/17.4K) = 13.3K
    tok/s, 0.76 of the drafter's capacity, however well they are scheduled."""
    per_token = 1 / target_tok_per_cpu_s + 1 / drafter_tok_per_cpu_s
    return min(1.0, max(cpus_left, 0.0) / per_token / capacity)


# The pipeline's per-interval telemetry kept by `pipeline_rate` (dflash/distributed/telemetry.py)
PIPE_KEYS = ("drafter_tok_per_s", "drafter_compute", "drafter_cpu", "target_cpu")


def pipeline_rate(cfg: TrainConfig, nproc: int, timeout: float = 600) -> dict[str, float]:
    """Means over a torchrun job's logging intervals after the first (which holds
    start-up) of its drafter-side tokens/s, the drafters' compute fraction and each role's
    CPU-seconds per second."""
    cmd = torchrun_command(cfg, nproc, module="dflash.distributed.rank_cli")
    subprocess.run(cmd, env=worker_env(), check=True, timeout=timeout, stdout=subprocess.DEVNULL)
    return interval_means(Path(cfg.out))


def interval_means(run_dir: Path) -> dict[str, float]:
    """PIPE_KEYS averaged over a finished run's logging intervals after the first."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines if x.strip()][1:]
    if not recs:
        raise ValueError("need at least two logging steps: raise --max-steps or lower --log-every")
    return pipe_means(recs)


def pipe_means(recs: list[dict]) -> dict[str, float]:
    """PIPE_KEYS averaged over metrics records (one per logging interval)."""
    return {k: sum(r[f"pipe/{k}"] for r in recs) / len(recs) for k in PIPE_KEYS}


def measure(
    cfg: TrainConfig, batches: int = 12, tenant_cpu: Callable[[], float] | None = None
) -> dict[str, Any]:
    """One pipeline run between two measurements of its stages alone: the capacity is
    the geometric mean of the two, so a drift of the host during the run (another
    tenant starting or stopping, the clock changing) weighs on both sides alike.
    `tenant_cpu`: CPU-seconds used so far by other processes on the host (a tenant's);
    the result then holds what they got per second while the pipeline ran, the highest
    efficiency the CPUs they left allow (`cpu_bound`) and the pipeline's part of it."""
    check_split(cfg)
    # Built afresh each time, so that nothing of it holds memory while the ranks run and
    # "after" starts from the state "before" did.
    before = stage_capacity(cfg, batches)
    tenant0, t0 = tenant_cpu() if tenant_cpu else 0.0, time.perf_counter()
    pipe = pipeline_rate(cfg, cfg.targets + cfg.drafters)
    tenant_got = (tenant_cpu() - tenant0) / (time.perf_counter() - t0) if tenant_cpu else None
    after = stage_capacity(cfg, batches)
    alone = geo_mean(before, after)
    return {**figures(cfg, alone, pipe, tenant_got), "alone_before_after": [before, after]}


def geo_mean(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The stages alone over a stretch of pipeline: the geometric mean of their timings
    just before and just after it, so a drift of the host weighs on both sides alike."""
    return {k: math.sqrt(before[k] * after[k]) for k in before}


def check_split(cfg: TrainConfig) -> None:
    """A pipeline's efficiency needs both roles named."""
    if not (cfg.targets and cfg.drafters):
        raise ValueError("set --targets and --drafters")


def figures(
    cfg: TrainConfig, alone: dict[str, float], pipe: dict[str, float], tenant_got: float | None
) -> dict[str, Any]:
    """The efficiency of a pipeline that ran at `pipe` (PIPE_KEYS) against its stages
    alone at `alone` (Stages.measure), and its factors; with `tenant_got` (the other
    tenants' CPU-seconds per second meanwhile) also what they left (`cpu_bound`)."""
    stages = {
        "targets": cfg.targets * alone["target_tok_per_s"],
        "drafters": cfg.drafters * alone["drafter_tok_per_s"],
    }
    slowest = min(stages, key=lambda k: stages[k])
    measured = pipe["drafter_tok_per_s"]
    efficiency = measured / stages[slowest]
    tenant = {}
    if tenant_got is not None:
        # What the other tenant's CPU leaves of this process's CPUs caps the efficiency;
        # the rest of the shortfall (efficiency / cpu_bound) is the pipeline's own.
        left = len(os.sched_getaffinity(0)) - tenant_got
        bound = cpu_bound(
            left, alone["target_tok_per_cpu_s"], alone["drafter_tok_per_cpu_s"], stages[slowest]
        )
        tenant = {
            "tenant_cpu": tenant_got,
            "cpus_left": left,
            "cpu_bound": bound,
            "efficiency_of_bound": efficiency / bound if bound > 0 else float("nan"),
        }
    # Efficiency = compute x share x work / alone_cpu, exactly: the fraction of wall time
    # the drafters spend in their step (the rest is waiting on targets), the CPU-seconds
    # they got per second of that step (below 1: runnable, but another process had the
    # core), how far each CPU-second of the pipeline's step goes against one of the step
    # alone (below 1: extra work, e.g. copies, a comms thread), over the CPU-seconds per
    # second the step alone got (about 1: it had a core). One drafter's view; with the
    # drafters slowest it is the pipeline's.
    cpu = pipe["drafter_cpu"]
    per_cpu_s = measured / cfg.drafters / cpu if cpu > 0 else float("nan")
    return {
        "targets": cfg.targets,
        "drafters": cfg.drafters,
        "target_alone_tok_per_s": alone["target_tok_per_s"],
        "drafter_alone_tok_per_s": alone["drafter_tok_per_s"],
        "slowest_stage": slowest,
        "capacity_tok_per_s": stages[slowest],
        "measured_tok_per_s": measured,
        "efficiency": efficiency,
        "drafter_compute": pipe["drafter_compute"],
        "drafter_cpu_share": cpu / pipe["drafter_compute"] if pipe["drafter_compute"] else 0.0,
        "drafter_work_efficiency": per_cpu_s / alone["drafter_tok_per_cpu_s"],
        "drafter_alone_cpu": alone["drafter_tok_per_s"] / alone["drafter_tok_per_cpu_s"],
        "target_cpu": pipe["target_cpu"],
        **tenant,
        "device": str(resolve_device(cfg)),
    }
