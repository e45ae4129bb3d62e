"""Check 5 and the trainer's hook: compile caches keyed by the environment.

Inductor and Triton key their caches by their own inputs, not by the cuDNN,
NCCL or CUDA runtime builds a kernel was tuned and compiled against, so a cache
outlives the environment that filled it. dflash puts them under
`<root>/<fingerprint>/{inductor,triton}`: a new environment gets new caches.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from .context import Context
from .findings import Finding
from .paths import default_compile_cache_root

CACHE_VARS: dict[str, str] = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
_FINGERPRINT_DIR = re.compile(r"^[0-9a-f]{64}$")
_MAX_FILES = 200_000  # stop sizing a cache after this many files


def configure_compile_caches(
    root: str | os.PathLike[str] | None = None, *, fingerprint: str | None = None
) -> dict[str, Any]:
    """Point TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR at
    `<root>/<fingerprint>/{inductor,triton}` unless the user set them.

    Call before torch compiles anything. `root` defaults to
    `$DFLASH_COMPILE_CACHE_ROOT` or `~/.cache/dflash/compile`; `fingerprint`
    defaults to this interpreter's (pass preflight()'s to save ~1 s).
    Returns {"fingerprint", "root", "dir", "variables": {var: path}, "user_set": [vars]}.
    """
    if fingerprint is None:
        from .fingerprint import environment_fingerprint

        fingerprint = environment_fingerprint()
    base = Path(root) if root is not None else default_compile_cache_root()
    keyed = base / fingerprint
    result: dict[str, Any] = {
        "fingerprint": fingerprint,
        "root": str(base),
        "dir": str(keyed),
        "variables": {},
        "user_set": [],
    }
    for var, sub in CACHE_VARS.items():
        if os.environ.get(var):
            result["user_set"].append(var)
            result["variables"][var] = os.environ[var]
            continue
        path = keyed / sub
        path.mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(path)
        result["variables"][var] = str(path)
    return result


def dir_size(path: Path) -> tuple[int, bool]:
    """(bytes, complete); stops counting after _MAX_FILES files."""
    total = files = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            files += 1
            if files > _MAX_FILES:
                return total, False
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total, True


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def default_unkeyed_caches() -> list[Path]:
    """Where inductor and Triton cache when nobody sets the variables."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return [
        Path(tempfile.gettempdir()) / f"torchinductor_{user}",
        Path.home() / ".triton" / "cache",
    ]


def check_caches(ctx: Context) -> list[Finding]:
    root = ctx.cache_root or default_compile_cache_root()
    findings: list[Finding] = []
    others: list[dict[str, Any]] = []
    if root.is_dir():
        for entry in sorted(root.iterdir()):
            if (
                entry.is_dir()
                and _FINGERPRINT_DIR.match(entry.name)
                and entry.name != ctx.fingerprint
            ):
                size, complete = dir_size(entry)
                others.append({"path": str(entry), "bytes": size, "complete": complete})
    if others:
        total = sum(o["bytes"] for o in others)
        findings.append(
            Finding(
                "info",
                "COMPILE_CACHE_OTHER",
                f"{len(others)} compile cache(s) of other environments under {root}, "
                f"{human_size(total)} in all: "
                + ", ".join(
                    f"{Path(o['path']).name[:12]}… {human_size(o['bytes'])}" for o in others
                ),
                "never reused by this environment; delete the ones no longer needed "
                "(`rm -rf <dir>`; caches are rebuilt on demand)",
                {"caches": others, "current": ctx.fingerprint},
            )
        )
    keyed = root / ctx.fingerprint
    variables = ctx.static.get("variables", {})
    for var, sub in CACHE_VARS.items():
        value = variables.get(var)
        # Keyed when it is <any root>/<this fingerprint>/<sub> (configure_compile_caches).
        if value and not (Path(value).name == sub and Path(value).parent.name == ctx.fingerprint):
            findings.append(
                Finding(
                    "warning",
                    "COMPILE_CACHE_UNKEYED",
                    f"{var}={value} is not keyed by this environment's fingerprint: kernels "
                    "compiled against other cuDNN/NCCL/Triton builds will be reused",
                    f"unset {var} so dflash uses {keyed / sub}",
                    {"variable": var, "path": value, "expected": str(keyed / sub)},
                )
            )
    for path in default_unkeyed_caches():
        if path.is_dir():
            size, _ = dir_size(path)
            findings.append(
                Finding(
                    "info",
                    "COMPILE_CACHE_UNKEYED",
                    f"default unkeyed cache {path} exists ({human_size(size)}); dflash runs "
                    "do not use it, other torch programs do",
                    f"`rm -rf {path}` if in doubt (rebuilt on demand)",
                    {"path": str(path), "bytes": size},
                )
            )
    return findings
