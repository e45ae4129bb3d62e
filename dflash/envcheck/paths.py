"""File locations shared by the doctor, the trainer and the image build.

An image bakes two files under `<sys.prefix>/share/dflash/` of its environment:
the lock it was built from and the manifest written by `dflash env manifest`.
"""

from __future__ import annotations

import os
from pathlib import Path

# Relative to the environment's sys.prefix (the venv directory in an image).
IMAGE_DATA_DIR = Path("share") / "dflash"
BAKED_LOCK_NAME = "uv.lock"
MANIFEST_NAME = "manifest.json"

# Environment variables read by dflash.envcheck.
DFLASH_LOCK_ENV = "DFLASH_LOCK"  # explicit lock path (after --lock)
COMPILE_CACHE_ROOT_ENV = "DFLASH_COMPILE_CACHE_ROOT"  # root of fingerprint-keyed caches


def baked_lock_path(prefix: str | os.PathLike[str]) -> Path:
    """Where the image build copies uv.lock: `<prefix>/share/dflash/uv.lock`."""
    return Path(prefix) / IMAGE_DATA_DIR / BAKED_LOCK_NAME


def manifest_path(prefix: str | os.PathLike[str]) -> Path:
    """Where the image build writes the manifest: `<prefix>/share/dflash/manifest.json`."""
    return Path(prefix) / IMAGE_DATA_DIR / MANIFEST_NAME


def default_compile_cache_root() -> Path:
    """`$DFLASH_COMPILE_CACHE_ROOT`, else `$XDG_CACHE_HOME/dflash/compile`,
    else `~/.cache/dflash/compile`."""
    if os.environ.get(COMPILE_CACHE_ROOT_ENV):
        return Path(os.environ[COMPILE_CACHE_ROOT_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dflash" / "compile"


def verify_baseline_path(prefix: str | os.PathLike[str]) -> Path:
    """Where `dflash doctor --verify` keeps the (size, mtime) of every file it hashed,
    for the quick check of later runs: beside the compile caches, one file per
    environment (keyed by its real path, so two venvs never share one)."""
    import hashlib

    key = hashlib.sha256(os.path.realpath(prefix).encode()).hexdigest()[:16]
    return default_compile_cache_root().parent / "verify" / f"{key}.json"


def sample_cache_path(python: str | os.PathLike[str]) -> Path:
    """Where the static probe keeps its libraries' sampled hashes between runs, one
    file per interpreter path as given (a venv's bin/python, unresolved: every venv
    of one base interpreter gets its own)."""
    import hashlib

    key = hashlib.sha256(os.path.abspath(python).encode()).hexdigest()[:16]
    return default_compile_cache_root().parent / "samples" / f"{key}.json"
