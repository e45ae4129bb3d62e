"""Baseline environments rebuilt from the lock stored with their record.

Every host run keeps the uv.lock (and the pyproject.toml beside it, which `uv sync`
needs for the extras) of the environment it measured, content-addressed in the store:
  locks/<sha256 of uv.lock>/uv.lock, pyproject.toml
A later run recreates the accepted baseline's environment from it:
  envs/<sha256>-<extra>/                     a venv, built once and reused
with `uv sync --frozen --extra EXTRA --no-install-project` (uv's cache makes this a
few seconds: files are hard-linked, nothing is downloaded twice), then this checkout
installed editable with no dependencies, so baseline and candidate run the same
trainer code and differ only in their environments.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dflash.bench.envs import BenchEnv

SYNC_TIMEOUT_S = 1800


class LockEnvError(RuntimeError):
    pass


def checkout_root() -> Path | None:
    """The source tree this dflash runs from, when it is a checkout (not a wheel)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").exists() and (root / "dflash").is_dir() else None


def save_lock(store_root: Path, lock_path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """Copy the lock (and its pyproject.toml) into the store; None without a lock."""
    if not lock_path:
        return None
    lock = Path(lock_path)
    project = lock.parent / "pyproject.toml"
    if not lock.is_file() or not project.is_file():
        return None
    data = lock.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    dest = store_root / "locks" / sha
    if not (dest / "uv.lock").exists():
        tmp = dest.with_name(f".tmp-{sha}-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "uv.lock").write_bytes(data)
        shutil.copyfile(project, tmp / "pyproject.toml")
        try:
            tmp.rename(dest)
        except OSError:  # another run stored the same lock first
            shutil.rmtree(tmp, ignore_errors=True)
    return {"sha256": sha, "path": str(dest / "uv.lock")}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SYNC_TIMEOUT_S)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise LockEnvError(f"{what} failed ({' '.join(cmd[:3])} ...): " + " | ".join(tail))


def lock_env(
    store_root: Path,
    sha: str,
    extra: str | None,
    log: Callable[[str], object] = print,
    label: str = "baseline",
) -> BenchEnv:
    """The venv of the stored lock `sha` for `extra`, built on first use."""
    uv = shutil.which("uv")
    if uv is None:
        raise LockEnvError("uv is not on PATH: cannot rebuild the baseline environment")
    src = store_root / "locks" / sha
    if not (src / "uv.lock").is_file():
        raise LockEnvError(f"the baseline's lock {sha[:12]} is not in the store ({src})")
    checkout = checkout_root()
    if checkout is None:
        raise LockEnvError("dflash is not running from a checkout: nothing to install")
    venv = store_root / "envs" / f"{sha}-{extra or 'none'}"
    python = venv / "bin" / "python"
    with _locked(store_root / "envs" / f".{venv.name}.lock"):
        if not (venv / ".complete").exists():
            log(f"building the baseline environment from lock {sha[:12]} in {venv}")
            shutil.rmtree(venv, ignore_errors=True)  # a half-built one from a crash
            env = {**os.environ, "UV_PROJECT_ENVIRONMENT": str(venv)}
            env.pop("VIRTUAL_ENV", None)
            sync = [uv, "sync", "--frozen", "--no-install-project", "--project", str(src)]
            sync += ["--python", getattr(sys, "_base_executable", sys.executable), "-q"]
            if extra:
                sync += ["--extra", extra]
            _run(sync, env, "uv sync of the baseline lock")
            _run(
                [
                    uv,
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--python",
                    str(python),
                    "-e",
                    str(checkout),
                ],
                env,
                "installing this checkout into the baseline environment",
            )
            (venv / ".complete").write_text(sha + "\n")
    return BenchEnv(python, label, origin=f"lock {sha[:12]} (extra {extra}), this checkout")
