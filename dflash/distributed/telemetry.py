"""Per-rank time accounting and the one-line bottleneck verdict of every logging step.

Each rank keeps cumulative counters (microseconds computing, waiting to send, waiting to
receive, elapsed, and of CPU time used by the whole process; batches in flight; tokens).
They only grow, so the freshest values of every rank are an elementwise MAX: targets ride
theirs on each batch header, drafters fill their own row, and one all_reduce(MAX) among
drafters on a logging step gathers the whole pipeline. Differences between two logging
steps give the fractions below; idle = elapsed - compute - waits (data loading, packing,
logging, checkpoints). A drafter's compute includes its gradient all_reduce, so time
spent waiting there for a slower drafter counts as compute (drafters get equal work by
construction).

CPU time against wall time tells a rank that computes from one that is runnable but
descheduled: on a shared host, `cpu` below `compute` is the share of its core that other
processes took (docs/bench.md, "Pipeline efficiency, real 1 + 1 on CPU"). It counts every
thread of the process (the communication library's too) and, on GPU, only the host's work.

On GPU the host clock sees kernel launches, not kernels: targets wait on an event after
the forward (charged to compute) and drafters run at most one CUDA queue ahead, so over a
logging interval the host fractions track the device's.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from torch import Tensor

COUNTERS = (
    "compute_us", "wait_send_us", "wait_recv_us", "elapsed_us", "cpu_us", "in_flight", "n", "tokens"
)  # fmt: skip
_C = {name: i for i, name in enumerate(COUNTERS)}


class Clock:
    def __init__(self) -> None:
        self.t0 = time.perf_counter_ns()
        self.cpu0 = time.process_time_ns()
        self.ns = {"compute": 0, "wait_send": 0, "wait_recv": 0}
        self.in_flight = 0  # sum of links' occupancy sampled at each send
        self.n = 0  # samples of in_flight
        self.tokens = 0
        self._inner: list[int] = []

    @contextlib.contextmanager
    def __call__(self, kind: str):
        """Time a span as `kind`. Spans nest and count exclusively: a receive wait inside
        a drafter step's compute span is wait_recv, not compute too."""
        t = time.perf_counter_ns()
        self._inner.append(0)  # time of the spans nested in this one
        try:
            yield
        finally:
            dt = time.perf_counter_ns() - t
            self.ns[kind] += dt - self._inner.pop()
            if self._inner:
                self._inner[-1] += dt

    def counters(self) -> list[int]:
        elapsed = time.perf_counter_ns() - self.t0
        cpu = time.process_time_ns() - self.cpu0
        n = self.ns
        us = [n["compute"] // 1000, n["wait_send"] // 1000, n["wait_recv"] // 1000]
        return [*us, elapsed // 1000, cpu // 1000, self.in_flight, self.n, self.tokens]


def _fractions(delta: Tensor) -> dict[str, float]:
    el = max(float(delta[_C["elapsed_us"]]), 1.0)
    out = {k: float(delta[_C[f"{k}_us"]]) / el for k in ("compute", "wait_send", "wait_recv")}
    out["idle"] = max(0.0, 1.0 - sum(out.values()))
    out["cpu"] = float(delta[_C["cpu_us"]]) / el  # CPU-seconds per second: > 1 with threads
    n = float(delta[_C["n"]])
    out["in_flight"] = float(delta[_C["in_flight"]]) / n if n else 0.0
    out["tok_per_s"] = float(delta[_C["tokens"]]) / (el / 1e6)
    return out


def verdict(t_wait: float, d_wait: float, t_idle: float, d_idle: float) -> str:
    """The bottleneck, named from how long each side waits on the other."""
    if t_wait >= d_wait and t_wait > 0.1:
        line = (
            f"targets wait {t_wait:.0%} on drafters: add drafters or lower "
            "--max-anchors/--draft-layers"
        )
    elif d_wait > 0.1:
        line = (
            f"drafters wait {d_wait:.0%} on targets: add targets (the drafters have spare "
            "capacity: --max-anchors can grow for free)"
        )
    else:
        line = f"balanced: targets wait {t_wait:.0%}, drafters wait {d_wait:.0%}"
    idle = max((t_idle, "targets"), (d_idle, "drafters"))
    if idle[0] > 0.3:
        line += f"; {idle[1]} idle {idle[0]:.0%} (data loading, logging, checkpoints)"
    return line


def summarize(layout, prev: Tensor, cur: Tensor) -> dict[str, Any]:
    """Metrics of the interval between two gathered [world, COUNTERS] snapshots (CPU)."""
    ranks = []
    for r in range(layout.world):
        role, i = layout.role(r)
        ranks.append({"rank": r, "role": role, "index": i, **_fractions(cur[r] - prev[r])})

    def mean(role: str, key: str) -> float:
        vals = [x[key] for x in ranks if x["role"] == role]
        return sum(vals) / len(vals)

    def total(role: str) -> float:
        return sum(x["tok_per_s"] for x in ranks if x["role"] == role)

    # Drafters run in lockstep (DDP's all_reduce every step), so the one still waiting for
    # its batch holds them all, and its peers' time waiting for it reads as compute:
    # the longest receive wait, not the mean, is the group's (lower bound on) wait.
    t_wait = mean("target", "wait_send")
    d_wait = max(x["wait_recv"] for x in ranks if x["role"] == "drafter")
    line = verdict(t_wait, d_wait, mean("target", "idle"), mean("drafter", "idle"))
    flat: dict[str, Any] = {
        "pipe/target_tok_per_s": total("target"),
        "pipe/drafter_tok_per_s": total("drafter"),
        "pipe/target_wait_send": t_wait,
        "pipe/drafter_wait_recv": mean("drafter", "wait_recv"),
        "pipe/drafter_wait_recv_max": d_wait,
        "pipe/target_compute": mean("target", "compute"),
        "pipe/drafter_compute": mean("drafter", "compute"),
        "pipe/target_idle": mean("target", "idle"),
        "pipe/drafter_idle": mean("drafter", "idle"),
        "pipe/target_cpu": mean("target", "cpu"),
        "pipe/drafter_cpu": mean("drafter", "cpu"),
        "pipe/in_flight": mean("target", "in_flight"),
    }
    return {**flat, "bottleneck": line, "ranks": ranks}
