"""`dflash gpu-check`: is this machine (or image) ready to train on its GPUs? One script.

In order, each a row of the table and an entry of the final JSON line:
  doctor     the environment doctor for a CUDA run: no error, torch's CUDA major, the
             driver and the GPUs through NVML
  steps      the qwen3-8b-1gpu bench workload (Qwen3-8B shapes, random weights),
             compiled: its warm-up, then 20 steps through the bench worker's own step
             (which fails on a non-finite loss); no graph may compile after warm-up
  record     `dflash bench run` of that workload: the stored record (never auto-accepted
             as a baseline; a readiness check is not a reference)
  pipeline   with >= 2 GPUs: a 1 target + 1 drafter NCCL pipeline, 20 steps

`dflash gpu-check` (gpu_check_cli.py) prints the table and one JSON line. `--dry-run` runs the same checks at tiny shapes on CPU: the tiny-cpu workload (compiled),
its bench record (two repeats) in a temporary store, and the 1 + 1 pipeline over gloo. The tests run it,
so the script itself never goes stale. Exit 0 when every check passes (or is skipped).
"""

from __future__ import annotations

import gc
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STEPS = 20  # measured steps after warm-up, and pipeline steps
GPU_WORKLOAD, CPU_WORKLOAD = "qwen3-8b-1gpu", "tiny-cpu"
SUBPROCESS_TIMEOUT_S = 3600


