"""The target/drafter pipeline as real torch.distributed processes (torchrun, gloo, CPU).

Each run is a `torchrun --standalone` job (it picks a free rendezvous port) in its own
session, killed as a whole if a test fails or times out.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from scripts import load_script

from dflash.config import TrainConfig
from dflash.distributed.launch import config_argv, plan, worker_pids
from dflash.distributed.roles import Layout, default_split, resolve_split
from dflash.distributed.telemetry import COUNTERS, Clock, verdict
from dflash.train import train

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent


def start(nproc: int, out: Path, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "-m", "dflash.distributed.rank_cli"]
    cmd += ["--out", str(out), "--wandb", "off", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group: killable as a whole
    )  # fmt: skip


def finish(proc: subprocess.Popen, timeout: float = 150) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the job's own group: torchrun and its ranks
        out, _ = proc.communicate()
        pytest.fail(f"pipeline run exceeded {timeout}s:\n{out[-4000:]}")
    return proc.returncode, out


def run_ok(nproc: int, out: Path, *flags: str) -> str:
    rc, log = finish(start(nproc, out, *flags))
    assert rc == 0, log[-4000:]
    return log


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def wait_for_metrics(proc: subprocess.Popen, run: Path, timeout: float) -> None:
    """Until the running job has written one whole metrics line (a logging step)."""
    deadline = time.monotonic() + timeout
    metrics = run / "metrics.jsonl"
    while not (metrics.exists() and "\n" in metrics.read_text()):
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, f"no logging step within {timeout:.0f} s"
        time.sleep(0.05)


def single_process_losses(tmp_path: Path, name: str, **kw) -> list[float]:
    torch.set_num_threads(1)
    train(TrainConfig(out=str(tmp_path / name), wandb="off", **kw))
    return [r["loss"] for r in records(tmp_path / name)]


@pytest.mark.parametrize("targets, drafters, accum", [(1, 1, 1), (2, 2, 1), (5, 3, 2), (3, 2, 3)])
def test_routing_gives_every_step_the_single_process_batches(targets, drafters, accum):
    lay = Layout(targets, drafters, accum)
    steps = 4
    produced = sorted(g for t in range(targets) for g, _ in lay.target_batches(t, 1, 1 + steps))
    assert produced == list(range(lay.per_step, (1 + steps) * lay.per_step))
    for s in range(1, 1 + steps):
        trained = [lay.drafter_batches(d, s) for d in range(drafters)]
        assert all(len(b) == accum for b in trained)  # equal work per drafter per step
        assert sorted(g for b in trained for g, _ in b) == list(
            range(s * lay.per_step, (s + 1) * lay.per_step)
        )
        # Both ends agree on who sends what to whom.
        for d, batch in enumerate(trained):
            for g, t in batch:
                assert (g, d) in set(lay.target_batches(t, s, s + 1))


def test_split_and_launch_plan():
    assert default_split(8) == (5, 3) and default_split(2) == (1, 1)
    assert resolve_split(0, 1, 4) == (3, 1)
    with pytest.raises(ValueError, match="--targets 2 \\+ --drafters 1 must equal"):
        resolve_split(2, 1, 4)
    cfg = TrainConfig(out="x", targets=2, drafters=2, device="cpu")
    assert plan(cfg) == ("spawn", 4)
    assert plan(TrainConfig(out="x", device="cpu")) == ("single", 1)
    with pytest.raises(ValueError, match="--targets and --drafters go together"):
        plan(TrainConfig(out="x", drafters=2, device="cpu"))
    from dflash.train_cli import config_of

    assert config_of(config_argv(cfg)) == cfg


def test_verdict_names_the_slow_side():
    assert verdict(0.62, 0.01, 0.0, 0.0).startswith("targets wait 62% on drafters")
    assert verdict(0.0, 0.4, 0.0, 0.0).startswith("drafters wait 40% on targets")
    assert verdict(0.02, 0.03, 0.0, 0.0).startswith("balanced")


def test_clock_counts_cpu_time_apart_from_wall_time():
    """A rank that sleeps (waits) adds wall time but no CPU time; one that computes adds both."""
    clock = Clock()
    time.sleep(0.2)
    slept = dict(zip(COUNTERS, clock.counters(), strict=True))
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    spun = dict(zip(COUNTERS, clock.counters(), strict=True))
    assert slept["elapsed_us"] >= 200_000 and slept["cpu_us"] < 100_000
    assert spun["cpu_us"] - slept["cpu_us"] >= 200_000


def test_two_plus_two_matches_single_process(tmp_path):
    """Same data, seed and global batch (2 drafters x 1 micro-batch = grad_accum 2): the
    tiny preset trained to completion by 4 processes reproduces one process's losses."""
    log = run_ok(4, tmp_path / "pipe", "--targets", "2", "--drafters", "2")
    pipe = records(tmp_path / "pipe")
    ref = single_process_losses(tmp_path, "single", grad_accum=2)
    assert [r["step"] for r in pipe] == [5, 10, 15, 20, 25, 30]
    assert [r["loss"] for r in pipe] == pytest.approx(ref, rel=1e-5, abs=0)
    assert (tmp_path / "pipe" / "drafter" / "model.safetensors").exists()
    assert "pipeline step 30:" in log
    ranks = pipe[-1]["ranks"]
    assert [(r["role"], r["index"]) for r in ranks] == [
        ("drafter", 0), ("drafter", 1), ("target", 0), ("target", 1)
    ]  # fmt: skip
    for r in ranks:  # every rank reported: fractions of wall time that add up
        parts = r["compute"] + r["wait_send"] + r["wait_recv"] + r["idle"]
        assert r["compute"] > 0 and parts == pytest.approx(1.0, abs=0.02)
        assert 0 < r["cpu"] < 4  # CPU-seconds per second of one process (a few threads)
    assert pipe[-1]["pipe/target_tok_per_s"] > 0 and pipe[-1]["pipe/drafter_tok_per_s"] > 0


