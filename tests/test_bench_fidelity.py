"""The bench measures what `dflash train` runs: real environments, real processes.

- A package whose `.pth` file starts a busy thread at interpreter start-up (as
  telemetry and "autopatch" packages do) slows every training process. Repeats forked
  from a server that had already started never had that thread, and the bench passed
  such an environment. Each repeat is now a fresh interpreter of the environment, and
  the paired run against the baseline's environment (rebuilt from the stored lock)
  exits 1 and names the package.
- The bench's steady tok/s and a plain `dflash train` run's tok/s on the same shapes,
  measured side by side (one pinned CPU each, swapped every round), agree within 10%.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from isolated_env import scratch_beside_uv_cache
from wheels import busy_thread_wheel

from dflash.bench.lockenv import lock_env, save_lock

REPO = Path(__file__).resolve().parents[1]
EXTRA = "cu128"
pytestmark = pytest.mark.slow


@pytest.fixture
def root(tmp_path):
    """A scratch directory on the uv cache's filesystem, so venvs are hard links."""
    where = scratch_beside_uv_cache(tmp_path, "bench-fidelity-")
    yield where
    shutil.rmtree(where, ignore_errors=True)


def bench(python: Path, store: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(
        [str(python.parent / "dflash"), "bench", "run", "--store", str(store), *args],
        capture_output=True, text=True, timeout=1800, env=env, cwd=REPO,
    )  # fmt: skip


def test_busy_thread_pth_package_fails_the_bench_and_is_named(root):
    store = root / "store"
    first = bench(Path(sys.executable), store, "--repeats", "2")
    assert first.returncode == 0 and "auto-accepted" in first.stdout, first.stderr[-3000:]

    # The candidate: the same lock plus one package whose .pth starts a thread that
    # holds the GIL 1 ms in every 5 (the fully busy one of the bug report made steps
    # 70x slower; this keeps the test short and is still a clear slowdown).
    sha = save_lock(root / "cand", REPO / "uv.lock")["sha256"]
    cand = lock_env(root / "cand", sha, EXTRA, label="candidate").python
    wheel = busy_thread_wheel(root / "wheels", "busy-telemetry", busy=0.001, idle=0.004)
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", str(cand), str(wheel)], check=True, timeout=300
    )
    # The workload's 10 pairs, as `just bench` runs: with 5, all five must be slower for
    # p < 0.05, and CI once read pairs 0.73, 0.91, 0.95, 1.06, 0.77 for a ~22% slowdown
    # (reference-corrected 0.71-0.79; the two cores ran at different speeds within the
    # pairs: reference 13.9 against 17.3 ms), a PASS at p = 2/32.
    run = bench(cand, store)
    out = run.stdout
    assert run.returncode == 1, out + run.stderr[-3000:]
    assert "REGRESSION" in out and "measured beside this one" in out
    assert "busy-telemetry" in out  # the environment diff names the package
    rec = json.loads(Path(out.split("record: ")[1].splitlines()[0]).read_text())
    assert rec["comparison"]["method"] == "paired"
    assert rec["paired"]["env"]["origin"].startswith(f"lock {sha[:12]}")
    # Start-up and imports are timed apart from the steady state, in every repeat.
    assert all(r["startup_s"] > 0 and r["import_s"] > 0 for r in rec["repeats"])


def train_tok_per_s(out: Path, steps: int) -> float:
    """Steady tok/s of a plain `dflash train` on tiny-cpu's shapes (logging windows
    after the first, which holds lazy initialisation)."""
    from dflash.bench.workload_setup import train_config
    from dflash.bench.workloads import get_workload

    w = get_workload("tiny-cpu")
    cfg = train_config(w, str(out))
    flags = {
        "preset": "tiny", "data": "random", "device": "cpu", "wandb": "off",
        "seq-len": cfg.seq_len, "rows": cfg.rows, "block-size": cfg.block_size,
        "max-anchors": cfg.max_anchors, "draft-layers": cfg.draft_layers,
        "min-doc-len": cfg.min_doc_len, "max-doc-len": cfg.max_doc_len,
        "max-steps": steps, "log-every": 10, "out": str(out),
    }  # fmt: skip
    argv = [x for k, v in flags.items() for x in (f"--{k}", str(v))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the workload's one intra-op thread
    proc = subprocess.run(
        [sys.executable, "-m", "dflash", "train", *argv],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tok_per_s"] for r in lines[1:])


def bench_tok_per_s(python: Path, tmp: Path, steps: int) -> float:
    from dflash.bench.envs import BenchEnv
    from dflash.bench.runner import run_repeats
    from dflash.bench.workloads import get_workload

    w = get_workload("tiny-cpu").with_changes(repeats=1, steps=steps)
    (rep,) = run_repeats(w, lambda _: None, BenchEnv(python, "fidelity"))
    return statistics.median(s["tok_per_s"] for s in rep["steps"])


def on_cpu(cpu: int, fn, *args):
    """fn(*args) with this thread, and so every process it starts, pinned to one CPU."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # pid 0: the calling thread only
    try:
        return fn(*args)
    finally:
        os.sched_setaffinity(0, allowed)


def test_bench_and_dflash_train_agree_on_tok_per_s(tmp_path):
    # Side by side: in each round the trainer and one bench repeat run at the same time,
    # one thread each, each pinned to its own CPU, so the host's speed (it drifts by up to
    # 25% within seconds on this virtual machine, docs/bench.md) is the same for both.
    # The CPUs swap every round, so a slower CPU weighs on each side equally. Both run
    # ~10 s of steady steps, so those phases overlap despite their different start-ups.
    # Measured on this VM: with the workload's 30 steps and no pinning the rounds' ratios
    # spread 0.85-1.17 (a median of 3 read 1.107 once in CI); with 100 steps, pinned,
    # five of six rounds read 0.97-1.03 and one 1.17, so the median of six holds.
    from concurrent.futures import ThreadPoolExecutor

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("side by side needs two cores")
    ratios, seen = [], []
    with ThreadPoolExecutor(2) as pool:
        for i in range(6):
            a, b = cpus[i % 2], cpus[1 - i % 2]
            train = pool.submit(on_cpu, a, train_tok_per_s, tmp_path / f"run{i}", 111)
            bench_ = pool.submit(on_cpu, b, bench_tok_per_s, Path(sys.executable), tmp_path, 100)
            seen.append((round(bench_.result()), round(train.result())))
            ratios.append(bench_.result() / train.result())
    ratio = statistics.median(ratios)
    print(f"bench vs dflash train tok/s per round {seen}: median ratio {ratio:.3f}")
    assert 0.9 <= ratio <= 1.1, f"bench vs dflash train tok/s per round {seen}: {ratio:.3f}x"
