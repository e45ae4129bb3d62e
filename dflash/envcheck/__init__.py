"""Environment integrity for dflash: doctor, fingerprint, manifest, compile caches.

Public API (nothing here imports torch):
  preflight(allow_dirty, log=print) -> dict      trainer/bench gate; raises DirtyEnvironment
  run_doctor(python=None, ...) -> Report         the full audit (`dflash doctor`)
  configure_compile_caches(root=None) -> dict    fingerprint-keyed inductor/Triton caches
  environment_fingerprint(python=None) -> str    `dflash env fingerprint`
  environment_manifest(python=None) -> dict      `dflash env manifest`
  diff_manifests(a, b) -> dict                   what changed between two manifests
File locations: baked_lock_path(prefix), manifest_path(prefix), IMAGE_DATA_DIR.

`preflight` is both a function and the module defining it: the import below
loads the module first and then binds the function over it, so
`from dflash.envcheck import preflight` and
`from dflash.envcheck.preflight import preflight` both give the function.

The rest is imported on first use (PEP 562): every `dflash doctor` and `dflash
env` run imports this package first, and its probes should be running before the
doctor's own modules (packaging, tomllib, the checks) are imported.
"""

import importlib
from typing import Any

from .findings import CODES, Finding
from .paths import (
    BAKED_LOCK_NAME,
    COMPILE_CACHE_ROOT_ENV,
    DFLASH_LOCK_ENV,
    IMAGE_DATA_DIR,
    MANIFEST_NAME,
    baked_lock_path,
    default_compile_cache_root,
    manifest_path,
)
from .preflight import DirtyEnvironment, preflight

_LAZY = {
    "configure_compile_caches": "caches",
    "Report": "doctor",
    "environment_manifest": "doctor",
    "run_doctor": "doctor",
    "diff_manifests": "manifest_diff",
    "environment_fingerprint": "fingerprint",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "BAKED_LOCK_NAME",
    "CODES",
    "COMPILE_CACHE_ROOT_ENV",
    "DFLASH_LOCK_ENV",
    "IMAGE_DATA_DIR",
    "MANIFEST_NAME",
    "DirtyEnvironment",
    "Finding",
    "Report",
    "baked_lock_path",
    "configure_compile_caches",
    "default_compile_cache_root",
    "diff_manifests",
    "environment_fingerprint",
    "environment_manifest",
    "manifest_path",
    "preflight",
    "run_doctor",
]
