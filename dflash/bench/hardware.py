"""Hardware fingerprint: what a throughput figure is only comparable within.

The key covers CPU model, usable CPU count, GPU model and GPU count. The driver is
recorded but kept out of the key: a driver update is an environment change that the
comparison should report, not a reason to refuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from typing import Any

KEY_FIELDS = ("cpu_model", "cpu_count", "gpu_models", "gpu_count")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_count() -> int:
    """CPUs this process may run on (a cgroup/affinity limit, not the host's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def gpus() -> tuple[list[str], str | None]:
    """(GPU names, driver version) from nvidia-smi; ([], None) without NVIDIA tooling."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [], None
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    return [r[0] for r in rows], (rows[0][1] if rows and len(rows[0]) > 1 else None)


def hardware_fingerprint() -> dict[str, Any]:
    names, driver = gpus()
    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "cpu_count": cpu_count(),
        "machine": platform.machine(),
        "memory_gib": _memory_gib(),
        "gpu_models": sorted(set(names)),
        "gpu_count": len(names),
        "gpu_names": names,
        "driver": driver,
        "hostname": platform.node(),
    }
    info["key"] = hardware_key(info)
    return info


def hardware_key(info: dict[str, Any]) -> str:
    blob = json.dumps({k: info.get(k) for k in KEY_FIELDS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _memory_gib() -> float | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * size / 2**30, 1)


def describe(info: dict[str, Any]) -> str:
    gpu = f"{info['gpu_count']}x {'/'.join(info['gpu_models'])}" if info["gpu_count"] else "no GPU"
    return f"{info['cpu_model']} ({info['cpu_count']} CPUs), {gpu}"
