"""Isolated Python environments for tests that need a *real* other reader.

A test that checks what transformers 4.57.1 (or z-lab's decoder) makes of our files must run
that code in its own environment, never in the project venv: `isolated_python` builds one
with `uv venv` + `uv pip install PINS` (then `uv pip install --no-deps NO_DEPS`, for packages
whose own pins would fight the ones given), caches it under a directory keyed by the pins and
the interpreter, and returns its interpreter. The wheels come from uv's cache when the project
sync already put them there (torch), so a rebuild is a link, not a download.

The cache lives in `$DFLASH_TEST_ENVS` (default `~/.cache/dflash/test-envs`) and is reused
across runs and checkouts. A build that died half-way leaves no `ready.json` and is redone;
builds of one key are serialised with a file lock, so parallel tests (or helpers) wait for
each other instead of racing on one directory.

Run reader code there as a subprocess: `run_json(python, SCRIPT, *args)` for a script that
prints one JSON document.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

SCHEMA = "dflash-test-env/1"


def envs_root() -> Path:
    explicit = os.environ.get("DFLASH_TEST_ENVS")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    root = Path(cache) / "dflash" / "test-envs"
    # uv links wheels from its cache; hardlinks cannot cross filesystems, and a copy of
    # torch's CUDA wheels is ~3 GB per environment. Keep the envs beside uv's cache.
    uv_cache = _uv_cache_dir()
    if uv_cache is not None and _device(root) != _device(uv_cache):
        root = uv_cache.parent / "dflash-test-envs"
    return root


def scratch_beside_uv_cache(default: Path, prefix: str) -> Path:
    """`default` when it is on the uv cache's filesystem, else a fresh directory beside
    the cache: venvs made by uv are then hard links, not copies (gigabytes each). The
    caller removes a directory it was given that is not `default`."""
    cache = _uv_cache_dir()
    if cache is None:
        raise RuntimeError("`uv cache dir` failed: uv is required on PATH (.ci/run installs it)")
    cache.mkdir(parents=True, exist_ok=True)
    if _device(cache) == _device(default):
        return default
    return Path(tempfile.mkdtemp(prefix=prefix, dir=cache.parent))


def _device(path: Path) -> int | None:
    for p in (path, *path.parents):  # the nearest existing ancestor decides
        if p.exists():
            return os.stat(p).st_dev
    return None


def _uv_cache_dir() -> Path | None:
    proc = subprocess.run([_uv(), "cache", "dir"], capture_output=True, text=True)
    return Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None


def _uv() -> str:
    uv = shutil.which("uv")
    if not uv:
        raise RuntimeError("uv is not on PATH: install it (`pip install uv`; .ci/run does it)")
    return uv


def env_key(pins: Sequence[str], no_deps: Sequence[str] = ()) -> str:
    """Hash of everything that decides the environment's contents."""
    doc = {
        "schema": SCHEMA,
        "python": sys.version.split()[0],
        "pins": sorted(pins),
        "no_deps": sorted(no_deps),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _uv_run(args: list[str], what: str) -> None:
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    # A VIRTUAL_ENV from the caller (the project venv) must not redirect `uv pip install`.
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([_uv(), *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def isolated_python(name: str, pins: Sequence[str], no_deps: Sequence[str] = ()) -> Path:
    """The interpreter of a cached venv holding exactly `pins` (+ `no_deps` without their deps).

    `name` only makes the directory readable (`transformers-4.57.1-<key>`); the key is
    the pins. Pins are pip requirement strings, e.g. "transformers==4.57.1".
    """
    if not pins and not no_deps:
        raise ValueError("isolated_python: give at least one requirement")
    root = envs_root()
    root.mkdir(parents=True, exist_ok=True)
    key = env_key(pins, no_deps)
    env_dir = root / f"{name}-{key}"
    python = env_dir / "bin" / "python"
    ready = env_dir / "ready.json"
    with open(root / f"{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if ready.is_file() and python.exists():
            return python
        if env_dir.exists():  # a build that died half-way
            shutil.rmtree(env_dir)
        _uv_run(["venv", "--quiet", "--python", sys.executable, str(env_dir)], f"uv venv {env_dir}")
        _uv_run(
            ["pip", "install", "--quiet", "--python", str(python), *pins],
            f"uv pip install {' '.join(pins)}",
        )
        if no_deps:
            _uv_run(
                ["pip", "install", "--quiet", "--no-deps", "--python", str(python), *no_deps],
                f"uv pip install --no-deps {' '.join(no_deps)}",
            )
        ready.write_text(json.dumps({"pins": list(pins), "no_deps": list(no_deps)}, indent=1))
    return python


def run_json(python: Path, script: str, *args: str, timeout: float = 600) -> object:
    """Run `script` (source text) with `python`; it must print one JSON document last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    )
    proc = subprocess.run(
        [str(python), "-I", "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{python} reader failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{python} reader printed nothing; stderr:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])
