"""Where a repeat runs: an environment's own interpreter, started like `dflash train`.

Every repeat is a new process of the environment's console script (`BIN/dflash bench
worker SPEC OUT`), so it runs the environment's site hooks (`.pth` lines,
sitecustomize), sees its variables and enters through the same entry point as a
training run. A fork of a process that already ran them would not: fork copies only
the calling thread, so a thread that a `.pth` file starts at interpreter start-up
(telemetry and "autopatch" packages do this) would exist in every training process and
in no measured one.

`BenchEnv.variables` are set on top of the caller's environment and `unset` removed
from it: that is how `dflash bench bisect` applies a subset of variable changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPAWN_TIME_ENV = "DFLASH_BENCH_SPAWN_T"  # wall time at spawn: the worker's start-up time
# "DIR<os.pathsep>N": wait after the warm-up until DIR holds N files (runner._run_together)
BARRIER_ENV = "DFLASH_BENCH_RENDEZVOUS"


def exit_on_signal(signum: int, frame) -> None:
    """A signal handler (SIGTERM: `docker stop`, a CI timeout, a plain `kill`) that raises
    SystemExit(128 + signum), so the `finally` blocks run and end the children they own
    (run_worker's repeat, frozen ranks resumed, a probe's neighbours) instead of leaving
    them running on as orphans."""
    raise SystemExit(128 + signum)


@dataclass(frozen=True)
class BenchEnv:
    python: Path  # the environment's interpreter (BIN/python)
    label: str  # "candidate", "baseline", a bisect step, ...
    origin: str = "this interpreter"  # how it was made, for the record
    variables: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()

    @classmethod
    def current(cls, label: str = "candidate") -> BenchEnv:
        # sys.executable, not its resolved target: a venv's python is a symlink to the
        # base interpreter, and resolving it would leave the venv.
        return cls(Path(sys.executable), label)

    def command(self, spec: Path, out: Path) -> list[str]:
        script = self.python.parent / "dflash"
        if script.exists():  # the console script, as `dflash train` starts
            return [str(script), "bench", "worker", str(spec), str(out)]
        return [str(self.python), "-m", "dflash.bench.worker", str(spec), str(out)]

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in self.unset}
        env.update(self.variables)
        # The venv's bin first, as an activated environment (and the console script) has it.
        env["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("VIRTUAL_ENV", None)
        env[SPAWN_TIME_ENV] = repr(time.time())
        return env

    @property
    def where(self) -> str:
        return str(self.python)

    def run(self, spec: Path, out: Path, timeout: float) -> int:
        return run_worker(self, spec, out, timeout)

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "python": str(self.python),
            "origin": self.origin,
            "variables": dict(self.variables),
            "unset": list(self.unset),
        }


def run_worker(env: BenchEnv, spec: Path, out: Path, timeout: float) -> int:
    """One repeat in a fresh process of `env`; its output goes to our stderr."""
    proc = subprocess.Popen(
        env.command(spec, out), env=env.environ(), stdout=sys.stderr, stderr=sys.stderr
    )
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    except BaseException:  # Ctrl-C: never leave a repeat running behind us
        proc.kill()
        proc.wait()
        raise
