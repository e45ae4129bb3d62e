"""The pipeline at topologies this machine cannot host: stage costs from a hardware profile.

`python -m dflash.distributed.rank_cli --simulate PROFILE.json FLAGS` runs the real
pipeline (torchrun processes, gloo transfers of the real [rows, seq_len] metadata,
back-pressure through --max-in-flight, control messages, telemetry, the bottleneck line,
checkpoints) with two stand-ins: a target's forward and a drafter's micro-batch become
waits that take no CPU (time.sleep), sized by the profile for the batch's rows x seq_len
token slots (shapes are static, so a real stage costs the same for every batch), and a
drafter step holds the gradient all_reduce among drafters that DDP would do (on a small
tensor, overlapping the last micro-batch as DDP's bucket reductions overlap its backward). Time is scaled: `time_scale` real seconds per simulated second, so
a drafter step of seconds takes tens of milliseconds here. Features are scaled in width
only: [rows, seq_len, feat_dim] fp32 instead of [rows, seq_len, k*H] (memory; see
docs/bench.md, "Pipeline at real topologies (simulated)").

`run_topology` launches one such job and returns its efficiency against the profile's
slowest stage; bench/pipeline_sim.py prints it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


class ProfileError(ValueError):
    """A bad profile field; the message names it."""


@dataclass(frozen=True)
class Profile:
    name: str
    target_tok_per_s: float  # one target's forward, token slots per simulated second
    drafter_tok_per_s: float  # one drafter's training, token slots per simulated second
    time_scale: float = 0.02  # real seconds per simulated second
    feat_dim: int = 4  # width of the features on the wire (the real k*H, scaled down)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProfileError(f"profile field name: must be a non-empty string, got {self.name!r}")
        for f in ("target_tok_per_s", "drafter_tok_per_s", "time_scale"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ProfileError(f"profile field {f}: must be a number > 0, got {v!r}")
        if isinstance(self.feat_dim, bool) or not isinstance(self.feat_dim, int):
            raise ProfileError(f"profile field feat_dim: must be an integer, got {self.feat_dim!r}")
        if self.feat_dim < 1:
            raise ProfileError(f"profile field feat_dim: must be >= 1, got {self.feat_dim}")

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ProfileError(f"--simulate {path}: cannot read a JSON profile: {e}") from None
        known = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(raw, dict) or set(raw) - known:
            extra = sorted(set(raw) - known) if isinstance(raw, dict) else raw
            raise ProfileError(
                f"--simulate {path}: unknown profile fields {extra}; known: {sorted(known)}"
            )
        try:
            return cls(**raw)
        except TypeError as e:  # a missing required field
            raise ProfileError(f"--simulate {path}: {e}") from None

    def capacity(self, targets: int, drafters: int) -> dict[str, float]:
        """Simulated tok/s of each side at full speed."""
        return {
            "targets": targets * self.target_tok_per_s,
            "drafters": drafters * self.drafter_tok_per_s,
        }

    def target(self, rows: int, seq: int) -> Callable[..., torch.Tensor]:
        """Stand-in for run.target: waits for one forward and leaves the (scaled) features
        in `out` unwritten: the simulated drafter step never reads their values."""
        wait = Wait(rows * seq / self.target_tok_per_s * self.time_scale)

        def forward(ids, pos, docs, out: torch.Tensor) -> torch.Tensor:
            wait()
            return out

        return forward

    def drafter_step(self, group) -> Callable[..., Any]:
        """Stand-in for step.train_step on a pipeline drafter: receives each micro-batch
        (the iterator does the real receive), waits for its training, and all_reduces a
        small tensor over the drafters as DDP does on the last micro-batch."""
        from itertools import islice

        from dflash.step import StepResult

        grad = torch.zeros(64)
        waits: list[Wait] = []

        def step(run, step: int, batches, *, n_micro: int, model=None, acc=None) -> StepResult:
            if not waits:
                slots = run.cfg.rows * run.cfg.seq_len
                waits.append(Wait(slots / self.drafter_tok_per_s * self.time_scale))
            tokens: Any = 0
            work: Any = None
            for a, fb in enumerate(islice(batches, n_micro)):
                if a == n_micro - 1:
                    # DDP reduces gradient buckets while the last backward still runs:
                    # post the reduction as that micro-batch starts, wait at its end.
                    # Drafters stay in lockstep within a step, and the reduction's own
                    # latency (ms on gloo here) overlaps the step as on GPUs.
                    work = dist.all_reduce(grad, group=group, async_op=True)
                waits[0]()
                tokens = tokens + fb.tokens
            if work is not None:
                work.wait()
            zero = torch.zeros(())
            return StepResult(zero, zero, 0.0, tokens)

        return step


class Wait:
    """A stage's cost as a sleep of `seconds`, calibrated: what the host's scheduler adds
    to one sleep (wake-up latency, worst on a loaded host) is taken off the next, so the
    stage's busy time per batch averages the profile's. Sleeping takes no CPU."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.debt = seconds, 0.0

    def __call__(self) -> None:
        t = time.perf_counter()
        time.sleep(max(0.0, self.seconds - self.debt))
        self.debt += time.perf_counter() - t - self.seconds


