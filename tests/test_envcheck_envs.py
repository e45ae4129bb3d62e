"""`dflash doctor` on REAL virtualenvs synced from uv.lock, then contaminated.

Each venv is `uv venv` + `uv pip sync` of `uv export --extra cu128` (dev group
included, to prove it is allowed): uv hardlinks the files from its cache, so a
7 GB environment costs about a second and no disk. Contamination only adds,
deletes or replaces files (uv replaces by unlink + link), never writes into a
file in place, so the uv cache and other venvs sharing those inodes stay intact.
Needs uv on PATH and PyPI for the few extra wheels (cached after the first run).
"""

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from isolated_env import scratch_beside_uv_cache
from packaging.markers import default_environment

from dflash.envcheck.lockfile import load_lock, resolve

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SITE = Path("lib") / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
EXTRA = "cu128"
BASE_PYTHON = str(
    Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
)


def locked_version(name: str, extra: str = EXTRA) -> str:
    """The version uv.lock installs for `name` with `extra` on this interpreter."""
    lock = load_lock(REPO / "uv.lock")
    return resolve(lock, extra, default_environment()).required[name].version


@pytest.fixture(scope="session")
def uv_env():
    exe = shutil.which("uv")
    assert exe, "uv is required on PATH (the Justfile and .ci/run install it)"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    return exe, env


@pytest.fixture(scope="session")
def venvs(tmp_path_factory, uv_env):
    uv, env = uv_env
    root = tmp_path_factory.mktemp("envcheck-venvs")
    # Hardlinks cannot cross filesystems: uv would copy 7 GB per venv.
    root = scratch_beside_uv_cache(root, "envcheck-venvs-")
    req = root / "requirements.txt"
    subprocess.run(
        [uv, "export", "--frozen", "--extra", EXTRA, "--no-emit-project", "--no-hashes", "-q", "-o", str(req)],
        cwd=REPO, env=env, check=True,
    )  # fmt: skip

    def uv_run(*args: str) -> None:
        subprocess.run([uv, *args], env=env, check=True, capture_output=True, timeout=600)

    def make(name: str) -> Path:
        venv = root / name
        uv_run("venv", "-q", str(venv), "--python", BASE_PYTHON)
        uv_run("pip", "sync", "-q", "--python", str(venv / "bin" / "python"), str(req))
        return venv

    make.uv = uv_run  # type: ignore[attr-defined]
    yield make
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def clean_env(venvs):
    return venvs("clean")


@pytest.fixture(scope="session")
def clean_report(clean_env):
    return doctor(clean_env)


@pytest.fixture
def dirty_env(venvs, request):
    venv = venvs(request.node.name[:40])
    yield venv
    shutil.rmtree(venv, ignore_errors=True)


