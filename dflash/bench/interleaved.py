"""Pipeline efficiency with the stages alone timed during the run, not before and after.

Why: the efficiency divides the pipeline's tokens/s by its stages' alone, and on a VM
whose speed drifts by up to 25% within seconds a repeat timed before and after a 15-s run
reads anywhere from 0.73 to 1.22 on a quiet host (docs/bench.md). Here this process
freezes the ranks (SIGSTOP, every `every` seconds of running), times the stages alone
while nothing else of the job runs, and resumes them (SIGCONT). Each stretch of pipeline
between two freezes is then set against the stages timed just before and just after it,
seconds apart, and the repeat's figures are the medians over its stretches.

A stretch counts only the logging intervals it holds whole: the first interval written
after a resume spans the freeze (its wall time includes it) and is dropped, as is the
run's first (start-up). A frozen rank keeps its sockets and its peers wait on them, so
nothing times out unless a freeze outlasts --dist-timeout.

Limits: lines are told apart by when they reach the file, and the lead drafter writes a
line shortly after its interval ends (after a collective), so a freeze that falls in
that gap, about a millisecond of a logging interval, keeps one interval that spans it
(reading low; the median over stretches absorbs one). The tenants' CPU is counted from a
resume to the next freeze, a little more than the whole intervals. The bench's Stages
keep training between timings (same shapes, so the same cost per step). CPU only:
SIGSTOP stops a rank's threads, not the kernels it has queued on a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflash.bench.capacity import Stages, check_split, figures, geo_mean, pipe_means
from dflash.bench.envs import exit_on_signal
from dflash.components import resolve_device
from dflash.config import TrainConfig
from dflash.distributed.launch import torchrun_command, worker_env, worker_pids


def _complete_lines(path: Path) -> list[dict]:
    """The records of a metrics.jsonl written so far, up to its last newline (a frozen
    rank may have stopped mid-line)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines() if x.strip()]


def process_state(pid: int) -> str:
    """A process's state letter (/proc/PID/stat field 3: R running, S sleeping, T stopped...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _freeze(pids: list[int], timeout: float = 5.0) -> bool:
    """SIGSTOP each and wait until every one reads as stopped (state T in /proc). False,
    with every one resumed, if one has already exited (the job is ending)."""
    deadline = time.monotonic() + timeout
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            while process_state(pid) not in "tT":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rank process {pid} did not stop within {timeout:.0f} s")
                time.sleep(0.001)
    except (ProcessLookupError, FileNotFoundError):
        _resume(pids)
        return False
    return True


def _resume(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def measure_interleaved(
    cfg: TrainConfig,
    batches: int = 12,
    every: float = 6.0,
    tenant_cpu: Callable[[], float] | None = None,
    timeout: float = 1200,
) -> dict[str, Any]:
    """One pipeline run, frozen every `every` seconds while its stages are timed alone
    (`batches` batches each); the figures of capacity.figures for each stretch between
    two freezes, and their medians over the stretches."""
    check_split(cfg)
    device = resolve_device(cfg)
    if device.type != "cpu":
        raise ValueError(
            f"--interleave freezes CPU ranks; this job runs on {device}: drop --interleave"
        )
    stages = Stages(cfg, batches)
    nproc = cfg.targets + cfg.drafters
    log = Path(cfg.out) / "metrics.jsonl"
    log.unlink(missing_ok=True)  # a rerun's old lines would count as this run's
    cmd = torchrun_command(cfg, nproc, module="dflash.distributed.rank_cli")
    proc = subprocess.Popen(cmd, env=worker_env(), stdout=subprocess.DEVNULL)
    start = time.monotonic()
    freezes: list[tuple[int, dict[str, float]]] = []  # (lines written, stages alone)
    tenant_rates: list[float | None] = []  # the tenants' CPU per s over each stretch
    frozen: list[int] = []
    resumed = (0.0, 0.0)  # (time, tenants' CPU-seconds) at the last resume
    # A plain `kill` of the bench must still run the `finally` below, or the ranks stay
    # stopped for good (no timeout fires when every rank is stopped).
    old_term = signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        while True:
            try:
                proc.wait(timeout=every)
                break  # the job has ended
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"the pipeline ran past {timeout:.0f} s")
            pids = list(worker_pids(proc.pid).values())
            # Wait for the first logging line: until then the ranks are starting up.
            if len(pids) < nproc or not _complete_lines(log):
                continue
            if not _freeze(pids):
                continue
            frozen = pids
            now, used = time.perf_counter(), tenant_cpu() if tenant_cpu else 0.0
            if freezes and tenant_cpu:
                tenant_rates.append((used - resumed[1]) / (now - resumed[0]))
            freezes.append((len(_complete_lines(log)), stages.measure()))
            resumed = (time.perf_counter(), tenant_cpu() if tenant_cpu else 0.0)
            _resume(frozen)
            frozen = []
    finally:
        signal.signal(signal.SIGTERM, old_term)
        _resume(frozen)  # never leave a rank stopped
        if proc.poll() is None:  # an error here: end the job, ranks first
            for pid in worker_pids(proc.pid).values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return _stretches(cfg, _complete_lines(log), freezes, tenant_rates, every)


def _stretches(
    cfg: TrainConfig,
    recs: list[dict],
    freezes: list[tuple[int, dict[str, float]]],
    tenant_rates: list[float | None],
    every: float,
) -> dict[str, Any]:
    """figures() for each stretch between consecutive freezes that holds a whole logging
    interval, and their medians."""
    rows = []
    for k in range(len(freezes) - 1):
        (lines0, before), (lines1, after) = freezes[k], freezes[k + 1]
        whole = recs[lines0 + 1 : lines1]  # the first after a resume spans the freeze
        if not whole:
            continue
        pipe = pipe_means(whole)
        alone = geo_mean(before, after)
        tenant = tenant_rates[k] if k < len(tenant_rates) else None
        rows.append(figures(cfg, alone, pipe, tenant))
    if not rows:
        raise ValueError(
            f"no stretch between two freezes held a whole logging interval: run longer "
            f"(--max-steps), log more often (--log-every) or freeze less often (every {every} s)"
        )
    numeric = [k for k, v in rows[0].items() if isinstance(v, float)]
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in numeric}
    slowest = Counter(r["slowest_stage"] for r in rows).most_common(1)[0][0]
    return {
        "targets": cfg.targets,
        "drafters": cfg.drafters,
        **out,
        "slowest_stage": slowest,
        "stretches": len(rows),
        "stretch_efficiency": [round(r["efficiency"], 3) for r in rows],
        "freeze_every_s": every,
        "device": rows[0]["device"],
    }
