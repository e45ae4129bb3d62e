"""bench/step_speed.py: the drafter step timed in blocks under alternating conditions
(CPU 0 / CPU 1, a neighbour idle / busy, several processes, the pipeline's inputs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
bench = load_script(ROOT / "bench/step_speed.py", "dflash_step_speed")
TWO_CPUS = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "bench/step_speed.py", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_block_counts_the_threads_cpu_time_not_its_sleep():
    # 20 ms asleep per step: a wall clock would read >= 20 ms, the thread's CPU next to none
    assert bench.block(lambda i: time.sleep(0.02), n=5, warm=1) < 0.01


def test_summary_gives_the_median_ratio_and_its_interval_from_six_rounds():
    few = bench.summary("x", [1.2, 0.9, 1.0])
    assert few["median"] == 1.0 and few["ci95"] is None and few["range"] == [0.9, 1.2]
    many = bench.summary("x", [0.9, 1.0, 1.1, 1.2, 0.95, 1.05, 1.0], extra=1)
    assert many["ci95"] is not None and many["ci95"][0] <= many["median"] <= many["ci95"][1]
    assert many["rounds"] == 7 and many["extra"] == 1


def test_inputs_probe_times_every_variant_against_the_capacitys_batches():
    proc = _run("inputs", "--rounds", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["rounds"] == 2 and len(out["ratios"]) == 2 and out["median"] > 0
    assert set(out["others"]) == {"own_index", "fresh"}


@TWO_CPUS
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("cpus",), "CPU 1 over CPU 0"),
        (("beside", "busy"), "beside a busy neighbour on the other CPU"),
        (("beside", "waker"), "beside a waker neighbour on the same CPU"),
        (("processes", "2"), "over the round's median"),
    ],
)
def test_two_cpu_probes_print_their_ratio_per_round(args, words):
    proc = _run(*args, "--rounds", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert words in out["probe"] and len(out["ratios"]) == 2 and all(r > 0 for r in out["ratios"])
    if args[0] == "processes":
        assert len(out["processes"]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("cpus", "--rounds", "1"), "--rounds 1: a ratio needs at least 2 rounds"),
        (("processes", "1"), "processes 1: compare at least 2 processes"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args, message):
    proc = _run(*args)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1]