def test_one_plus_one_matches_single_process(tmp_path):
    """A lone drafter trains without a DDP wrapper (nothing to average): its losses are
    still one process's, step for step."""
    run_ok(2, tmp_path / "pipe", "--targets", "1", "--drafters", "1")
    pipe = records(tmp_path / "pipe")
    ref = single_process_losses(tmp_path, "single", grad_accum=1)
    assert [r["loss"] for r in pipe] == pytest.approx(ref, rel=1e-5, abs=0)


def test_killed_rank_ends_job_naming_it_and_resume_continues(tmp_path):
    run = tmp_path / "run"
    flags = ["--targets", "1", "--drafters", "1", "--max-steps", "60"]
    flags += ["--log-every", "4", "--save-every", "4"]
    proc = start(2, run, *flags)
    # A guard against a hang, not a speed check: two torch ranks and the preflight on
    # a loaded 2-core machine took over 120 s to reach step 4 once (load average ~10).
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "step_00000004").exists():
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    pids = worker_pids(proc.pid)
    assert set(pids) == {0, 1}, pids
    os.kill(pids[1], signal.SIGKILL)  # the target, mid-run
    killed = time.monotonic()
    rc, log = finish(proc, timeout=90)
    took = time.monotonic() - killed
    print(f"job ended {took:.1f}s after the kill, exit {rc}")
    assert rc != 0 and took < 60
    assert "rank 1 (target 0)" in log, log[-4000:]  # the survivor names the dead peer
    for pid in pids.values():  # nothing left behind (reaped, or gone)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX"

    run_ok(2, run, *flags, "--resume")
    recs = records(run)
    assert [r["step"] for r in recs] == list(range(4, 61, 4))
    ref = single_process_losses(tmp_path, "single", max_steps=60, log_every=4)
    assert [r["loss"] for r in recs] == pytest.approx(ref, rel=1e-5, abs=0)


@pytest.mark.parametrize(
    "flags, expect",
    [
        (["--draft-layers", "6", "--max-anchors", "64"], "targets wait"),
        # Long rows cost the 8-layer target far more than a 1-layer, 1-anchor drafter.
        (["--draft-layers", "1", "--max-anchors", "1", "--seq-len", "1024"], "drafters wait"),
    ],
)
def test_bottleneck_line_names_the_slow_side(tmp_path, flags, expect):
    """Drafters made expensive (deep, many anchors) or nearly free next to a target on long
    rows: the verdict flips with them."""
    base = ["--targets", "1", "--drafters", "1", "--max-steps", "20", "--log-every", "5"]
    run_ok(2, tmp_path / "run", *base, *flags)
    lines = [r["bottleneck"] for r in records(tmp_path / "run")]
    print(lines)
    # The first interval holds start-up; the rest must all name the slow side.
    assert all(line.startswith(expect) for line in lines[1:]), lines


