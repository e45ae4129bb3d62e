"""Run a workload's repeats, each in a fresh process, and summarise the samples.

Separate processes make repeats independent: allocator state, compile caches held in
memory, thread pools and a lucky or unlucky CPU placement do not carry over. The
comparison's samples are one number per repeat (the workload's sample_quantile of
its steady steps' throughput), so step-to-step correlation inside a process cannot
inflate the significance.

Each repeat is a new interpreter of the environment, started the way `dflash train`
starts (envs.py): its start-up and import time are measured and reported apart from
the steady state. `run_pairs` measures two environments in pairs for the paired verdict
(paired.py): at the same time, one per core, with their steady phases started together
(`concurrent_pairs`), or back to back with the order alternating.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash.bench.envs import BARRIER_ENV, BenchEnv
from dflash.bench.stats import median
from dflash.bench.workloads import Workload

if TYPE_CHECKING:
    from dflash.bench.image_env import ImageEnv

REPEAT_TIMEOUT_S = 1800.0
# Stop a paired run early when the verdict cannot change: after DECISIVE_PAIRS pairs
# that all differ by more than 2x in the same direction (a busy thread that holds the
# GIL made `dflash train` 70x slower: 10 such pairs would take an hour). Six pairs of
# one sign already give the exact Wilcoxon p = 1/64.
DECISIVE_PAIRS = 6
DECISIVE_FACTOR = 2.0


class RepeatFailed(RuntimeError):
    pass


def run_one(
    w: Workload,
    env: BenchEnv | ImageEnv,
    spec: Path,
    tmp: Path,
    index: int,
    log: Callable[[str], object],
) -> dict[str, Any]:
    """One repeat of `w` in a fresh process of `env`; its result with timings."""
    out = tmp / f"{env.label}-repeat{index}.json"
    t0 = time.perf_counter()
    try:
        code = env.run(spec, out, REPEAT_TIMEOUT_S)  # a BenchEnv or an image_env.ImageEnv
    except OSError as exc:
        raise RepeatFailed(f"{env.label} repeat {index}: cannot start {env.where}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise RepeatFailed(
            f"{env.label} repeat {index} did not finish in {REPEAT_TIMEOUT_S:.0f} s"
        ) from exc
    if code != 0 or not out.exists():
        raise RepeatFailed(
            f"{env.label} repeat {index} ({env.where}) exited with {code} (traceback above)"
        )
    res = json.loads(out.read_text())
    res.update(repeat=index, process_s=time.perf_counter() - t0, env=env.label)
    value = repeat_sample(w, res["steps"])
    extra = ""
    if w.reference:
        raw = repeat_sample(w, res["steps"], "tok_per_cpu_s")
        ref_ms = median([s["ref_s"] for s in res["steps"]]) * 1e3
        extra = f" = {raw:,.0f} tok/cpu-s x reference {ref_ms:.2f} ms"
    log(
        f"  {env.label} repeat {index + 1}: {value:,.0f} {w.unit}{extra} "
        f"(start-up {res['startup_s']:.1f} s, import {res['import_s']:.1f} s, "
        f"build {res['build_s']:.1f} s, first step {res['first_step_s']:.2f} s, "
        f"process {res['process_s']:.1f} s)"
    )
    return res


def run_repeats(
    w: Workload, log: Callable[[str], object] = print, env: BenchEnv | None = None
) -> list[dict[str, Any]]:
    """`w.repeats` repeats in one environment (default: this interpreter's)."""
    env = env or BenchEnv.current()
    with tempfile.TemporaryDirectory(prefix="dflash-bench-") as tmp:
        spec = Path(tmp) / "workload.json"
        spec.write_text(json.dumps(w.definition()))
        return [run_one(w, env, spec, Path(tmp), i, log) for i in range(w.repeats)]


def concurrent_pairs(w: Workload, a: BenchEnv | ImageEnv, b: BenchEnv | ImageEnv) -> str:
    """Why a pair's two repeats run back to back, or "" when they run at the same time.

    At the same time, the shared host's speed is the same for both sides by
    construction: back to back, one pair's log ratio scattered with an SD of 8% on the
    2-core CI machine (the host's drift between two 15 s windows), which hid a 10%
    change in half of the runs (docs/bench.md). It needs a CPU workload of one thread
    per process (each side then has a core of its own; its metric, CPU time, does not
    count the time a third process takes) and two host processes (a container's
    repeat cannot see the host's rendezvous directory)."""
    if w.pair_mode != "concurrent":
        return f"the workload's pair_mode is {w.pair_mode!r}"
    if w.device != "cpu" or w.threads != 1 or w.pipeline:
        return "only a one-thread CPU workload in one process can share the host per core"
    if not (isinstance(a, BenchEnv) and isinstance(b, BenchEnv)):
        return "container repeats run one at a time"
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        return f"{cpus} usable CPU: two repeats at once need two"
    return ""


def run_pairs(
    w: Workload,
    candidate: BenchEnv | ImageEnv,
    baseline: BenchEnv | ImageEnv,
    log: Callable[[str], object] = print,
    pairs: int | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`pairs` (default w.repeats) pairs, each a candidate and a baseline repeat.
    Concurrent (see `concurrent_pairs`): both start together and wait for each other
    before their steady steps. Otherwise back to back, the order alternating (candidate
    first in even pairs) so that a drift of the host within a pair favours neither
    side. Returns (candidate, baseline) repeats; each repeat's `paired_mode` says which."""
    n = pairs or w.repeats
    why_not = concurrent_pairs(w, candidate, baseline)
    mode = "back to back" if why_not else "concurrent"
    log(
        f"  pairs: {mode}"
        + (f" ({why_not})" if why_not else ", one core each, steady steps started together")
    )
    cand, base = [], []
    with tempfile.TemporaryDirectory(prefix="dflash-bench-") as tmp:
        spec = Path(tmp) / "workload.json"
        spec.write_text(json.dumps(w.definition()))
        for i in range(n):
            order = (candidate, baseline) if i % 2 == 0 else (baseline, candidate)
            if why_not:
                got = {e.label: run_one(w, e, spec, Path(tmp), i, log) for e in order}
            else:
                got = _run_together(w, order, spec, Path(tmp), i, log)
            for r in got.values():
                r["paired_mode"] = mode
            cand.append(got[candidate.label])
            base.append(got[baseline.label])
            ratios = [
                repeat_sample(w, c["steps"]) / repeat_sample(w, b["steps"])
                for c, b in zip(cand, base, strict=True)
            ]
            log(f"  pair {i + 1}/{n}: candidate/baseline {ratios[-1]:.3f}x")
            if decisive(ratios) and i + 1 < n:
                log(
                    f"  stopping after {i + 1} pairs: every pair differs by more than "
                    f"{DECISIVE_FACTOR:g}x in the same direction"
                )
                break
    return cand, base


def _run_together(
    w: Workload,
    envs: tuple[BenchEnv | ImageEnv, ...],
    spec: Path,
    tmp: Path,
    index: int,
    log: Callable[[str], object],
) -> dict[str, dict[str, Any]]:
    """Both repeats of a pair at once. Each worker drops a file into a fresh rendezvous
    directory after its warm-up and waits for the other's (worker.rendezvous); when a
    repeat ends, for whatever reason, its thread drops one too, so a crashed side never
    keeps the other waiting."""
    meet = tmp / f"rendezvous{index}"
    meet.mkdir()

    def one(e: BenchEnv | ImageEnv) -> dict[str, Any]:
        assert isinstance(e, BenchEnv)  # concurrent_pairs allows host processes only
        together = dataclasses.replace(
            e, variables={**e.variables, BARRIER_ENV: f"{meet}{os.pathsep}{len(envs)}"}
        )
        try:
            return run_one(w, together, spec, tmp, index, log)
        finally:
            (meet / f"ended-{e.label}").touch()

    with ThreadPoolExecutor(len(envs)) as pool:
        futures = {e.label: pool.submit(one, e) for e in envs}
        return {label: f.result() for label, f in futures.items()}


def decisive(ratios: list[float]) -> bool:
    if len(ratios) < DECISIVE_PAIRS:
        return False
    limit = math.log(DECISIVE_FACTOR)
    logs = [math.log(r) for r in ratios]
    return all(v < -limit for v in logs) or all(v > limit for v in logs)


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def repeat_sample(w: Workload, steps: list[dict[str, Any]], key: str | None = None) -> float:
    return quantile([s[key or w.metric_key] for s in steps], w.sample_quantile)


def summarize(w: Workload, repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-repeat samples (the comparison's) and pooled stage medians."""
    key = w.metric_key
    steps = [s for r in repeats for s in r["steps"]]
    stage_names = sorted({k for s in steps for k in s["stages"]})
    # Step time on the metric's clock, so stage shares of a change add up.
    clock = "cpu_s" if w.metric == "cpu" else "step_s"
    steady = median([s.get(clock, s["step_s"]) for s in steps])
    return {
        "metric": key,
        "unit": w.unit,
        "samples": [repeat_sample(w, r["steps"]) for r in repeats],
        "sample_quantile": w.sample_quantile,
        "wall_tok_per_s": [median([s["tok_per_s"] for s in r["steps"]]) for r in repeats],
        "median": median([repeat_sample(w, r["steps"]) for r in repeats]),
        "step_s": steady,
        "stages_s": {k: median([s["stages"].get(k, 0.0) for s in steps]) for k in stage_names},
        "startup_s": median([r.get("startup_s", 0.0) for r in repeats]),
        "import_s": median([r["import_s"] for r in repeats]),
        "build_s": median([r["build_s"] for r in repeats]),
        "first_step_s": median([r["first_step_s"] for r in repeats]),
        # The first step's excess over a steady step: lazy init plus torch.compile.
        "compile_s": max(
            0.0,
            median([r["first_step_s"] for r in repeats]) - median([s["step_s"] for s in steps]),
        ),
        "warmup_s": median([sum(s["step_s"] for s in r["warmup"]) for r in repeats]),
        "process_s": sum(r["process_s"] for r in repeats),
        "pipeline_efficiency": median([r["pipeline"]["efficiency"] for r in repeats])
        if all("pipeline" in r for r in repeats)
        else None,
        **(_reference_summary(w, repeats) if w.reference else {}),
    }


def _reference_summary(w: Workload, repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """The machine-speed reference's own figures, and the uncorrected samples."""
    return {
        # Median reference time per repeat: how fast the host was (lower = faster).
        "reference_s": [median([s["ref_s"] for s in r["steps"]]) for r in repeats],
        "uncorrected_metric": "tok_per_cpu_s",
        "uncorrected_samples": [repeat_sample(w, r["steps"], "tok_per_cpu_s") for r in repeats],
    }
