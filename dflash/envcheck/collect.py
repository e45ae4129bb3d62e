"""Run the probe scripts inside the audited interpreter and gather their JSON.

Each probe runs as `python -I <probe file>`: isolated mode ignores PYTHONPATH,
the user site and the current directory, so what is audited is exactly the
interpreter's own environment. The probes run concurrently; importing torch
(~3 s) dominates, so the static audit costs no extra wall time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MARKER = "DFLASH_PROBE_JSON:"
STATIC_TIMEOUT_S = 120.0
TORCH_TIMEOUT_S = 300.0


class ProbeError(RuntimeError):
    """A probe could not run or produced no result."""


@dataclass
class ProbeData:
    python: str
    static: dict[str, Any]
    gpu: dict[str, Any]
    torch: dict[str, Any] | None  # None when the torch import probe was skipped
    errors: list[str] = field(default_factory=list)
    # probe_startup.py: the user's sys.path, start-up hooks, where modules resolve
    startup: dict[str, Any] | None = None


def _start(python: str, script: str, flags: tuple[str, ...] = ("-I",)) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [python, *flags, str(HERE / script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ),
    )


def _finish(proc: subprocess.Popen[str], script: str, timeout: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise ProbeError(f"{script} did not finish within {timeout:.0f} s") from None
    for line in reversed(out.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    tail = (err or out).strip()[-2000:]
    raise ProbeError(f"{script} exited with status {proc.returncode} and no result:\n{tail}")


def resolve_python(python: str | None) -> str:
    """The interpreter to audit. A venv's bin/python is kept as given: resolving
    the symlink would audit the base interpreter instead of the venv."""
    if python is None:
        return sys.executable
    path = Path(python)
    if path.is_dir():
        path = path / "bin" / "python"
    if not path.exists():
        raise ProbeError(f"no interpreter at {python}")
    return str(path.absolute())


def collect(python: str | None = None, import_torch: bool = True) -> ProbeData:
    exe = resolve_python(python)
    errors: list[str] = []
    torch_proc = gpu_proc = static_proc = startup_proc = None
    try:
        try:
            torch_proc = _start(exe, "probe_torch.py") if import_torch else None
            gpu_proc = _start(exe, "probe_gpu.py")
            static_proc = _start(exe, "probe.py")
            # -S: site must not run here, the probe replays it without executing hooks
            startup_proc = _start(exe, "probe_startup.py", ("-I", "-S"))
        except OSError as exc:
            raise ProbeError(f"cannot run {exe}: {exc}") from exc
        static = _finish(static_proc, "probe.py", STATIC_TIMEOUT_S)
        try:
            startup = _finish(startup_proc, "probe_startup.py", STATIC_TIMEOUT_S)
        except ProbeError as exc:
            errors.append(str(exc))
            startup = {"error": str(exc)}
        try:
            gpu = _finish(gpu_proc, "probe_gpu.py", STATIC_TIMEOUT_S)
        except ProbeError as exc:
            errors.append(str(exc))
            gpu = {"source": None, "gpus": [], "error": str(exc)}
        torch_data = None
        if torch_proc is not None:
            try:
                torch_data = _finish(torch_proc, "probe_torch.py", TORCH_TIMEOUT_S)
            except ProbeError as exc:
                # A crash (e.g. a segfault in a mismatched CUDA library) is itself a finding.
                torch_data = {"imported": False, "error": str(exc)}
    finally:
        for proc in (torch_proc, gpu_proc, static_proc, startup_proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    return ProbeData(
        python=exe, static=static, gpu=gpu, torch=torch_data, errors=errors, startup=startup
    )


def collect_static(python: str | None = None) -> dict[str, Any]:
    """Only the static probe: what `dflash env fingerprint/manifest` need."""
    exe = resolve_python(python)
    try:
        proc = _start(exe, "probe.py")
    except OSError as exc:
        raise ProbeError(f"cannot run {exe}: {exc}") from exc
    return _finish(proc, "probe.py", STATIC_TIMEOUT_S)