def test_sigterm_checkpoints_at_next_logging_step_and_exits(tmp_path):
    """docker stop / Ctrl-C: torchrun forwards SIGTERM; drafters agree on the next logging
    step, drafter 0 checkpoints, targets are told to stop, and every process exits."""
    run = tmp_path / "run"
    flags = ["--targets", "1", "--drafters", "1", "--max-steps", "400", "--log-every", "4"]
    proc = start(2, run, *flags)
    wait_for_metrics(proc, run, timeout=120)
    pids = worker_pids(proc.pid)
    os.kill(proc.pid, signal.SIGTERM)
    sent = time.monotonic()
    _, log = finish(proc, timeout=90)
    assert time.monotonic() - sent < 30  # inside torchrun's grace period, no SIGKILL
    (ckpt,) = (run / "checkpoints").iterdir()
    step = int(ckpt.name.removeprefix("step_"))
    assert 4 <= step < 400 and step % 4 == 0, log[-4000:]
    assert records(run)[-1]["step"] == step
    assert f"interrupted at step {step}" in log
    assert not (run / "drafter").exists()
    for pid in pids.values():
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX"


def _allowed_cpus(status: Path) -> set[int]:
    """Cpus_allowed_list of one thread (/proc/PID/task/TID/status), e.g. "0-2,5"."""
    for line in status.read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            spans = [part.split("-") for part in line.split(":", 1)[1].strip().split(",")]
            return {cpu for span in spans for cpu in range(int(span[0]), int(span[-1]) + 1)}
    raise AssertionError(f"no Cpus_allowed_list in {status}")


def _threads_cpus(pid: int) -> tuple[set[int], list[set[int]]]:
    """CPUs allowed to a process's main thread, and to each of its other threads."""
    tasks = Path(f"/proc/{pid}/task")
    others = [_allowed_cpus(t / "status") for t in tasks.iterdir() if t.name != str(pid)]
    return _allowed_cpus(tasks / str(pid) / "status"), others


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_pin_cpus_puts_each_ranks_main_thread_on_its_own_cpu_and_the_rest_elsewhere(tmp_path):
    run = tmp_path / "pin"
    flags = ["--targets", "1", "--drafters", "1", "--pin-cpus", "--max-steps", "2000"]
    proc = start(2, run, *flags, "--log-every", "2")
    wait_for_metrics(proc, run, timeout=300)
    pids = worker_pids(proc.pid)
    placed = {rank: _threads_cpus(pid) for rank, pid in pids.items()}
    os.kill(proc.pid, signal.SIGTERM)  # stops at the next logging step
    _, log = finish(proc, timeout=90)
    assert "interrupted at step" in log, log[-3000:]
    assert set(placed) == {0, 1}, placed
    allowed = sorted(os.sched_getaffinity(0))
    cpus = allowed[:2]
    # rank 0 is local rank 0: the first allowed CPU; rank 1 the second
    for rank, cpu in ((0, cpus[0]), (1, cpus[1])):
        main, others = placed[rank]
        assert main == {cpu}, placed
        # the communication library's threads: every allowed CPU but the main thread's;
        # the drafter's receiver starts its poster later, on the main thread's CPU
        later = [o for o in others if o == {cpu}]
        assert len(later) == (1 if rank == 0 else 0), placed
        elsewhere = [o for o in others if o != {cpu}]
        assert elsewhere and all(o == set(allowed) - {cpu} for o in elsewhere), placed
    assert (
        f"(drafter 0): pinned to CPU {cpus[0]}" in log
        and f"(target 0): pinned to CPU {cpus[1]}" in log
    ), log[-3000:]


