"""The efficiency with the stages timed during the run (dflash/bench/interleaved.py): which
logging intervals a stretch keeps, and a real 1 + 1 job frozen and resumed by it."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dflash.bench import capacity, interleaved
from dflash.config import TrainConfig


def _rec(tok: float) -> dict:
    return {"pipe/drafter_tok_per_s": tok, "pipe/drafter_compute": 0.99}


def _alone(drafter: float) -> dict[str, float]:
    return {
        "target_tok_per_s": 3 * drafter,
        "drafter_tok_per_s": drafter,
        "target_tok_per_cpu_s": 3 * drafter,
        "drafter_tok_per_cpu_s": drafter,
    }


def _cfg() -> TrainConfig:
    return TrainConfig(out="x", targets=1, drafters=1, device="cpu")


def test_a_stretch_keeps_the_intervals_it_holds_whole_against_the_stages_around_it():
    # Line 0 is start-up; each freeze's count is the lines written before it. The first
    # line after a resume (here 3 and 6) spans the freeze: it reads low and is dropped.
    recs = [_rec(t) for t in (1.0, 90.0, 90.0, 10.0, 80.0, 80.0, 10.0, 70.0)]
    for r in recs:
        r.update({"pipe/drafter_cpu": 0.99, "pipe/target_cpu": 0.3})
    freezes = [(3, _alone(100.0)), (6, _alone(100.0)), (7, _alone(64.0))]
    got = interleaved._stretches(_cfg(), recs, freezes, [0.25, 0.5], every=6.0)
    # Stretch 0: lines 4-5 (80) over 100; stretch 1: line 6 is its only line and spans
    # the freeze, so nothing whole is left and it is skipped.
    assert got["stretches"] == 1
    assert got["stretch_efficiency"] == [0.8]
    assert got["efficiency"] == pytest.approx(0.8)
    assert got["tenant_cpu"] == 0.25
    assert got["slowest_stage"] == "drafters"
    freezes[2] = (8, _alone(64.0))  # now line 7 (70) is whole, against sqrt(100 * 64) = 80
    got = interleaved._stretches(_cfg(), recs, freezes, [0.25, 0.5], every=6.0)
    assert got["stretch_efficiency"] == [0.8, pytest.approx(70 / 80)]
    assert got["efficiency"] == pytest.approx((0.8 + 70 / 80) / 2)  # median of two
    assert math.isclose(got["tenant_cpu"], 0.375)


def test_no_whole_interval_names_what_to_change():
    recs = [_rec(1.0)] * 3
    with pytest.raises(ValueError, match=r"--max-steps.*--log-every.*every 2.5 s"):
        interleaved._stretches(_cfg(), recs, [(1, _alone(1.0)), (2, _alone(1.0))], [], 2.5)


def test_a_process_gone_before_its_freeze_is_reported_and_the_rest_resumed():
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it
    try:
        assert interleaved._freeze([alive.pid, gone]) is False
        assert interleaved.process_state(alive.pid) not in "tT"  # resumed
        assert interleaved._freeze([alive.pid]) is True
        interleaved._resume([alive.pid])
    finally:
        alive.kill()
        alive.wait()


def test_a_line_cut_short_by_a_freeze_is_not_read(tmp_path: Path):
    log = tmp_path / "metrics.jsonl"
    assert interleaved._complete_lines(log) == []
    log.write_text('{"step": 10}\n{"step": 20}\n{"ste')
    assert interleaved._complete_lines(log) == [{"step": 10}, {"step": 20}]


def test_interleaving_refuses_a_gpu_job(monkeypatch):
    monkeypatch.setattr(interleaved, "resolve_device", lambda cfg: torch.device("cuda", 0))
    with pytest.raises(ValueError, match="this job runs on cuda:0: drop --interleave"):
        interleaved.measure_interleaved(_cfg())


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_real_job_is_frozen_timed_and_resumed_to_its_end(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    froze: list[list[int]] = []
    timed_while: list[tuple[list[str], list[str]]] = []  # the ranks' states around each timing
    real = interleaved._freeze
    monkeypatch.setattr(interleaved, "_freeze", lambda pids: froze.append(pids) or real(pids))

    class Watched(capacity.Stages):
        def measure(self):
            before = [interleaved.process_state(p) for p in froze[-1]]
            got = super().measure()
            timed_while.append((before, [interleaved.process_state(p) for p in froze[-1]]))
            return got

    monkeypatch.setattr(interleaved, "Stages", Watched)
    cfg = TrainConfig(
        out=str(tmp_path / "run"), wandb="off", targets=1, drafters=1, device="cpu",
        max_steps=400, log_every=5,
    )  # fmt: skip
    row = interleaved.measure_interleaved(cfg, batches=3, every=1.5)
    # Both ranks stayed stopped through every timing of the stages alone.
    assert len(timed_while) >= 2
    assert all(st in "tT" for pair in timed_while for states in pair for st in states)
    assert all(len(states) == 2 for states, _ in timed_while)
    assert row["stretches"] >= 1 and len(row["stretch_efficiency"]) == row["stretches"]
    assert 0 < row["efficiency"] < 3 and 0 < row["drafter_compute"] <= 1
    # Resumed every time, the job ran to its last step.
    assert interleaved._complete_lines(tmp_path / "run" / "metrics.jsonl")[-1]["step"] == 400
