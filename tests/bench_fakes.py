"""Synthetic benchmark records for the harness tests: no timing, no models."""

from __future__ import annotations

import copy
import itertools
import random
from typing import Any

from dflash.bench.hardware import hardware_key
from dflash.bench.workloads import get_workload

_clock = itertools.count()


def make_record(
    samples: list[float],
    *,
    workload: str = "tiny-cpu",
    variables: dict[str, str] | None = None,
    stages_ms: dict[str, float] | None = None,
    distributions: dict[str, str] | None = None,
    cpu_count: int = 2,
    variant: str = "cu128",
    dirty: bool = False,
    t: float | None = None,
    reference_ms: float | None = None,
    **workload_changes: Any,
) -> dict[str, Any]:
    """`samples` are the comparison's; with `reference_ms` the record also carries the
    machine-speed reference's time per repeat and (equal, host at 1x) raw samples."""
    w = get_workload(workload).with_changes(**workload_changes)
    t = 1.7e9 + 3600 * next(_clock) if t is None else t  # records sort by time
    stages = {k: v / 1e3 for k, v in (stages_ms or {"target": 50.0, "drafter_fwd": 30.0}).items()}
    hw = {"cpu_model": "Test CPU", "cpu_count": cpu_count, "gpu_models": [], "gpu_count": 0}
    hw.update(driver=None, memory_gib=24.0, hostname="test")
    hw["key"] = hardware_key(hw)
    dists = distributions or {"torch": "2.10.0", "numpy": "2.1.0"}
    manifest = {
        "fingerprint": "fp-" + ",".join(f"{k}={v}" for k, v in sorted(dists.items())),
        "interpreter": {"version": "3.11.7"},
        "distributions": dict(dists),
        "libraries": {},
        "torch": {"__version__": dists.get("torch"), "cuda": "12.8"},
        "variables": {},
    }
    summary = {
        "metric": w.metric_key,
        "unit": w.unit,
        "samples": list(samples),
        "wall_tok_per_s": list(samples),
        "median": sorted(samples)[len(samples) // 2],
        "step_s": sum(stages.values()),
        "stages_s": stages,
        "import_s": 1.0,
        "build_s": 0.1,
        "first_step_s": 0.2,
        "compile_s": 0.1,
        "warmup_s": 0.3,
        "process_s": 5.0,
    }
    if reference_ms is not None:
        summary["reference_s"] = [reference_ms / 1e3] * len(samples)
        summary["uncorrected_metric"] = "tok_per_cpu_s"
        summary["uncorrected_samples"] = list(samples)
    return {
        "schema": 1,
        "id": f"rec-{random.random():.8f}",
        "time_unix": t,
        "time": "2026-01-01T00:00:00Z",
        "workload": {
            "name": w.name,
            "hash": w.hash(),
            "topology": w.topology,
            "definition": w.definition(),
        },
        "hardware": hw,
        "environment": {
            "kind": "host",
            "key": manifest["fingerprint"],
            "fingerprint": manifest["fingerprint"],
            "variant": variant,
            "dirty": dirty,
            "doctor": {"dirty": dirty, "findings": [], "extra": variant},
            "manifest": manifest,
            "runner": "local",
            "image": None,
        },
        "settings": {"threads": 1, "interop_threads": 2, "variables": dict(variables or {})},
        "git": {"revision": "abc", "dirty": False},
        "summary": summary,
        "repeats": [],
    }


def scaled(rec: dict[str, Any], factor: float, host: float = 1.0, **changes: Any) -> dict[str, Any]:
    """A copy of `rec` whose code runs `factor` times as fast on a host running `host`
    times as fast: the comparison's (reference-corrected) samples move by `factor`,
    raw CPU times and the reference's time by the host too."""
    out = copy.deepcopy(rec)
    s = out["summary"]
    s["samples"] = [v * factor for v in s["samples"]]
    s["median"] *= factor
    s["stages_s"] = {k: v / (factor * host) for k, v in s["stages_s"].items()}
    s["step_s"] /= factor * host
    if "reference_s" in s:
        s["reference_s"] = [v / host for v in s["reference_s"]]
        s["uncorrected_samples"] = [v * factor * host for v in s["uncorrected_samples"]]
    out["id"] = f"rec-{random.random():.8f}"
    out["time_unix"] = 1.7e9 + 3600 * next(_clock)
    for k, v in changes.items():
        out[k] = v
    return out