def efficiency(profile: Profile, targets: int, drafters: int, real_tok_per_s: float) -> dict:
    """Measured (real) drafter tok/s, converted to simulated time, over the slowest side."""
    stages = profile.capacity(targets, drafters)
    slowest = min(stages, key=lambda k: stages[k])
    sim = real_tok_per_s * profile.time_scale
    return {
        "slowest_stage": slowest,
        "capacity_tok_per_s": stages[slowest],
        "measured_tok_per_s": sim,
        "efficiency": sim / stages[slowest],
    }


def run_topology(
    targets: int,
    drafters: int,
    profile_path: str | Path,
    steps: int,
    out: str | Path,
    *,
    rows: int = 16,
    seq_len: int = 3072,
    log_every: int = 10,
    max_in_flight: int = 2,
    timeout: float = 900,
) -> dict[str, Any]:
    """Run T + D simulated ranks under torchrun on this host; returns efficiency, the last
    bottleneck line and the job's wall time. Intervals after the first are averaged (the
    first holds start-up)."""
    profile = Profile.load(profile_path)
    flags = ["--targets", str(targets), "--drafters", str(drafters), "--max-steps", str(steps)]
    flags += ["--rows", str(rows), "--seq-len", str(seq_len), "--log-every", str(log_every)]
    flags += ["--max-in-flight", str(max_in_flight), "--out", str(out), "--wandb", "off"]
    flags += ["--min-doc-len", "256", "--max-doc-len", str(seq_len), "--device", "cpu"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(targets + drafters), "-m", "dflash.distributed.rank_cli"]
    cmd += ["--simulate", str(profile_path), *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group: killable as a whole
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        msg = f"simulated {targets}+{drafters} exceeded {timeout}s:\n{log[-3000:]}"
        raise RuntimeError(msg) from None
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"simulated {targets}+{drafters} failed:\n{log[-3000:]}")
    recs = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    rates = [r["pipe/drafter_tok_per_s"] for r in recs][1:]
    if not rates:
        raise ValueError("need at least two logging steps: raise steps or lower log_every")
    res = efficiency(profile, targets, drafters, statistics.mean(rates))
    return {
        "targets": targets,
        "drafters": drafters,
        "profile": profile.name,
        **res,
        "bottleneck": recs[-1]["bottleneck"],
        "target_wait_send": statistics.mean(r["pipe/target_wait_send"] for r in recs[1:]),
        "drafter_wait_recv": statistics.mean(r["pipe/drafter_wait_recv"] for r in recs[1:]),
        "drafter_wait_recv_max": statistics.mean(r["pipe/drafter_wait_recv_max"] for r in recs[1:]),
        "wall_s": wall,
    }
