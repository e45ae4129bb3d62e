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
"""

from .caches import configure_compile_caches
from .doctor import Report, environment_manifest, run_doctor
from .findings import CODES, Finding
from .fingerprint import diff_manifests, environment_fingerprint
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
