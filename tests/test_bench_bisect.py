"""`dflash bench bisect`: delta debugging over environment differences, and the
spliced environments it measures (real small venvs; the slow test measures for real)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_bench_fidelity import REPO, root  # noqa: F401 - the fixture
from wheels import busy_thread_wheel, inert_wheel, make_wheel

from dflash.bench.bisect import ddmin, ddmin_bound, single_cause_count
from dflash.bench.envsplice import Change, differences, inventory, splice


def changes(n: int) -> list[Change]:
    return [Change(f"pkg{i}", "added", None, "1.0") for i in range(n)]


@pytest.mark.parametrize(
    "culprits", [{"pkg5"}, {"pkg0"}, {"pkg2", "pkg6"}, {"pkg1", "pkg3", "pkg7"}]
)
def test_ddmin_finds_exactly_the_culprits(culprits):
    tested: list[frozenset] = []

    def slow(subset):
        names = frozenset(c.name for c in subset)
        tested.append(names)
        return culprits <= names  # slow only with every culprit present

    best: list = []
    found = ddmin(changes(8), slow, best)
    assert {c.name for c in found} == culprits and best[0] == found
    assert len(tested) <= ddmin_bound(8)
    if len(culprits) == 1:
        assert len(tested) + 1 <= single_cause_count(8)  # +1: the confirmation run


def test_bounds():
    assert ddmin_bound(8) == 89 and single_cause_count(8) == 7 and single_cause_count(1) == 1


def test_inconclusive_rounds_get_a_second_one():
    from dflash.bench.bisect import inconclusive
    from dflash.bench.paired import paired_verdict

    def verdict(ratios):
        return paired_verdict(ratios, [1.0] * len(ratios), 0.05, 0.07)

    # Like CI's 2026-12-07 round of the slow package alone: 0.980x [0.774, 1.051].
    burst = verdict([0.774, 0.980, 1.051, 0.99, 0.80])
    assert burst.verdict == "pass" and burst.ratio > 0.93 and inconclusive(burst, 0.07)
    # One noisy pair in five: slower beyond the effect, not significant.
    assert inconclusive(verdict([0.79, 0.80, 0.78, 1.004, 0.81]), 0.07)
    # A quiet harmless subset is settled in one round; a regression is never retried.
    assert not inconclusive(verdict([1.006, 0.99, 1.02, 0.97, 1.01]), 0.07)
    slow = verdict([0.79, 0.80, 0.78, 0.77, 0.81])
    assert slow.verdict == "regression" and not inconclusive(slow, 0.07)


def uv(*args: str) -> None:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run(["uv", *args], check=True, capture_output=True, timeout=300, env=env)


def small_venv(path: Path, *wheels: Path) -> Path:
    uv("venv", "-q", str(path), "--python", sys._base_executable)
    if wheels:
        uv("pip", "install", "-q", "--python", str(path / "bin" / "python"), *map(str, wheels))
    return path / "bin" / "python"


def test_splice_applies_added_removed_and_changed(tmp_path):
    w = tmp_path / "w"
    a, b = inert_wheel(w, "alpha"), inert_wheel(w, "beta")
    g1 = make_wheel(w / "g1", "gamma", "1.0", {"gamma.py": "V = 1\n"})
    g2 = make_wheel(w / "g2", "gamma", "2.0", {"gamma.py": "V = 2\n"})
    tool = make_wheel(
        w, "tool", "1.0",
        {"tool.py": "def main():\n    print('tool ran')\n",
         "tool-1.0.dist-info/entry_points.txt": "[console_scripts]\ntool = tool:main\n"},
    )  # fmt: skip
    good = small_venv(tmp_path / "good", a, g1)
    bad = small_venv(tmp_path / "bad", b, g2, tool)
    gi, bi = inventory(good), inventory(bad)
    diff = {str(c) for c in differences(gi, bi)}
    assert diff == {"+ beta 1.0", "+ tool 1.0", "- alpha 1.0", "~ gamma 1.0 -> 2.0"}
    chosen = [c for c in differences(gi, bi) if c.name in ("gamma", "tool", "alpha")]
    py = splice(gi, bi, chosen, tmp_path / "mid")
    names = {n: d["version"] for n, d in inventory(py)["dists"].items()}
    assert names.get("gamma") == "2.0" and "tool" in names
    assert "alpha" not in names and "beta" not in names
    out = subprocess.run(
        [str(py), "-c", "import gamma; print(gamma.V)"], capture_output=True, text=True
    )
    assert out.stdout.strip() == "2"
    # The console script runs the copy's interpreter; GOOD itself is untouched.
    ran = subprocess.run([str(py.parent / "tool")], capture_output=True, text=True)
    assert ran.stdout.strip() == "tool ran"
    assert (py.parent / "tool").read_text().startswith(f"#!{tmp_path / 'mid'}")
    assert inventory(good)["dists"]["gamma"]["version"] == "1.0"
    assert "alpha" in inventory(good)["dists"]


def test_splice_rewrites_long_path_trampolines(tmp_path):
    # Past the kernel's 127-byte shebang limit uv writes a /bin/sh trampoline that execs
    # the interpreter: a copy whose scripts still named GOOD's ran GOOD (measured 1.04x
    # for a 0.8x environment in a bisect from a deep pytest directory).
    deep = tmp_path / ("d" * 120)
    w = tmp_path / "w"
    tool = make_wheel(
        w, "tool", "1.0",
        {"tool.py": "import sys\ndef main():\n    print(sys.prefix)\n",
         "tool-1.0.dist-info/entry_points.txt": "[console_scripts]\ntool = tool:main\n"},
    )  # fmt: skip
    good = small_venv(deep / "good", tool)
    assert not (good.parent / "tool").read_text().startswith(f"#!{good}")  # a trampoline
    inv = inventory(good)
    py = splice(inv, inv, [], deep / "copy")
    ran = subprocess.run([str(py.parent / "tool")], capture_output=True, text=True)
    assert ran.stdout.strip() == str(deep / "copy")


@pytest.mark.slow
@pytest.mark.parametrize(
    "inert",
    [
        1,  # CI: the whole path (difference, splice, paired rounds, verdict) in two measurements
        pytest.param(7, marks=pytest.mark.quality),  # one of 8, as issue 15 asks: ~10-30 min
    ],
)
def test_bisect_names_the_one_slow_package(root, inert):  # noqa: F811
    from dflash.bench.lockenv import lock_env, save_lock

    sha = save_lock(root / "envs", REPO / "uv.lock")["sha256"]
    good = lock_env(root / "envs", sha, "cu128", label="good").python.parent.parent
    bad = root / "bad"
    same = inventory(good / "bin" / "python")
    splice(same, same, [], bad)  # a hard-link copy of GOOD, then the extra packages
    w = root / "wheels"
    wheels = [inert_wheel(w, f"inert-extra-{i}") for i in range(inert)]
    wheels.insert(inert // 2, busy_thread_wheel(w, "busy-telemetry", busy=0.001, idle=0.004))
    uv("pip", "install", "-q", "--python", str(bad / "bin" / "python"), *map(str, wheels))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dflash"), "bench", "bisect", str(good), str(bad),
         "--steps", "10", "--store", str(root / "store")],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    out = proc.stdout
    print(out)  # the measurements, with -s
    n = inert + 1
    assert proc.returncode == 1, out + proc.stderr[-3000:]
    assert f"{n} differences" in out and f"at most {ddmin_bound(n)} paired measurements" in out
    tail = out.split("minimal set that reproduces the slowdown:")[1].split()
    assert tail[:3] == ["+", "busy-telemetry", "1.0"] and len(tail) == 3, out
    shutil.rmtree(bad, ignore_errors=True)


def test_variable_changes_and_their_subsets():
    from dflash.bench.bisect import VAR, _assignments, subset_variables, variable_changes
    from dflash.bench.envsplice import SpliceError

    good = {"OMP_NUM_THREADS": "2", "MKL_X": "1"}
    bad = {"OMP_NUM_THREADS": "1", "TORCH_Y": "on"}
    found = {str(c) for c in variable_changes(good, bad)}
    assert found == {"~ $OMP_NUM_THREADS 2 -> 1", "- $MKL_X 1", "+ $TORCH_Y on"}
    every = variable_changes(good, bad)
    assert subset_variables(good, every) == bad  # all of them: BAD's variables
    only = [c for c in every if c.name == VAR + "TORCH_Y"]
    assert subset_variables(good, only) == {**good, "TORCH_Y": "on"}
    assert _assignments(["A=1", "B=x=y"], "--bad-env") == {"A": "1", "B": "x=y"}
    with pytest.raises(SpliceError, match="--bad-env 'nope': expected NAME=VALUE"):
        _assignments(["nope"], "--bad-env")


@pytest.mark.slow
def test_bisect_record_ids_and_variables_names_the_slow_setting(root):  # noqa: F811
    """GOOD and BAD are a bench record id (its stored lock rebuilt as a venv); BAD's runs
    add two variables, one harmless and one that makes every allocation an mmap (measured
    about 2x slower on tiny-cpu): the bisection names that one."""
    from bench_fakes import make_record

    from dflash.bench.lockenv import save_lock
    from dflash.bench.store import Store

    store = Store(root / "store")
    rec = make_record([100.0, 101.0, 99.0])
    rec["environment"]["lock"] = save_lock(store.root, REPO / "uv.lock")
    store.add(rec)
    slow_malloc = "GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4096"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "dflash"), "bench", "bisect", rec["id"], rec["id"][:12],
         "--bad-env", slow_malloc, "--bad-env", "TORCH_BISECT_INERT=1",
         "--steps", "6", "--store", str(store.root)],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr[-3000:]
    assert "2 differences" in out and "+ $TORCH_BISECT_INERT 1" in out
    tail = out.split("minimal set that reproduces the slowdown:")[1].split()
    assert tail == ["+", "$GLIBC_TUNABLES", slow_malloc.split("=", 1)[1]], out
