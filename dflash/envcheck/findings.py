"""Findings: what the doctor reports, with a stable code and the exact fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"error": 0, "warning": 1, "info": 2}

# Every code the doctor can emit, with what it means. Codes are an interface:
# tests, CI gates and run records match on them, so never rename one.
CODES: dict[str, str] = {
    # the doctor itself
    "PROBE_FAILED": "the audited interpreter could not be probed",
    "CHECK_CRASHED": "a check raised an unexpected exception (a dflash bug: please report)",
    # 1. CUDA major consistency
    "TORCH_MISSING": "torch is not installed",
    "TORCH_NOT_CUDA": "torch is a build without CUDA",
    "TORCH_INFO": "torch build (read from torch/version.py without importing torch)",
    "CUDA_MAJOR_MISMATCH": "a CUDA distribution of another CUDA major than torch's",
    # 2. lock drift
    "LOCK_NOT_FOUND": "no uv.lock found: drift checks skipped",
    "LOCK_INVALID": "uv.lock unreadable or without the dflash root package",
    "LOCK_USED": "which lock and extra the audit used",
    "EXTRA_UNKNOWN": "the active extra could not be determined",
    "UNLOCKED_PACKAGE": "installed but not locked for the active extra",
    "MISSING_PACKAGE": "locked for the active extra but not installed",
    "VERSION_MISMATCH": "installed version differs from the lock",
    "DEV_VERSION_MISMATCH": "dev-group package at another version than locked",
    "DUPLICATE_DISTRIBUTION": "two installed metadata directories for one package",
    "SEED_PACKAGE": "installer seed package (pip/setuptools/wheel) outside the lock",
    # 3. files
    "FILE_COLLISION": "two distributions claim the same file with different contents",
    "FILE_MISSING": "a file listed in a distribution's RECORD is missing on disk",
    "NO_LIBRARY": "a CUDA distribution torch needs ships no shared library",
    # 4. shared libraries
    "TORCH_IMPORT_FAILED": "import torch failed in the audited interpreter",
    "TORCH_IMPORT_SKIPPED": "runtime library checks skipped (--no-import)",
    "LIB_WRONG_OWNER": "torch mapped a library whose content belongs to an unexpected distribution",
    "LIB_OUTSIDE_ENV": "torch mapped a CUDA library from outside the environment",
    "LIB_PRELOADED": "LD_PRELOAD forces a library torch loads",
    "LIB_SHADOWED": "LD_LIBRARY_PATH holds a different copy of a library torch loads",
    "LIB_SHADOW_COPY": "LD_LIBRARY_PATH holds an identical copy of a library torch loads",
    "LIB_SYSTEM_COPY": "the system loader cache has another copy of a library torch loads",
    "LIB_VERSION_MISMATCH": "runtime cuDNN/NCCL version differs from the locked wheel",
    "CUDA_UNAVAILABLE": "a GPU is present but torch cannot use CUDA",
    # 5. compile caches
    "COMPILE_CACHE_OTHER": "compile caches of other environment fingerprints",
    "COMPILE_CACHE_UNKEYED": "a compile cache directory not keyed by the environment",
    # 6. driver and GPU
    "NO_GPU": "no GPU or GPU tooling found",
    "GPU_QUERY_FAILED": "GPU tooling present but the query failed",
    "GPU_INFO": "GPU model, driver and clocks",
    "DRIVER_TOO_OLD": "driver below the minimum for torch's CUDA major",
    "DRIVER_COMPAT_MODE": "driver older than torch's CUDA toolkit: minor-version compatibility",
    "GPU_THROTTLED": "GPU clocks held down by power or thermal limits",
    # 7. variables
    "ENV_VARS": "performance-relevant environment variables",
    "ENV_VAR_DANGEROUS": "an environment variable known to cost performance or hermeticity",
    # 8. start-up hooks and import shadowing (probe_startup.py)
    "STARTUP_PROBE_FAILED": "the start-up probe failed: hooks and shadowing unchecked",
    "STARTUP_HOOK": "a .pth import line or sitecustomize/usercustomize runs at start-up",
    "MODULE_SHADOWED": "a locked distribution's module is imported from somewhere else",
    "EDITABLE_INSTALL": "a locked distribution is installed editable from a source dir",
    # 9. installed files against RECORD hashes
    "RECORD_VERIFIED": "how many installed files were checked against RECORD, and how",
    "FILE_MODIFIED": "an installed file no longer matches its RECORD sha256",
    "RECORD_BASELINE_STALE": "too many files moved since the hash baseline: run --verify",
    # 10. build identity and ABI pairs
    "BUILD_MISMATCH": "the locked version, but another build than the lock's wheel",
    "ABI_PAIR_MISMATCH": "a package built for another torch/triton than the installed one",
    # manifest
    "MANIFEST_MATCH": "environment matches the manifest baked into the image",
    "ENV_MUTATED": "environment mutated in place since the image was built",
    "ENV_VARS_CHANGED": "environment variables differ from the image manifest",
    "MANIFEST_INVALID": "the image manifest cannot be read",
}


@dataclass
class Finding:
    severity: Severity
    code: str
    message: str
    fix: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}")
        if self.severity not in SEVERITY_ORDER:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.code, f.message))


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


@dataclass
class FixContext:
    """What the fix texts need to name the exact command for this environment."""

    extra: str | None = None
    prefix: str = ""
    is_venv: bool = True
    project_dir: str | None = None
    in_image: bool = False

    def sync(self) -> str:
        return "uv sync --frozen" + (f" --extra {self.extra}" if self.extra else "")

    def recreate(self, why: str = "") -> str:
        """The one repair: a fresh environment from the lock. Syncing the broken
        env in place is not enough: uv sees the locked wheels as installed and
        skips them, while removing the extra wheel deletes the files it shares
        with them (verified with uv 0.13: torch then fails on libnvshmem_host.so.3)."""
        if self.in_image:
            head = "rebuild the image; this container's environment was changed after the build"
        elif self.is_venv and self.prefix:
            where = f" in {self.project_dir}" if self.project_dir else " in the dflash checkout"
            head = (
                f"recreate the environment from scratch{where}: `rm -rf {self.prefix} && "
                f"UV_PROJECT_ENVIRONMENT={self.prefix} {self.sync()}` (seconds with uv's cache)"
            )
        else:
            head = f"create a fresh virtual environment from the lock with `{self.sync()}`"
        tail = "; never uninstall or delete packages by hand"
        return head + tail + (f": {why}" if why else "")
