"""Run a workload's repeats, each in a fresh process, and summarise the samples.

Separate processes make repeats independent: allocator state, compile caches held in
memory, thread pools and a lucky or unlucky CPU placement do not carry over. The
comparison's samples are one number per repeat (the workload's sample_quantile of
its steady steps' throughput), so step-to-step correlation inside a process cannot
inflate the significance.

Repeats are forked from a forkserver that has imported torch and transformers once
(~4-10 s on a loaded 2-core host, more than the repeat itself); that server never
runs a tensor op, so no thread pool or allocator state exists before the fork.
"""

from __future__ import annotations

import json
import multiprocessing as mp
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


def _repeat_entry(spec_path: str, out_path: str) -> None:
    from dflash.bench.worker import main

    main([spec_path, out_path])


def run_repeats(w: Workload, log: Callable[[str], object] = print) -> list[dict[str, Any]]:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["dflash.bench.preload"])
    results = []
    with tempfile.TemporaryDirectory(prefix="dflash-bench-") as tmp:
        spec = Path(tmp) / "workload.json"
        spec.write_text(json.dumps(w.definition()))
        import_s = _preload_time(ctx, Path(tmp) / "import.json")
        for i in range(w.repeats):
            out = Path(tmp) / f"repeat{i}.json"
            t0 = time.perf_counter()
            proc = ctx.Process(target=_repeat_entry, args=(str(spec), str(out)))
            proc.start()
            proc.join(REPEAT_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
                raise RepeatFailed(f"repeat {i} did not finish in {REPEAT_TIMEOUT_S:.0f} s")
            if proc.exitcode != 0 or not out.exists():
                raise RepeatFailed(f"repeat {i} exited with {proc.exitcode} (traceback above)")
            res = json.loads(out.read_text())
            res.update(repeat=i, process_s=time.perf_counter() - t0, import_s=import_s)
            results.append(res)
            value = repeat_sample(w, res["steps"])
            extra = ""
            if w.reference:
                raw = repeat_sample(w, res["steps"], "tok_per_cpu_s")
                ref_ms = median([s["ref_s"] for s in res["steps"]]) * 1e3
                extra = f" = {raw:,.0f} tok/cpu-s x reference {ref_ms:.2f} ms"
            log(
                f"  repeat {i + 1}/{w.repeats}: {value:,.0f} {w.unit}{extra} "
                f"(build {res['build_s']:.1f} s, first step {res['first_step_s']:.2f} s, "
                f"process {res['process_s']:.1f} s)"
            )
    return results


def _import_probe(out_path: str) -> None:
    from dflash.bench.preload import IMPORT_S

    Path(out_path).write_text(json.dumps(IMPORT_S))


def _preload_time(ctx, out: Path) -> float:
    """Start the forkserver (it imports the preload) and read how long that took."""
    proc = ctx.Process(target=_import_probe, args=(str(out),))
    proc.start()
    proc.join(REPEAT_TIMEOUT_S)
    if proc.exitcode != 0:
        raise RepeatFailed(
            f"the repeat server failed to import torch/transformers ({proc.exitcode})"
        )
    return float(json.loads(out.read_text()))


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
