"""The pinned environment: one lock, conflicting per-CUDA extras, and the cu128 stack."""

import importlib.metadata as md
import os
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lock_packages(name):
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    return [p for p in lock["package"] if p["name"] == name]


def test_extras_conflict_and_pin_torch():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = py["project"]["optional-dependencies"]
    assert extras["cu128"] == ["torch==2.10.0"]
    assert [sorted(e["extra"] for e in c) for c in py["tool"]["uv"]["conflicts"]] == [
        ["cu128", "cu130"]
    ]
    versions = {p["version"] for p in lock_packages("torch")}
    assert {"2.10.0", extras["cu130"][0].split("==")[1]} <= versions


def test_cu128_lock_uses_cuda12_wheels_only():
    torch_pkg = next(p for p in lock_packages("torch") if p["version"] == "2.10.0")
    nvidia = [
        d["name"] for d in torch_pkg.get("dependencies", []) if d["name"].startswith("nvidia")
    ]
    assert nvidia, "the cu128 torch should depend on nvidia-*-cu12 wheels"
    assert all(n.endswith("-cu12") for n in nvidia), nvidia


@pytest.mark.skipif(
    os.environ.get("DFLASH_EXTRA", "cu128") != "cu128", reason="environment is not the cu128 one"
)
def test_locked_cu128_environment_reports_cuda_12_8():
    import torch

    assert md.version("torch").split("+")[0] == "2.10.0"
    assert torch.version.cuda == "12.8"
