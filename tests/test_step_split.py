"""bench/step_split.py: a 1 + 1 pipeline's drafter step split into its own CPU time, the
receive and the time off its CPU, against the stage alone timed in the same pauses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
bench = load_script(ROOT / "bench/step_split.py", "dflash_step_split")


def test_a_round_splits_the_loop_period_into_parts_of_the_stage_alone():
    pipe = {"step_at": 149, "step_cpu": 0.010, "receive_cpu": 0.0005, "receive": 0.001}
    pipe |= {"post": 0.0004, "wall": 0.0125, "period": 0.013}
    row = bench._ratios(pipe, alone_cpu=0.010, alone_wall=0.0100)
    assert row["step"] == pytest.approx(1.0)
    assert row["receive"] == pytest.approx(0.1) and row["receive_cpu"] == pytest.approx(0.05)
    assert row["post"] == pytest.approx(0.04)  # beside the step, not a part of its period
    assert row["off_cpu"] == pytest.approx(0.15)  # 12.5 - 10 - 1 ms, over 10 ms
    assert row["between"] == pytest.approx(0.05)
    assert row["period"] == pytest.approx(1.3)  # efficiency 1 / 1.3
    want = {"step_cpu": 10.0, "receive_cpu": 0.5, "receive": 1.0, "post": 0.4}
    want |= {"wall": 12.5, "period": 13.0}
    assert row["pipeline_ms"] == want


@pytest.mark.parametrize("flag", ["--max-steps", "--drafters=2", "--out"])
def test_the_flags_it_sets_itself_are_refused_by_name(flag):
    with pytest.raises(SystemExit) as e:
        bench.main(["--rounds", "2", "--", flag, "3"])
    assert e.value.code == 2


def test_two_rounds_of_a_real_pipeline_add_up():
    cmd = [sys.executable, "bench/step_split.py", "--rounds", "2", "--period", "15"]
    cmd += ["--batches", "5", "--", "--log-every", "5"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    *rows, last = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["step_at"] for r in rows] == [14, 29] and last["rounds"] == 2
    for r in rows:
        p, a = r["pipeline_ms"], r["alone_ms"]
        assert p["receive"] > 0 and a["cpu"] > 0 and p["step_cpu"] > 0
        assert 0 < p["receive_cpu"] <= p["receive"] + 0.01
        assert p["post"] > 0  # an irecv posted every step, by the receiver's helper thread
        assert r["off_cpu"] > -0.01  # a thread's CPU time cannot exceed its wall time
        assert r["between"] > 0  # the stretch holds logging steps (--log-every 5)
        # the parts add up to the loop's period, in units of the stage alone's wall time
        parts = r["step"] * a["cpu"] + (r["receive"] + r["off_cpu"] + r["between"]) * a["wall"]
        assert parts == pytest.approx(p["period"], abs=0.01)
        assert r["period"] == pytest.approx(p["period"] / a["wall"], rel=0.01)
    effs = sorted(1 / r["period"] for r in rows)
    assert last["efficiency"]["median"] == pytest.approx(sum(effs) / 2, abs=0.002)
