"""bench/step_speed.py: the drafter step timed in blocks under alternating conditions
(CPU 0 / CPU 1, a neighbour idle / busy, several processes, the pipeline's inputs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scripts import load_script

from dflash.bench.interleaved import process_state
from dflash.distributed.launch import child_pids

ROOT = Path(__file__).resolve().parents[1]
bench = load_script(ROOT / "bench/step_speed.py", "dflash_step_speed")
TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "bench/step_speed.py", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_block_counts_the_threads_cpu_time_not_its_sleep_nor_its_preparation():
    # 20 ms asleep per step: a wall clock would read >= 20 ms, the thread's CPU next to none
    assert bench.block(lambda x: time.sleep(0.02), n=5) < 0.01

    def spin(i: int) -> int:  # 20 ms of CPU, in `prepare`: not the step's
        t = time.thread_time()
        while time.thread_time() - t < 0.02:
            pass
        return i

    assert bench.block(lambda x: None, n=5, prepare=spin) < 0.01


def test_summary_gives_the_median_ratio_and_its_interval_from_six_rounds():
    few = bench.summary("x", [1.2, 0.9, 1.0])
    assert few["median"] == 1.0 and few["ci95"] is None and few["range"] == [0.9, 1.2]
    assert few["rounds_more_than_10pct_apart"] == 1
    many = bench.summary("x", [0.9, 1.0, 1.1, 1.2, 0.95, 1.05, 1.0], extra=1)
    assert many["ci95"] is not None and many["ci95"][0] <= many["median"] <= many["ci95"][1]
    assert many["rounds"] == 7 and many["extra"] == 1


@TWO_CPUS
def test_cpus_sets_the_second_cpu_against_the_first_and_the_first_against_itself(monkeypatch):
    cpus = sorted(os.sched_getaffinity(0))[:2]
    monkeypatch.setattr(bench, "_stages_step", lambda st: None)
    monkeypatch.setattr(bench, "_stages", lambda: None)
    # a host whose second CPU is steadily 1.5x slower
    speed = {cpus[0]: 0.010, cpus[1]: 0.015}
    monkeypatch.setattr(bench, "block", lambda step: speed[next(iter(os.sched_getaffinity(0)))])
    allowed = os.sched_getaffinity(0)
    out = bench.probe_cpus(4)
    assert out["ratios"] == [1.5] * 4 and out["control"]["median"] == 1.0
    assert os.sched_getaffinity(0) == allowed  # given back
    # which CPU goes first alternates by round
    assert [b[0][0] for b in out["block_ms"]] == [cpus[0], cpus[1], cpus[0], cpus[1]]


@TWO_CPUS
@pytest.mark.parametrize("kind", ["busy", "waker"])
def test_beside_runs_the_neighbour_only_in_its_blocks_and_where_it_should(monkeypatch, kind):
    monkeypatch.setattr(bench, "_stages_step", lambda st: None)
    monkeypatch.setattr(bench, "_stages", lambda: None)
    started: list[subprocess.Popen] = []
    real = bench._neighbour
    monkeypatch.setattr(bench, "_neighbour", lambda k: started.append(real(k)) or started[0])
    seen = []

    def block(step) -> float:
        nb = started[0].pid
        time.sleep(0.2)  # a signal's effect on the state /proc shows is not instant
        mine, theirs = os.sched_getaffinity(0), os.sched_getaffinity(nb)
        running = process_state(nb) != "T"
        seen.append((running, mine, theirs))
        return 0.02 if running else 0.01  # twice as slow beside it

    monkeypatch.setattr(bench, "block", block)
    out = bench.probe_beside(kind, 4)
    assert out["ratios"] == [2.0] * 4  # neighbour's blocks over idle ones
    assert sum(r for r, _, _ in seen) == 4 and len(seen) == 8
    for _, mine, theirs in seen:
        assert len(mine) == 1 and (theirs == mine) == (kind == "waker"), seen
    assert started[0].poll() is not None  # killed at the end


@TWO_CPUS
def test_a_killed_probe_takes_its_busy_neighbour_with_it():
    proc = subprocess.Popen(
        [sys.executable, "bench/step_speed.py", "beside", "busy", "--rounds", "1000"], cwd=ROOT
    )
    deadline, kids = time.monotonic() + 120, []
    while not kids:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
        kids = child_pids(proc.pid)
    proc.send_signal(signal.SIGKILL)  # no cleanup of its own can run
    proc.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{k}").exists() and process_state(k) != "Z" for k in kids):
        assert time.monotonic() < deadline, f"neighbour {kids} outlived the probe"
        time.sleep(0.1)


@TWO_CPUS
def test_inputs_packs_one_message_on_the_other_cpu_and_steps_on_its_own(monkeypatch):
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    seen = []  # (variant, CPUs at packing, CPUs at the step)

    def variant(name: str):
        def make(i: int, pack_on: int | None = None):
            with bench.on_cpu(pack_on):
                packed = frozenset(os.sched_getaffinity(0))
            return name, packed

        return make

    def train(x) -> None:  # 3 ms of CPU for a message packed elsewhere, 2 ms otherwise
        here = frozenset(os.sched_getaffinity(0))
        seen.append((*x, here))
        t = time.thread_time()
        while time.thread_time() - t < (0.003 if x[1] != here else 0.002):
            pass

    names = ("capacity", "own_index", "fresh", "through_wire")
    monkeypatch.setattr(bench, "_input_variants", lambda n: (train, {k: variant(k) for k in names}))
    allowed = os.sched_getaffinity(0)
    out = bench.probe_inputs(2, 40)
    assert len(seen) == 2 * 5 * (bench.WARM + bench.BLOCK)  # 5 variants a round
    elsewhere = [(name, p | s) for name, p, s in seen if p != s]
    per_round = bench.WARM + bench.BLOCK
    assert len(elsewhere) == 2 * per_round and all(len(s) == 1 for *_, s in seen)
    assert all(name == "through_wire" and both == cpus for name, both in elsewhere)
    assert {s for *_, s in seen[: 5 * per_round]} != {s for *_, s in seen[5 * per_round :]}
    assert 1.3 < out["others"]["wire_other_cpu_over_own_cpu"]["median"] < 1.7
    assert os.sched_getaffinity(0) == allowed  # given back


def test_inputs_on_one_cpu_has_no_other_cpu_to_pack_on(monkeypatch):
    one = sorted(os.sched_getaffinity(0))[0]
    monkeypatch.setattr(bench, "_cpus", lambda: [one])
    packed_on = []

    def make(i: int, pack_on: int | None = None) -> int:
        packed_on.append(pack_on)
        return i

    names = ("capacity", "own_index", "fresh", "through_wire")
    monkeypatch.setattr(
        bench, "_input_variants", lambda n: (lambda x: None, dict.fromkeys(names, make))
    )
    out = bench.probe_inputs(2, 40)
    assert set(out["others"]) == {"own_index", "fresh"} and set(packed_on) == {None}


@TWO_CPUS
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("inputs", "--batches", "40"), "through the wire over the capacity's batches"),
        (("processes", "2"), "over the round's median"),
        (("beside", "target"), "beside a target neighbour on the other CPU"),
    ],
)
def test_probes_run_end_to_end_and_print_a_ratio_per_round(args, words):
    proc = _run(*args, "--rounds", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert words in out["probe"] and len(out["ratios"]) == 2 and all(r > 0 for r in out["ratios"])
    if args[0] == "processes":
        assert len(out["processes"]) == 2
    if args[0] == "inputs":
        assert set(out["others"]) == {"own_index", "fresh", "wire_other_cpu_over_own_cpu"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("cpus", "--rounds", "1"), "--rounds 1: give at least 2 (6 or more for the interval)"),
        (("processes", "1"), "processes 1: compare at least 2 processes"),
        (("inputs", "--batches", "39"), "--batches 39: give at least 40"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args, message):
    proc = _run(*args)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]