def check_doctor(device: str) -> dict[str, Any]:
    """The doctor for a run on `device`; on CUDA also torch's CUDA build and NVML's GPUs.
    (A CUDA-major mix or a driver too old for torch's CUDA are the doctor's own errors.)"""
    import torch

    from dflash.envcheck.doctor import run_doctor

    report = run_doctor(device=device)
    gpus = [f.details for f in report.findings if f.code == "GPU_INFO"]
    data: dict[str, Any] = {
        "errors": [f"{f.code}: {f.message}" for f in report.findings if f.severity == "error"],
        "warnings": [f.code for f in report.findings if f.severity == "warning"],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "driver": gpus[0].get("driver") if gpus else None,
        "gpu_source": gpus[0].get("source") if gpus else None,
        "gpus": [g.get("name") for g in gpus],
        "fingerprint": report.fingerprint,
    }
    problems = list(data["errors"])
    if device == "cuda":
        if not torch.version.cuda:
            problems.append(f"torch {torch.__version__} is built without CUDA")
        if data["gpu_source"] != "nvml" or not gpus:
            problems.append("no GPU reported through NVML (driver loaded? --gpus all?)")
    detail = "; ".join(problems) or (
        f"clean; torch {torch.__version__} CUDA {torch.version.cuda}, driver "
        f"{data['driver']}, {len(gpus)} GPU(s) via {data['gpu_source']}"
    )
    return {"ok": not problems, "detail": detail, "data": data}


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (recompiles included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def check_steps(workload, scratch: str) -> dict[str, Any]:
    """The workload's warm-up, then STEPS steps of the bench worker's step function."""
    import torch

    from dflash.bench.worker import StageClock, run_steps
    from dflash.bench.workload_setup import build

    if workload.threads is not None:
        torch.set_num_threads(workload.threads)
    p = build(workload, scratch)
    try:
        p.drafter.train()
        clock = StageClock(p.device)
        before = compiled_graphs()
        run_steps(p, workload.warmup_steps, 0, clock)  # raises on a non-finite loss
        warm = compiled_graphs() - before
        rows = run_steps(p, STEPS, workload.warmup_steps, clock)
        after = compiled_graphs() - before - warm
    finally:
        del p
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the bench record's worker builds its own target
    rates = sorted(r["tok_per_s"] for r in rows)
    data = {
        "workload": workload.name,
        "compile": workload.compile,
        "warmup_steps": workload.warmup_steps,
        "steps": len(rows),
        "graphs_in_warmup": warm,
        "recompiles_after_warmup": after,
        "median_tok_per_s": rates[len(rates) // 2],
    }
    problems = []
    if workload.compile and warm == 0:
        problems.append("nothing was compiled in warm-up (is torch.compile active?)")
    if after:
        problems.append(f"{after} graph(s) compiled after warm-up: shapes are not static")
    detail = "; ".join(problems) or (
        f"{len(rows)} steps finite, {warm} graph(s) compiled in warm-up, none after; "
        f"median {data['median_tok_per_s']:.0f} tok/s"
    )
    return {"ok": not problems, "detail": detail, "data": data}


def check_record(workload: str, store: str | None, repeats: int | None) -> dict[str, Any]:
    """`dflash bench run` in its own processes, as the nightly bench runs it."""
    with tempfile.TemporaryDirectory(prefix="dflash-gpu-check-") as tmp:
        out = Path(tmp) / "record.json"
        cmd = [sys.executable, "-m", "dflash", "bench", "run", "--workload", workload]
        cmd += ["--no-auto-accept", "--json-out", str(out)]
        cmd += ["--store", store] if store else []
        cmd += ["--repeats", str(repeats)] if repeats else []
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
        record = json.loads(out.read_text()) if out.exists() else None
    # 0: no regression (or no baseline yet); 3: nothing comparable to compare with.
    ok = proc.returncode in (0, 3) and record is not None
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    detail = f"exit {proc.returncode}" + (f": {tail[-1]}" if tail else "")
    data: dict[str, Any] = {"exit_code": proc.returncode, "command": " ".join(cmd[3:])}
    if record is not None:  # the record itself is in the store; here what identifies it
        data.update({k: record.get(k) for k in ("id", "time", "summary")})
        data["environment_key"] = (record.get("environment") or {}).get("key")
    return {"ok": ok, "detail": detail, "data": data}


def check_pipeline(device: str) -> dict[str, Any]:
    """1 target + 1 drafter ranks under torchrun (NCCL on GPUs, gloo on CPU)."""
    from dflash.config import TrainConfig
    from dflash.distributed.launch import torchrun_command, worker_env

    with tempfile.TemporaryDirectory(prefix="dflash-gpu-check-pipe-") as tmp:
        cfg = TrainConfig(
            out=str(Path(tmp) / "run"),
            preset="tiny",
            device=device,
            targets=1,
            drafters=1,
            max_steps=STEPS,
            log_every=5,
            wandb="off",
        )
        cmd = torchrun_command(cfg, 2, module="dflash.distributed.rank_cli")
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=worker_env(), timeout=SUBPROCESS_TIMEOUT_S
        )
        metrics = Path(cfg.out) / "metrics.jsonl"
        recs = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    backend = "nccl" if device == "cuda" else "gloo"
    losses = [r["loss"] for r in recs]
    problems = []
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        problems.append(f"torchrun exited {proc.returncode}: {tail[0]}")
    if f"1 targets + 1 drafters, {backend}" not in proc.stdout:
        problems.append(f"the ranks did not report a {backend} pipeline")
    if not recs or recs[-1]["step"] != STEPS:
        problems.append(f"logged steps {[r['step'] for r in recs]}, expected up to {STEPS}")
    if not all(math.isfinite(x) for x in losses):
        problems.append(f"non-finite loss: {losses}")
    data = {"backend": backend, "steps": recs[-1]["step"] if recs else 0, "losses": losses}
    if recs:
        data["tok_per_s"] = recs[-1].get("tok_per_s")
        data["bottleneck"] = recs[-1].get("bottleneck")
    detail = "; ".join(problems) or f"{STEPS} steps over {backend}, losses finite"
    return {"ok": not problems, "detail": detail, "data": data}


def run_checks(dry_run: bool, store: str | None) -> list[dict[str, Any]]:
    from dflash.bench.workloads import get_workload

    device = "cpu" if dry_run else "cuda"
    # The dry run compiles too, so the recompile count is exercised at tiny shapes.
    workload = get_workload(CPU_WORKLOAD if dry_run else GPU_WORKLOAD)
    if dry_run:
        workload = workload.with_changes(compile=True)
    results = []

    def run(name: str, fn, *args) -> None:
        t0 = time.perf_counter()
        try:
            res = fn(*args)
        except Exception as e:  # a check that crashes is a failed check, not a traceback
            res = {"ok": False, "detail": f"{type(e).__name__}: {e}".splitlines()[0], "data": {}}
        status = "ok" if res["ok"] else "FAIL"
        results.append({"check": name, "status": status, "seconds": time.perf_counter() - t0,
                        "detail": res["detail"], "data": res["data"]})  # fmt: skip

    run("doctor", check_doctor, device)
    with tempfile.TemporaryDirectory(prefix="dflash-gpu-check-steps-") as scratch:
        run("steps", check_steps, workload, scratch)
    with tempfile.TemporaryDirectory(prefix="dflash-gpu-check-store-") as tmp_store:
        record_store = store or (tmp_store if dry_run else None)
        run("record", check_record, workload.name, record_store, 2 if dry_run else None)
    import torch

    gpus = torch.cuda.device_count() if not dry_run else 0
    if dry_run or gpus >= 2:
        run("pipeline", check_pipeline, device)
    else:
        results.append({"check": "pipeline", "status": "skip", "seconds": 0.0,
                        "detail": f"needs >= 2 GPUs, found {gpus}", "data": {}})  # fmt: skip
    return results


def table(results: list[dict[str, Any]]) -> str:
    rows = [("check", "status", "seconds", "detail")]
    rows += [(r["check"], r["status"], f"{r['seconds']:.1f}", r["detail"]) for r in results]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
        for r in rows
    )
