"""Run a workload's repeats, each in a fresh process, and summarise the samples.

Separate processes make repeats independent: allocator state, compile caches held in
memory, thread pools and a lucky or unlucky CPU placement do not carry over. The
comparison's samples are one number per repeat (the median of its steady steps), so
step-to-step correlation inside a process cannot inflate the significance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash.bench.stats import median
from dflash.bench.workloads import Workload

REPEAT_TIMEOUT_S = 1800.0


class RepeatFailed(RuntimeError):
    pass


def run_repeats(
    w: Workload, log: Callable[[str], object] = print, python: str | None = None
) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="dflash-bench-") as tmp:
        spec = Path(tmp) / "workload.json"
        spec.write_text(json.dumps(w.definition()))
        for i in range(w.repeats):
            out = Path(tmp) / f"repeat{i}.json"
            t0 = time.perf_counter()
            cmd = [python or sys.executable, "-m", "dflash.bench.worker", str(spec), str(out)]
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=REPEAT_TIMEOUT_S, env=dict(os.environ)
            )
            if proc.returncode != 0 or not out.exists():
                tail = (proc.stderr or proc.stdout).strip()[-3000:]
                raise RepeatFailed(f"repeat {i} exited with {proc.returncode}:\n{tail}")
            res = json.loads(out.read_text())
            res["repeat"] = i
            res["process_s"] = time.perf_counter() - t0
            results.append(res)
            value = median([s[w.metric_key] for s in res["steps"]])
            log(
                f"  repeat {i + 1}/{w.repeats}: {value:,.0f} {unit(w)} "
                f"(import {res['import_s']:.1f} s, build {res['build_s']:.1f} s, "
                f"first step {res['first_step_s']:.2f} s)"
            )
    return results


def unit(w: Workload) -> str:
    return "tok/cpu-s" if w.metric == "cpu" else "tok/s"


def summarize(w: Workload, repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-repeat medians (the comparison's samples) and pooled stage medians."""
    key = w.metric_key
    steps = [s for r in repeats for s in r["steps"]]
    stage_names = sorted({k for s in steps for k in s["stages"]})
    steady = median([s["step_s"] for s in steps])
    return {
        "metric": key,
        "unit": unit(w),
        "samples": [median([s[key] for s in r["steps"]]) for r in repeats],
        "wall_tok_per_s": [median([s["tok_per_s"] for s in r["steps"]]) for r in repeats],
        "median": median([median([s[key] for s in r["steps"]]) for r in repeats]),
        "step_s": steady,
        "stages_s": {k: median([s["stages"].get(k, 0.0) for s in steps]) for k in stage_names},
        "import_s": median([r["import_s"] for r in repeats]),
        "build_s": median([r["build_s"] for r in repeats]),
        "first_step_s": median([r["first_step_s"] for r in repeats]),
        # The first step's excess over a steady step: lazy init plus torch.compile.
        "compile_s": max(0.0, median([r["first_step_s"] for r in repeats]) - steady),
        "warmup_s": median([sum(s["step_s"] for s in r["warmup"]) for r in repeats]),
        "process_s": sum(r["process_s"] for r in repeats),
    }