def dflash(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dflash.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def doctor(venv: Path, *args: str, env: dict | None = None) -> dict:
    proc = dflash("doctor", "--python", str(venv / "bin" / "python"), "--json", *args, env=env)
    report = json.loads(proc.stdout)
    assert proc.returncode == report["exit_code"] == (0 if report["ok"] else 1), proc.stderr
    return report


def find(report: dict, code: str, **details) -> list[dict]:
    return [
        f
        for f in report["findings"]
        if f["code"] == code and all(f["details"].get(k) == v for k, v in details.items())
    ]


def errors(report: dict) -> list[str]:
    return sorted(f["code"] for f in report["findings"] if f["severity"] == "error")


def pip(venvs, venv: Path, *args: str) -> None:
    venvs.uv("pip", *args, "--python", str(venv / "bin" / "python"))


def test_clean_env_is_clean(clean_env, clean_report):
    assert (clean_env / SITE / "pytest").is_dir()  # dev group installed, must not be flagged
    assert clean_report["ok"] and errors(clean_report) == [], clean_report["findings"]
    warnings = [f for f in clean_report["findings"] if f["severity"] == "warning"]
    assert warnings == [], warnings
    # a locked distribution's own start-up hook is part of the locked environment
    hooks = {f["details"]["owner"]: f["severity"] for f in find(clean_report, "STARTUP_HOOK")}
    assert hooks.get("cuda-bindings") == "info", hooks
    assert find(clean_report, "RECORD_VERIFIED")[0]["details"]["mode"] == "quick"
    assert clean_report["extra"] == EXTRA
    assert find(clean_report, "TORCH_INFO")[0]["details"]["cuda"] == "12.8"
    assert not find(clean_report, "TORCH_IMPORT_SKIPPED")
    fast = doctor(clean_env, "--no-import")
    assert fast["ok"] and find(fast, "TORCH_IMPORT_SKIPPED")
    assert fast["fingerprint"] == clean_report["fingerprint"]


def test_library_copies_on_ld_library_path(clean_env, tmp_path):
    site = clean_env / SITE
    shutil.copy(site / "nvidia/cudnn/lib/libcudnn.so.9", tmp_path)  # identical copy
    shutil.copy(site / "nvidia/nvtx/lib/libnvToolsExt.so.1", tmp_path)
    with open(tmp_path / "libnvToolsExt.so.1", "ab") as fh:  # a copy, so no shared inode
        fh.write(b"another build")
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    report = doctor(clean_env, env=env)
    assert find(report, "LIB_SHADOWED", name="libnvToolsExt.so.1")[0]["severity"] == "error"
    assert find(report, "LIB_SHADOW_COPY", name="libcudnn.so.9")[0]["severity"] == "warning"
    # torch's DT_RPATH still wins at import: what it mapped is the wheel's copy
    assert not find(report, "LIB_OUTSIDE_ENV") and not find(report, "TORCH_IMPORT_FAILED")


def test_drift_after_the_image_was_built(venvs, dirty_env, clean_report):
    """A cu13 wheel, an unlocked package and a downgrade, added after `env manifest`."""
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    assert "six" not in {p["name"] for p in lock["package"]}, "pick another unlocked package"
    python = str(dirty_env / "bin" / "python")
    made = dflash("env", "manifest", "--python", python)
    assert made.returncode == 0, made.stderr
    manifest = dirty_env / "share" / "dflash" / "manifest.json"
    before = doctor(dirty_env, "--no-import")
    assert before["ok"] and find(before, "MANIFEST_MATCH")
    # same lock, another directory: same fingerprint
    assert before["fingerprint"] == clean_report["fingerprint"]

    nvtx, idna = locked_version("nvidia-nvtx", "cu130"), locked_version("idna")
    pip(venvs, dirty_env, "install", "-q", f"nvidia-nvtx=={nvtx}", "six", f"idna<{idna}")
    report = doctor(dirty_env)

    (mismatch,) = find(report, "CUDA_MAJOR_MISMATCH", package="nvidia-nvtx")  # (a)
    assert mismatch["details"]["cuda_major"] == 13 and mismatch["severity"] == "error"
    assert "never uninstall" in mismatch["fix"]
    (cu13,) = find(report, "UNLOCKED_PACKAGE", package="nvidia-nvtx")
    assert cu13["details"]["locked_for_extras"] == ["cu130"]
    (six,) = find(report, "UNLOCKED_PACKAGE", package="six")  # (b)
    assert "not in the lock at all" in six["message"]
    (down,) = find(report, "VERSION_MISMATCH", package="idna")  # (e)
    assert down["details"]["locked"] == idna and down["details"]["installed"] != idna
    (mutated,) = find(report, "ENV_MUTATED")
    dists = mutated["details"]["diff"]["distributions"]
    assert {"six", "nvidia-nvtx"} <= set(dists["added"]) and set(dists["changed"]) == {"idna"}
    assert mutated["fix"].startswith("rebuild the image")

    now = dirty_env / "now.json"
    assert dflash("env", "manifest", "--python", python, "--out", str(now)).returncode == 0
    diff = dflash("env", "diff", str(manifest), str(now))
    assert diff.returncode == 1 and "distributions: + six" in diff.stdout

    gate = (
        "import json; from dflash.envcheck import preflight, DirtyEnvironment\n"
        "quiet = dict(log=lambda s: None, import_torch=False)\n"
        "try:\n    preflight(False, **quiet)\nexcept DirtyEnvironment as e:\n"
        "    print('RAISED', 'six' in e.report)\n"
        "print(json.dumps(preflight(True, **quiet)['dirty']))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # dflash is not installed in this venv
    out = subprocess.run([python, "-c", gate], env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["RAISED", "True", "true"], out.stderr


def test_colliding_cuda13_wheel_then_manual_removal(venvs, dirty_env):
    """The story: a cu13 wheel overwrites the cu12 files; removing it deletes them."""
    lib = "nvidia/nvshmem/lib/libnvshmem_host.so.3"
    version = locked_version("nvidia-nvshmem-cu13", "cu130")
    pip(venvs, dirty_env, "install", "-q", f"nvidia-nvshmem-cu13=={version}")
    report = doctor(dirty_env)
    (coll,) = [f for f in find(report, "FILE_COLLISION") if lib in f["details"]["libraries"]]
    assert coll["details"]["libraries"][lib] == "nvidia-nvshmem-cu13"
    assert any(c.startswith("nvidia-nvshmem-cu12 ") for c in coll["details"]["claimants"])
    assert "deletes the only copy" in coll["fix"]
    assert find(report, "LIB_WRONG_OWNER", content_owner="nvidia-nvshmem-cu13")
    assert find(report, "CUDA_MAJOR_MISMATCH", package="nvidia-nvshmem-cu13")

    pip(venvs, dirty_env, "uninstall", "-q", "nvidia-nvshmem-cu13")  # what users did by hand
    cudnn = "nvidia/cudnn/lib/libcudnn.so.9"
    (dirty_env / SITE / cudnn).unlink()  # (c); a hardlink: the uv cache keeps its copy
    after = doctor(dirty_env)
    (hole,) = find(after, "FILE_MISSING", package="nvidia-nvshmem-cu12")
    assert lib in hole["details"]["libraries"]
    (gone,) = find(after, "FILE_MISSING", package="nvidia-cudnn-cu12")
    assert gone["details"]["libraries"] == [cudnn] and gone["details"]["count"] == 1
    assert "rm -rf" in gone["fix"] and f"--extra {EXTRA}" in gone["fix"]
    (failed,) = find(after, "TORCH_IMPORT_FAILED")
    assert "libnvshmem_host.so.3" in failed["message"] or "libcudnn.so.9" in failed["message"]
