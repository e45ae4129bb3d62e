"""uv.lock parsing, marker evaluation, the per-extra dependency walk, lock discovery."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_envcheck_fakes import ENV as LINUX
from test_envcheck_fakes import SYNTHETIC

from dflash.envcheck.lockfile import (
    LockError,
    detect_extra,
    encoded_extra,
    find_lock,
    load_lock,
    marker_matches,
    parse_lock,
    resolve,
)
from dflash.envcheck.paths import baked_lock_path

ROOT = Path(__file__).resolve().parents[1]
WINDOWS = {**LINUX, "sys_platform": "win32", "platform_system": "Windows", "os_name": "nt"}


@pytest.fixture
def lock():
    return parse_lock(SYNTHETIC)


def test_extra_selects_its_own_torch_and_cuda_stack(lock):
    cu128 = resolve(lock, "cu128", LINUX)
    assert {n: p.version for n, p in cu128.required.items()} == {
        "numpy": "2.3.0",
        "torch": "2.10.0",
        "nvidia-cudnn-cu12": "9.10.2.21",
    }
    cu130 = resolve(lock, "cu130", LINUX)
    assert cu130.required["torch"].version == "2.15.0"
    # the conflict-encoded marker admits cuda-toolkit only for cu130, with its [cublas] extra
    assert {"cuda-toolkit", "nvidia-cublas", "nvidia-cudnn-cu13"} <= set(cu130.required)
    assert "nvidia-cudnn-cu12" not in cu130.required
    assert cu130.closure("torch") == {"torch", "cuda-toolkit", "nvidia-cublas", "nvidia-cudnn-cu13"}


def test_dev_group_is_allowed_not_required(lock):
    res = resolve(lock, "cu128", LINUX)
    assert set(res.dev) == {"pytest", "pluggy"}  # numpy is required, so not listed as dev


def test_platform_markers_are_evaluated_for_the_interpreter(lock):
    assert "colorama" not in resolve(lock, "cu128", LINUX).required
    win = resolve(lock, "cu128", WINDOWS)
    assert "colorama" in win.required
    assert "nvidia-cudnn-cu12" not in win.required


def test_marker_matches_uses_uv_extra_encoding():
    conflict = "(sys_platform == 'linux' or extra == 'extra-14-dflash-trainer-cu128') and extra == 'extra-14-dflash-trainer-cu130'"
    assert encoded_extra("dflash-trainer", "cu130") == "extra-14-dflash-trainer-cu130"
    assert marker_matches(conflict, LINUX, {"cu130", encoded_extra("dflash-trainer", "cu130")})
    assert not marker_matches(conflict, LINUX, {"cu128", encoded_extra("dflash-trainer", "cu128")})
    assert not marker_matches(conflict, LINUX, set())
    assert marker_matches(None, LINUX, set())
    with pytest.raises(LockError):
        marker_matches("sys_platform === ", LINUX, set())


def test_detect_extra_from_installed_torch(lock):
    assert detect_extra(lock, {"torch": "2.10.0"}) == "cu128"
    assert detect_extra(lock, {"torch": "2.15.0+cu130"}) == "cu130"
    assert detect_extra(lock, {"torch": "2.9.0"}) is None
    assert detect_extra(lock, {}) is None


def test_unknown_extra_and_broken_locks_are_errors(lock):
    with pytest.raises(LockError, match="unknown extra"):
        resolve(lock, "rocm", LINUX)
    with pytest.raises(LockError, match="not valid TOML"):
        parse_lock("[[package]\n")
    with pytest.raises(LockError, match="expected one `dflash-trainer`"):
        parse_lock('[[package]]\nname = "numpy"\nversion = "1"\n')
    with pytest.raises(LockError, match="no \\[\\[package\\]\\] entry"):
        resolve(
            parse_lock(SYNTHETIC.replace('{ name = "pluggy" }', '{ name = "plugy" }')), None, LINUX
        )


@pytest.mark.parametrize("extra", ["cu128", "cu130"])
def test_walk_matches_uv_export_of_the_real_lock(extra):
    """The doctor's idea of 'what the extra needs' is exactly uv's."""
    uv = shutil.which("uv")
    assert uv, "uv is required (see Justfile); it is installed by .ci/run"
    out = subprocess.run(
        [
            uv,
            "export",
            "--frozen",
            "--extra",
            extra,
            "--no-dev",
            "--no-emit-project",
            "--no-hashes",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {}
    for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)(?: ; (.*))?$", out, re.M):
        if marker_matches(m.group(3), LINUX, set()):
            exported[m.group(1).lower()] = m.group(2)
    res = resolve(load_lock(ROOT / "uv.lock"), extra, LINUX)
    walked = {n: p.version for n, p in res.required.items() if n != "dflash-trainer"}
    assert walked == exported


def _project(tmp_path: Path, name: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    (tmp_path / "uv.lock").write_text(SYNTHETIC)
    return tmp_path


def test_find_lock_search_order(tmp_path):
    proj = _project(tmp_path / "proj", "dflash-trainer")
    sub = proj / "a" / "b"
    sub.mkdir(parents=True)
    prefix = tmp_path / "venv"
    baked_lock_path(prefix).parent.mkdir(parents=True)
    baked_lock_path(prefix).write_text(SYNTHETIC)
    assert find_lock("/x/uv.lock", str(prefix), [sub], {})[0] == Path("/x/uv.lock")
    assert find_lock(None, str(prefix), [sub], {"DFLASH_LOCK": "/y.lock"})[0] == Path("/y.lock")
    assert find_lock(None, str(prefix), [sub], {})[0] == proj / "uv.lock"
    assert find_lock(None, str(prefix), [tmp_path], {}) == (
        baked_lock_path(prefix),
        "baked into the image",
    )
    assert find_lock(None, None, [tmp_path], {}) == (None, "not found")


def test_find_lock_ignores_other_projects(tmp_path):
    other = _project(tmp_path / "other", "someone-else")
    assert find_lock(None, None, [other], {}) == (None, "not found")
