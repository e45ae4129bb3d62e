"""Concurrent pairs: a pair's candidate and baseline repeats run at the same time, one
per core, their steady steps started together (runner.concurrent_pairs,
worker.rendezvous), so the shared host's drift is the same for both sides."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from dflash.bench import runner
from dflash.bench.envs import BARRIER_ENV, BenchEnv
from dflash.bench.image_env import ImageEnv
from dflash.bench.worker import rendezvous
from dflash.bench.workloads import get_workload

HERE = BenchEnv(Path(sys.executable), "candidate")
BASE = BenchEnv(Path(sys.executable), "baseline")


def test_concurrent_only_where_each_side_gets_a_core_of_its_own(monkeypatch):
    w = get_workload("tiny-cpu")
    assert w.pair_mode == "concurrent" and get_workload("tiny-cpu-pipe").pair_mode == "sequential"
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda _: {0, 1})
    assert runner.concurrent_pairs(w, HERE, BASE) == ""
    assert "pair_mode is 'sequential'" in runner.concurrent_pairs(
        w.with_changes(pair_mode="sequential"), HERE, BASE
    )
    assert "one-thread CPU" in runner.concurrent_pairs(w.with_changes(threads=2), HERE, BASE)
    assert "one-thread CPU" in runner.concurrent_pairs(get_workload("qwen3-8b-1gpu").with_changes(pair_mode="concurrent"), HERE, BASE)  # fmt: skip
    image = ImageEnv.__new__(ImageEnv)  # only its type matters here
    assert "container" in runner.concurrent_pairs(w, image, BASE)
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda _: {0})
    assert "1 usable CPU" in runner.concurrent_pairs(w, HERE, BASE)


def test_pair_mode_is_policy_validated_and_outside_the_hash():
    w = get_workload("tiny-cpu")
    assert w.with_changes(pair_mode="sequential").hash() == w.hash()
    with pytest.raises(ValueError, match="pair_mode must be one of"):
        w.with_changes(pair_mode="parallel")


def test_rendezvous_waits_for_the_pair_and_is_free_alone(tmp_path):
    assert rendezvous({}) == 0.0
    env = {BARRIER_ENV: f"{tmp_path}{os.pathsep}2"}
    took: list[float] = []
    t = threading.Thread(target=lambda: took.append(rendezvous(env)))
    t.start()
    time.sleep(0.3)
    assert t.is_alive() and len(list(tmp_path.iterdir())) == 1  # its own file, waiting
    (tmp_path / "ended-baseline").touch()  # the other side (or the runner, for a crash)
    t.join(5)
    assert not t.is_alive() and 0.25 < took[0] < 5


def small_concurrent(repeats: int):
    """tiny-cpu cut to seconds per repeat; skips where pairs cannot run concurrently."""
    w = get_workload("tiny-cpu").with_changes(
        seq_len=128, rows=1, max_anchors=8, warmup_steps=2, steps=3, repeats=repeats
    )
    why = runner.concurrent_pairs(w, HERE, BASE)
    if why:
        pytest.skip(why)
    return w


@pytest.mark.slow
def test_concurrent_pairs_start_their_steady_steps_together(tmp_path):
    w = small_concurrent(repeats=2)
    lines: list[str] = []
    cand, base = runner.run_pairs(w, HERE, BASE, lines.append)
    assert "pairs: concurrent" in lines[0]
    for c, b in zip(cand, base, strict=True):
        assert c["paired_mode"] == b["paired_mode"] == "concurrent"
        assert abs(c["steady_t0"] - b["steady_t0"]) < 0.1, (c["steady_t0"], b["steady_t0"])
        assert c["pid"] != b["pid"]


@pytest.mark.slow
def test_a_side_that_cannot_start_never_keeps_the_other_waiting(tmp_path):
    w = small_concurrent(repeats=1)
    gone = BenchEnv(tmp_path / "no-such-venv" / "bin" / "python", "baseline")
    t0 = time.perf_counter()
    with pytest.raises(runner.RepeatFailed, match="cannot start"):
        runner.run_pairs(w, HERE, gone, lambda _: None)
    # The candidate waited for nobody: far below the rendezvous' 600 s time-out.
    assert time.perf_counter() - t0 < 300
