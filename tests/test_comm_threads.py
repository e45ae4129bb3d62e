"""bench/comm_threads.py: per-thread CPU of a real 1 + 1 pipeline, and its reading of a
perf trace (which thread spun in epoll_wait while whose main thread was preempted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_threads_of_a_real_pipeline_are_read_per_role():
    cmd = [sys.executable, "bench/comm_threads.py", "--", "--max-steps", "200", "--log-every", "10"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["drafter_tok_per_s"] > 0 and result["seconds"] >= 1, result
    for role in ("drafter", "target"):
        r = result[role]
        # the main thread computes; gloo's threads run, but far less
        assert 0.2 < r["main_cpu"] <= 1.05 and 0 < r["other_cpu"] < r["main_cpu"], result
    drafter_cpu = result["drafter"]["main_cpu"] + result["drafter"]["other_cpu"]
    # (from the unrounded figures)
    per_cpu_s = result["drafter_tok_per_s"] / drafter_cpu
    assert result["tok_per_drafter_cpu_s"] == pytest.approx(per_cpu_s, rel=0.01)
    assert "perf" not in result


def test_epoll_waits_are_counted_against_the_main_threads_state(monkeypatch):
    bench = load_script(ROOT / "bench/comm_threads.py", "dflash_comm_threads")
    sw = "sched:sched_switch: prev_comm=python prev_pid={} prev_prio=120 prev_state={} ==> "
    sw += "next_comm=python next_pid={} next_prio=120"
    ep = "syscalls:sys_enter_epoll_wait: epfd: 0x6, events: 0x7f, maxevents: 0x40, timeout: 0xa"
    trace = [
        f"  100  {sw.format(100, 'R', 101)}",  # drafter main (100) preempted by its loop
        f"  100  {ep}",  # the drafter's loop (a thread of 100) spins: counted
        f"  100  {ep}",
        f"  100  {sw.format(101, 'R', 100)}",  # main back on its core
        f"  100  {ep}",  # not while preempted
        f"  200  {sw.format(200, 'S', 0)}",  # target main sleeps: not preempted
        f"  200  {ep}",
        f"  300  {ep}",  # another process: ignored
    ]
    out = subprocess.CompletedProcess([], 0, stdout="\n".join(trace) + "\n", stderr="")
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: out)
    got = bench.epoll_while_preempted(Path("sched.data"), {"drafter": 100, "target": 200})
    assert got == {
        "drafter": {"epoll_wait": 3, "while_main_preempted": 2},
        "target": {"epoll_wait": 1, "while_main_preempted": 0},
    }


def test_tenant_flags_are_the_efficiency_benchs_and_bad_ones_are_named(capsys):
    bench = load_script(ROOT / "bench/comm_threads.py", "dflash_comm_threads")
    with pytest.raises(SystemExit):
        bench.main(["--busy", "1", "--busy-nice", "25"])
    assert "--busy-nice 25 is out of range: use a niceness from 0 to 19" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--busy", "1", "--busy-nice-scope", "group"])
    assert "--busy-nice-scope: invalid choice: 'group'" in capsys.readouterr().err
