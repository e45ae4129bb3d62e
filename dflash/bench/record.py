"""The run record: one JSON document per `dflash bench` run, never edited after.

Keys: workload (name, hash, definition), hardware (fingerprint and key), environment
(key, fingerprint, CUDA variant, the doctor's manifest and findings, thread settings
and variables, image identity when run in an image), git revision, time, every
sample of every repeat, the summary, and the verdict against the baseline at the time.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

from dflash.bench.workloads import Workload

SCHEMA = 1
IMAGE_KEY_ENV = "DFLASH_IMAGE_KEY"  # set by the image build: its content key


def git_revision(start: Path | None = None) -> dict[str, Any]:
    """HEAD and whether tracked files differ from it; from the image label if no checkout."""
    where = start or Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return {"revision": rev, "dirty": bool(status.strip()), "source": "git"}
    except (OSError, subprocess.SubprocessError):
        env_rev = os.environ.get("DFLASH_GIT_REVISION")
        return {"revision": env_rev, "dirty": None, "source": "env" if env_rev else None}


def environment_block(manifest: dict[str, Any], doctor: dict[str, Any]) -> dict[str, Any]:
    image_key = os.environ.get(IMAGE_KEY_ENV)
    torch_info = manifest.get("torch") or {}
    return {
        "kind": "image" if image_key else "host",
        "key": image_key or manifest.get("fingerprint"),
        "fingerprint": manifest.get("fingerprint"),
        # The CUDA variant the environment was synced for (the lock extra); torch's own
        # CUDA version when no lock is found.
        "variant": doctor.get("extra") or manifest.get("extra") or torch_info.get("cuda"),
        "dirty": bool(doctor.get("dirty")),
        "doctor": doctor,
        "manifest": manifest,
        "runner": "local",
        "image": None,
    }


def build_record(
    w: Workload,
    repeats: list[dict[str, Any]],
    summary: dict[str, Any],
    hardware: dict[str, Any],
    environment: dict[str, Any],
) -> dict[str, Any]:
    now = time.time()
    first = repeats[0] if repeats else {}
    return {
        "schema": SCHEMA,
        "time_unix": now,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
        "workload": {
            "name": w.name,
            "hash": w.hash(),
            "topology": w.topology,
            "definition": w.definition(),
        },
        "hardware": hardware,
        "environment": environment,
        "settings": {
            "threads": first.get("threads"),
            "interop_threads": first.get("interop_threads"),
            "variables": first.get("variables", {}),
            "torch": first.get("torch"),
            "torch_cuda": first.get("torch_cuda"),
            "devices": first.get("devices", []),
        },
        "git": git_revision(),
        "summary": summary,
        "repeats": repeats,
    }


def collect_environment(log) -> dict[str, Any]:
    """The doctor's verdict and manifest of this interpreter. The bench never refuses
    a dirty environment (catching one is its job): it records the findings instead."""
    from dflash.envcheck import environment_manifest, preflight

    doctor = preflight(allow_dirty=True, log=log)
    return environment_block(environment_manifest(), doctor)