def test_pin_cpus_errors_name_the_flag_and_the_fix(monkeypatch):
    from dflash.distributed import pipeline

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(pipeline.os, "sched_getaffinity", lambda _: {3})
    with pytest.raises(
        ValueError,
        match="--pin-cpus needs a CPU per rank: 2 ranks on this node, CPUs allowed: 1; drop --pin-cpus",
    ):
        pipeline._pin(torch.device("cpu"))
    with pytest.raises(ValueError, match="--pin-cpus is for CPU runs; this rank runs on cuda:1"):
        pipeline._pin(torch.device("cuda", 1))


def test_pinned_capacity_times_each_stage_on_its_ranks_cpu(monkeypatch, tmp_path):
    from dflash.bench import capacity

    # drafters come first: drafter 0 is local rank 0, target 0 local rank `drafters`
    monkeypatch.setattr(capacity.os, "sched_getaffinity", lambda _: {4, 5, 6, 7})
    cfg = TrainConfig(targets=1, drafters=2, pin_cpus=True, out=str(tmp_path))
    assert capacity.rank_cpus(cfg) == {"drafter": 4, "target": 6}
    assert capacity.rank_cpus(TrainConfig(targets=1, drafters=2, out=str(tmp_path))) is None
    # fewer CPUs than ranks: no placement here; the ranks themselves refuse (_pin above)
    assert capacity.rank_cpus(TrainConfig(targets=3, drafters=2, pin_cpus=True, out=".")) is None
    monkeypatch.undo()
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    allowed = os.sched_getaffinity(0)
    cfg = TrainConfig(targets=1, drafters=1, pin_cpus=True, out=str(tmp_path), wandb="off")
    stages = capacity.Stages(cfg, batches=1, warmup=0)
    seen = []
    timed = stages._timed
    monkeypatch.setattr(
        stages, "_timed", lambda fn: seen.append(os.sched_getaffinity(0)) or timed(fn)
    )
    stages.measure()
    cpus = sorted(allowed)
    assert seen == [{cpus[1]}, {cpus[0]}]  # the target's stage, then the drafter's
    assert os.sched_getaffinity(0) == allowed  # given back
    stages.run.cfg = TrainConfig(targets=1, drafters=1, out=str(tmp_path), wandb="off")
    seen.clear()
    stages.measure()
    assert seen == [allowed, allowed]  # not pinned: wherever this process may run


def _tenants() -> set[int]:
    """Live (not zombie) processes running the benchmark's busy loop."""
    found = set()
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"while True: pass" in cmd and state not in "ZX":
            found.add(pid)
    return found


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_efficiency_bench_measures_its_busy_tenant_and_stops_it():
    before = _tenants()
    cmd = [sys.executable, "bench/pipeline_efficiency.py", "--targets", "1", "--drafters", "1"]
    cmd += ["--busy", "1", "--batches", "3", "--versus=--pin-cpus"]
    cmd += ["--", "--max-steps", "6", "--log-every", "2"]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    *lines, last = proc.stdout.splitlines()
    rows, summary = [json.loads(x) for x in lines if x.startswith("{")], json.loads(last)
    assert [r["condition"] for r in rows] == ["base", "versus"]  # one round, both measured
    for prefix in ("", "versus_"):
        # A pure-Python loop beside a 2-rank pipeline on >= 2 CPUs gets some CPU, at most one.
        assert 0.05 < summary[f"{prefix}median_tenant_cpu"] <= 1.05, summary
        assert summary[f"{prefix}median_efficiency"] > 0
        # What the tenant leaves of 2+ CPUs allows at least ~half the capacity.
        assert 0.3 < summary[f"{prefix}median_cpu_bound"] <= 1.0, summary
        assert summary[f"{prefix}median_efficiency_ci95"] is None  # 1 repeat: no interval
    # The round's ratio is the two conditions' efficiencies, and the efficiency is the
    # bound times the pipeline's own part.
    ratio = rows[1]["efficiency"] / rows[0]["efficiency"]
    assert summary["versus_over_base"] == [round(ratio, 3)]
    assert summary["versus_ahead"] == f"{int(ratio > 1)} of 1"
    for row in rows:
        assert row["efficiency"] == pytest.approx(row["cpu_bound"] * row["efficiency_of_bound"])
        # What the hypervisor took over the repeat: CPU-seconds per second, at most all CPUs.
        assert 0 <= row["steal"] <= os.cpu_count(), row
    assert summary["median_steal"] == round(rows[0]["steal"], 3)
    assert summary["versus_median_steal"] == round(rows[1]["steal"], 3)
    assert _tenants() == before  # killed at the end


