"""Metrics: one console line per logging step, RUN/metrics.jsonl, wandb (offline default).

The step timer reads the clock only on logging steps (after the caller has synced the
device), so nothing forces a host-device sync between logging steps.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


class StepTimer:
    """Wall time between two logging steps (read only there: no per-step sync)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def lap(self) -> float:
        """Seconds since the last lap; starts the next one."""
        now = time.perf_counter()
        dt, self.t0 = max(now - self.t0, 1e-9), now
        return dt


def format_line(rec: dict[str, Any]) -> str:
    acc_slots = rec.get("acc_per_slot") or []
    head = " ".join(f"{a:.2f}" for a in acc_slots[:4] if not math.isnan(a))
    selector = ""
    if "sel_acc" in rec:  # DFlash2: the selector's hits and the top-k's coverage
        selector = f"sel {rec['sel_acc']:.3f} cover {rec['cand_cover']:.3f} | "
    return (
        f"step {rec['step']:>6} | loss {rec['loss']:.4f} | acc {rec['acc']:.3f} "
        f"(slots 1-4: {head}) | {selector}lr {rec['lr']:.2e} | gnorm {rec['grad_norm']:.3f} | "
        f"{rec['tok_per_s']:,.0f} tok/s"
    )


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        *,
        config: dict[str, Any],
        wandb_mode: str,
        resume_step: int = 0,
        wandb_id: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.path = run_dir / METRICS_FILE
        if self.path.exists():
            # On resume, drop lines past the checkpoint: those steps run again.
            keep = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(k + "\n" for k in keep))
        self.file = open(self.path, "a")  # noqa: SIM115  held for the run, closed in close()
        self.extra = extra or {}
        self.wandb = None
        if wandb_mode != "off":
            import wandb

            self.wandb = wandb.init(
                project="dflash",
                dir=str(run_dir),
                mode=wandb_mode,  # type: ignore[arg-type]  # validated: TrainConfig CHOICES
                config={**config, **self.extra},
                id=wandb_id,
                resume="allow" if wandb_id else None,
            )

    @property
    def wandb_id(self) -> str | None:
        return self.wandb.id if self.wandb is not None else None

    def log(self, rec: dict[str, Any]) -> str:
        # `time`: the wall clock at writing (Unix seconds), to line a record up with what
        # else happened on the host; wandb keeps its own timestamp.
        rec = {**rec, **self.extra, "time": round(time.time(), 3)}
        self.file.write(json.dumps(rec) + "\n")
        self.file.flush()
        if self.wandb is not None:
            flat = {k: v for k, v in rec.items() if isinstance(v, int | float) and k != "time"}
            for k, a in enumerate(rec.get("acc_per_slot", []), start=1):
                flat[f"acc_slot/{k}"] = a
            self.wandb.log(flat, step=rec["step"])
        return format_line(rec)

    def close(self) -> None:
        self.file.close()
        if self.wandb is not None:
            self.wandb.finish()
