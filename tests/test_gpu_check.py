"""`dflash gpu-check`: the CPU dry run runs every check for real; the report logic and
the recompile counter are checked on their own."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from dflash import gpu_check, gpu_check_cli
from dflash.bench.workloads import get_workload


def test_recompile_counter_counts_new_graphs():
    import torch

    f = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    before = gpu_check.compiled_graphs()
    f(torch.ones(2))
    f(torch.ones(2))  # same shape: no new graph
    assert gpu_check.compiled_graphs() - before == 1
    f(torch.ones(3))  # a new shape: a recompile
    assert gpu_check.compiled_graphs() - before == 2


def test_the_gpu_workload_is_the_compiled_bench_one():
    w = get_workload(gpu_check.GPU_WORKLOAD)
    assert (w.device, w.compile, w.targets, w.drafters) == ("cuda", True, 1, 1)


def test_failures_are_rows_and_the_json_line_is_last(monkeypatch, capsys):
    ok = {"ok": True, "detail": "fine", "data": {}}

    def boom(*args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(gpu_check, "check_doctor", boom)
    monkeypatch.setattr(gpu_check, "check_steps", lambda *a: ok)
    monkeypatch.setattr(gpu_check, "check_record", lambda *a: {**ok, "ok": False})
    monkeypatch.setattr(gpu_check, "check_pipeline", lambda *a: ok)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    rc = gpu_check_cli.run(argparse.Namespace(dry_run=False, store=None, json_out=None))
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    assert rc == 1 and result["ok"] is False and result["dry_run"] is False
    status = {c["check"]: (c["status"], c["detail"]) for c in result["checks"]}
    assert status == {
        "doctor": ("FAIL", "RuntimeError: boom"),
        "steps": ("ok", "fine"),
        "record": ("FAIL", "fine"),
        "pipeline": ("skip", "needs >= 2 GPUs, found 1"),
    }
    assert out[0].split() == ["check", "status", "seconds", "detail"]


@pytest.mark.slow
def test_dry_run_runs_every_check_on_cpu(tmp_path):
    """The script as a user runs it, at tiny shapes: doctor, 20 compiled tiny-cpu steps
    with no recompile after warm-up, a bench record, and a 1 + 1 gloo pipeline."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DFLASH_BENCH_STORE": str(tmp_path / "s")}
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dflash", "gpu-check", "--dry-run", "--json-out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == json.loads(out.read_text())
    assert result["ok"] and result["dry_run"]
    checks = {c["check"]: c for c in result["checks"]}
    assert list(checks) == ["doctor", "steps", "record", "pipeline"]
    assert all(c["status"] == "ok" for c in checks.values()), checks
    steps = checks["steps"]["data"]
    assert steps["compile"] and steps["steps"] == gpu_check.STEPS
    assert steps["graphs_in_warmup"] >= 1 and steps["recompiles_after_warmup"] == 0
    assert checks["record"]["data"]["id"] and checks["record"]["data"]["exit_code"] == 0
    assert not (tmp_path / "s").exists()  # the dry run's record went to a temporary store
    pipe = checks["pipeline"]["data"]
    assert pipe["backend"] == "gloo" and pipe["steps"] == gpu_check.STEPS
    for name in checks:
        assert any(line.startswith(name) for line in proc.stdout.splitlines())  # the table