def test_efficiency_bench_names_a_bad_train_flag_before_starting():
    before = _tenants()
    cmd = [sys.executable, "bench/pipeline_efficiency.py", "--targets", "1", "--drafters", "1"]
    for extra, want in (
        (["--versus=--bogus"], "--versus: not `dflash train` flags: --bogus"),
        (["--versus=--max-steps x"], "--versus: argument --max-steps: invalid int value: 'x'"),
        (["--versus="], "--versus needs `dflash train` flags, e.g. --versus=--pin-cpus"),
        (["--", "--bogus"], "the flags after --: not `dflash train` flags: --bogus"),
    ):
        proc = subprocess.run(
            [*cmd, "--busy", "1", *extra], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2 and want in proc.stderr.splitlines()[-1], proc.stderr
    assert _tenants() == before  # --busy 1 started nothing


def test_efficiency_bench_names_the_fix_when_a_session_cannot_be_niced(monkeypatch):
    bench = load_script(ROOT / "bench/pipeline_efficiency.py", "dflash_pipeline_efficiency")

    class ReadOnlyProc(type(Path())):  # what a container with a read-only /proc gives
        def write_text(self, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(self))

    before = _tenants()
    monkeypatch.setattr(bench, "autogroup_enabled", lambda: True)
    monkeypatch.setattr(bench, "Path", ReadOnlyProc)
    with pytest.raises(SystemExit, match=r"autogroup: Permission denied\); use --busy-nice-scope"):
        bench.start_tenants(2, nice=19)
    assert _tenants() == before  # the one already started was stopped


def test_cpu_bound_is_the_tokens_the_cpus_left_can_make():
    from dflash.bench.capacity import cpu_bound

    # 1.285 cores at 24.8K (target) and 17.4K (drafter) tok per CPU-second make
    # 1.285 / (1/24800 + 1/17400) = 13,141 tok/s: 0.755 of the drafter's 17.4K.
    assert cpu_bound(1.285, 24_800.0, 17_400.0, 17_400.0) == pytest.approx(0.7552, abs=1e-4)
    assert cpu_bound(2.0, 24_800.0, 17_400.0, 17_400.0) == 1.0  # the CPU does not limit
    assert cpu_bound(-0.1, 24_800.0, 17_400.0, 17_400.0) == 0.0


def test_efficiency_bench_starts_tenants_at_the_niceness_asked_and_checks_it():
    bench = load_script(ROOT / "bench/pipeline_efficiency.py", "dflash_pipeline_efficiency")
    tenants = bench.start_tenants(2, nice=19)
    tenants += bench.start_tenants(1, nice=19, session=False)
    tenants += bench.start_tenants(1, nice=19, idle=True)
    try:
        assert [os.getpriority(os.PRIO_PROCESS, t.pid) for t in tenants] == [19] * 4
        policies = [os.sched_getscheduler(t.pid) for t in tenants]
        assert policies == [os.SCHED_OTHER] * 3 + [os.SCHED_IDLE]
        # Each in a session of its own, as a job from another shell is: with autogroup on,
        # only a session's niceness orders it against torchrun's ranks (sessions too).
        assert [os.getsid(t.pid) for t in tenants] == [t.pid for t in tenants]
        if bench.autogroup_enabled():
            groups = [Path(f"/proc/{t.pid}/autogroup").read_text().split() for t in tenants]
            want = [["nice", "19"], ["nice", "19"], ["nice", "0"], ["nice", "19"]]
            assert [g[-2:] for g in groups] == want
    finally:
        bench.stop_tenants(tenants)
    proc = subprocess.run(
        [sys.executable, "bench/pipeline_efficiency.py", "--targets", "1", "--drafters", "1"]
        + ["--busy", "1", "--busy-nice", "-5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "--busy-nice -5 is out of range: use a niceness from 0 to 19" in proc.stderr
