"""Run the probe scripts inside the audited interpreter and gather their JSON.

Each probe runs as `python -I <probe file>`: isolated mode ignores PYTHONPATH,
the user site and the current directory, so what is audited is exactly the
interpreter's own environment. The probes run concurrently; importing torch
(~3 s) dominates, so the static audit costs no extra wall time. Under
`--no-import` the static probe is the longest (about 0.5 s): the CLI starts the
probes before importing the doctor's own modules, so those imports overlap it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .paths import sample_cache_path

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


def _start(
    python: str, script: str, flags: tuple[str, ...] = ("-I",), args: tuple[str, ...] = ()
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [python, *flags, str(HERE / script), *args],
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


def _start_static(python: str) -> subprocess.Popen[str]:
    # the probe keeps its libraries' sampled hashes there for the next run
    return _start(python, "probe.py", args=(str(sample_cache_path(python)),))


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


class Probes:
    """The probes of one audit, started and still running: `start_probes` returns at
    once, so the caller can import and read what it needs (the doctor's modules,
    uv.lock) while the interpreters work; `finish` waits and gathers."""

    def __init__(self, python: str | None, import_torch: bool) -> None:
        self.exe = resolve_python(python)
        self.procs: dict[str, subprocess.Popen[str]] = {}
        try:
            # the slowest first: torch's import, then the static probe's stat of every file
            if import_torch:
                self.procs["probe_torch.py"] = _start(self.exe, "probe_torch.py")
            self.procs["probe.py"] = _start_static(self.exe)
            # -S: site must not run here, the probe replays it without executing hooks
            self.procs["probe_startup.py"] = _start(self.exe, "probe_startup.py", ("-I", "-S"))
            self.procs["probe_gpu.py"] = _start(self.exe, "probe_gpu.py")
        except OSError as exc:
            self.kill()
            raise ProbeError(f"cannot run {self.exe}: {exc}") from exc

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    def finish(self) -> ProbeData:
        errors: list[str] = []
        procs = self.procs
        try:
            static = _finish(procs["probe.py"], "probe.py", STATIC_TIMEOUT_S)
            try:
                startup = _finish(procs["probe_startup.py"], "probe_startup.py", STATIC_TIMEOUT_S)
            except ProbeError as exc:
                errors.append(str(exc))
                startup = {"error": str(exc)}
            try:
                gpu = _finish(procs["probe_gpu.py"], "probe_gpu.py", STATIC_TIMEOUT_S)
            except ProbeError as exc:
                errors.append(str(exc))
                gpu = {"source": None, "gpus": [], "error": str(exc)}
            torch_data = None
            if "probe_torch.py" in procs:
                try:
                    torch_data = _finish(procs["probe_torch.py"], "probe_torch.py", TORCH_TIMEOUT_S)
                except ProbeError as exc:
                    # A crash (e.g. a segfault in a mismatched CUDA library) is itself a finding.
                    torch_data = {"imported": False, "error": str(exc)}
        finally:
            self.kill()
        return ProbeData(
            python=self.exe,
            static=static,
            gpu=gpu,
            torch=torch_data,
            errors=errors,
            startup=startup,
        )


def start_probes(python: str | None = None, import_torch: bool = True) -> Probes:
    return Probes(python, import_torch)


def collect(python: str | None = None, import_torch: bool = True) -> ProbeData:
    return start_probes(python, import_torch).finish()


def collect_static(python: str | None = None) -> dict[str, Any]:
    """Only the static probe: what `dflash env fingerprint/manifest` need."""
    exe = resolve_python(python)
    try:
        proc = _start_static(exe)
    except OSError as exc:
        raise ProbeError(f"cannot run {exe}: {exc}") from exc
    return _finish(proc, "probe.py", STATIC_TIMEOUT_S)
