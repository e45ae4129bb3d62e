"""The distribution is `dflash-trainer` (PyPI's `dflash` is z-lab's decoder); the import
package and the command stay `dflash`; `dflash doctor` names z-lab's `dflash` installed
beside ours, for a wheel install (a recorded file collision) and an editable one (their
dflash/ in site-packages wins the import over our editable path)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dflash.envcheck.lockfile import ROOT_NAME, canonical

REPO = Path(__file__).resolve().parents[1]
DIST = "dflash-trainer"
ZLAB = "dflash==0.1.0"  # z-lab's published decoder: installs dflash/ too
BASE_PYTHON = str(
    Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
)


def test_names_agree_everywhere():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    assert project["name"] == DIST == ROOT_NAME
    assert project["scripts"] == {"dflash": "dflash.cli:main"}
    assert pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["dflash"]
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    roots = [p for p in lock["package"] if p.get("source", {}).get("editable") == "."]
    assert [canonical(p["name"]) for p in roots] == [DIST]
    assert {c["package"] for group in lock.get("conflicts", []) for c in group} == {DIST}
    for variant in ("cu128", "cu130"):
        text = (REPO / f"Dockerfile.{variant}").read_text()
        assert f"--reinstall-package {DIST}" in text
        assert f'org.opencontainers.image.title="{DIST}"' in text


@pytest.fixture(scope="module")
def uv():
    exe = shutil.which("uv")
    assert exe, "uv is required on PATH (the Justfile and .ci/run install it)"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)

    def run(*args: str) -> None:
        subprocess.run([exe, *args], env=env, check=True, capture_output=True, timeout=600)

    return run


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, uv):
    out = tmp_path_factory.mktemp("wheel")
    uv("build", "--wheel", "-q", "--out-dir", str(out), str(REPO))
    (whl,) = out.glob("dflash_trainer-*.whl")
    return whl


def make_env(uv, root: Path, ours: list[str], zlab: bool) -> Path:
    uv("venv", "-q", "--python", BASE_PYTHON, str(root))
    python = str(root / "bin" / "python")
    uv("pip", "install", "-q", "--no-deps", "--python", python, *ours)
    if zlab:
        uv("pip", "install", "-q", "--no-deps", "--python", python, ZLAB)
    return root


def collisions(venv: Path) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "dflash.cli", "doctor", "--python", str(venv / "bin" / "python")]
        + ["--no-import", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(proc.stdout)
    return [f for f in report["findings"] if f["code"] == "FILE_COLLISION"]


@pytest.mark.slow
@pytest.mark.parametrize("install", ["wheel", "editable"])
def test_doctor_names_zlab_dflash_beside_ours(tmp_path, uv, wheel, install):
    ours = [str(wheel)] if install == "wheel" else ["-e", str(REPO)]
    alone = make_env(uv, tmp_path / "alone", ours, zlab=False)
    assert collisions(alone) == []  # ours alone: nothing to report
    both = make_env(uv, tmp_path / "both", ours, zlab=True)
    (found,) = collisions(both)
    assert found["severity"] == "error"
    assert found["details"]["claimants"] == ["dflash 0.1.0", f"{DIST} 0.1.0"]
    assert "dflash/__init__.py" in found["details"]["files"]
    assert "dflash 0.1.0 and dflash-trainer 0.1.0" in found["message"]
    assert "recreate the environment" in found["fix"]
