"""Pipeline workloads: one repeat = one `torchrun` job of the dflash.distributed pipeline.

Targets and drafters run as separate ranks; the drafter lead logs, per step, the
pipeline's tokens/s and each side's compute / wait / idle fractions
(dflash/distributed/telemetry.py). A repeat turns those into the same per-step samples as
the colocated worker: step time, tokens/s and per-stage seconds per step. The
pipeline efficiency (tokens/s divided by the capacity of the slowest stage measured
alone) comes from dflash/bench/capacity.py.
The pipeline loads its target with `load_target`, so these workloads use the tiny
preset's target; a Qwen3-8B-shaped pipeline needs a local HF target directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from dflash.bench.workloads import Workload

# Per-step seconds from the pipeline's fractions: name -> (telemetry key)
STAGE_KEYS = {
    "target_compute": "pipe/target_compute",
    "target_wait_send": "pipe/target_wait_send",
    "target_idle": "pipe/target_idle",
    "drafter_compute": "pipe/drafter_compute",
    "drafter_wait_recv": "pipe/drafter_wait_recv",
    "drafter_idle": "pipe/drafter_idle",
}
TIMEOUT_S = 3600.0


def run_pipeline_repeat(w: Workload, scratch: str) -> dict[str, Any]:
    from dflash.bench.capacity import stage_capacity
    from dflash.bench.workload_setup import train_config
    from dflash.config import TINY_TARGET
    from dflash.distributed.launch import torchrun_command

    if w.target != {**TINY_TARGET, "vocab_size": None}:
        raise NotImplementedError(
            f"workload {w.name}: the pipeline loads targets with load_target, which builds "
            "only the tiny preset's random target without a local HF directory"
        )
    out = Path(scratch) / f"pipe-{os.getpid()}"
    cfg = dataclasses.replace(
        train_config(w, str(out)), targets=w.targets, drafters=w.drafters, log_every=1
    )
    env = {**os.environ, "OMP_NUM_THREADS": str(w.threads or 1)}
    t0 = time.perf_counter()
    cmd = torchrun_command(cfg, w.targets + w.drafters, module="dflash.distributed.rank_cli")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"pipeline job exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    job_s = time.perf_counter() - t0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines if x.strip()]
    tokens = w.tokens_per_step  # RandomStream fills every row exactly
    samples = []
    for r in recs:
        step_s = tokens / r["pipe/drafter_tok_per_s"]
        stages = {name: r[key] * step_s for name, key in STAGE_KEYS.items()}
        samples.append(
            {"step_s": step_s, "tokens": tokens, "tok_per_s": tokens / step_s, "stages": stages}
        )
    warm, steady = samples[: w.warmup_steps], samples[w.warmup_steps :]
    if not steady:
        raise RuntimeError(f"pipeline job logged {len(samples)} steps, need > {w.warmup_steps}")
    result: dict[str, Any] = {
        "pid": os.getpid(),
        "import_s": 0.0,
        "build_s": job_s - sum(s["step_s"] for s in samples),  # start-up, ranks and models
        "first_step_s": warm[0]["step_s"] if warm else steady[0]["step_s"],
        "warmup": warm,
        "steps": steady,
        "threads": w.threads,
        "interop_threads": None,
        "bottleneck": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "",
    }
    alone = stage_capacity(cfg)
    capacity = min(w.targets * alone["target_tok_per_s"], w.drafters * alone["drafter_tok_per_s"])
    rate = sorted(s["tok_per_s"] for s in steady)[len(steady) // 2]
    result["pipeline"] = {**alone, "capacity_tok_per_s": capacity, "efficiency": rate / capacity}
    return result
