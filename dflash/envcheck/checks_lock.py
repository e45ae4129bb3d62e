"""Check 2: drift between the installed distributions and uv.lock."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from .context import Context
from .findings import Finding
from .lockfile import ROOT_NAME

# Installed by `python -m venv` / virtualenv seeding rather than by the lock.
SEED_PACKAGES = frozenset({"pip", "setuptools", "wheel"})


def same_version(installed: str, locked: str) -> bool:
    """Equal, or equal public versions where the lock pins no local tag
    (torch reports 2.10.0+cu128 in version.py, 2.10.0 in its metadata)."""
    try:
        a, b = Version(installed), Version(locked)
    except InvalidVersion:
        return installed == locked
    return a == b or (not b.local and a.public == b.public)


def check_lock(ctx: Context) -> list[Finding]:
    if ctx.lock_error:
        return [
            Finding(
                "error",
                "LOCK_INVALID",
                ctx.lock_error,
                "point the doctor at the project's uv.lock with --lock or $DFLASH_LOCK",
            )
        ]
    if ctx.lock is None:
        return [
            Finding(
                "warning",
                "LOCK_NOT_FOUND",
                "no uv.lock found (--lock, $DFLASH_LOCK, project root, baked image copy); "
                "lock drift and library ownership checks skipped",
                "run from the dflash checkout or pass --lock PATH",
            )
        ]
    if ctx.resolution is None:
        return [
            Finding(
                "error",
                "EXTRA_UNKNOWN",
                f"cannot tell which extra of {ctx.lock.extras} this environment was synced "
                f"with ({ctx.extra_note})",
                "pass --extra NAME, or " + ctx.fix.recreate(),
            )
        ]
    res = ctx.resolution
    findings = [
        Finding(
            "info",
            "LOCK_USED",
            f"{ctx.lock.path} ({ctx.lock_note}), extra {ctx.extra} ({ctx.extra_note})",
            details={"lock": str(ctx.lock.path), "extra": ctx.extra},
        )
    ]
    for name, ds in sorted(ctx.by_name.items()):
        if name == ROOT_NAME:
            continue  # the project itself, editable or not
        if len(ds) > 1:
            findings.append(
                Finding(
                    "error",
                    "DUPLICATE_DISTRIBUTION",
                    f"{name} is installed {len(ds)} times: "
                    + ", ".join(f"{d['version']} ({d['dist_info']})" for d in ds),
                    ctx.fix.recreate(),
                    {"package": name, "versions": [d["version"] for d in ds]},
                )
            )
        findings.extend(_one(ctx, name, ds[0]["version"]))
    for name, pkg in sorted(res.required.items()):
        if name != ROOT_NAME and name not in ctx.by_name:
            findings.append(
                Finding(
                    "error",
                    "MISSING_PACKAGE",
                    f"{name} {pkg.version} is locked for extra {ctx.extra} but not installed",
                    ctx.fix.recreate(),
                    {"package": name, "locked": pkg.version},
                )
            )
    return findings


def _one(ctx: Context, name: str, version: str) -> list[Finding]:
    res = ctx.resolution
    assert res is not None
    if name in res.required or name in res.dev:
        dev = name not in res.required
        locked = (res.dev if dev else res.required)[name].version
        if same_version(version, locked):
            return []
        return [
            Finding(
                "warning" if dev else "error",
                "DEV_VERSION_MISMATCH" if dev else "VERSION_MISMATCH",
                f"{name} {version} is installed but the lock pins {locked}"
                + (" (dev group)" if dev else ""),
                ctx.fix.recreate(),
                {"package": name, "installed": version, "locked": locked},
            )
        ]
    if name in SEED_PACKAGES:
        return [
            Finding(
                "info",
                "SEED_PACKAGE",
                f"{name} {version} is not locked (installer seed package)",
                details={"package": name, "installed": version},
            )
        ]
    elsewhere = sorted(e for e, r in ctx.other_resolutions.items() if name in r.required)
    where = (
        f"; the lock has it only for extra {', '.join(elsewhere)}"
        if elsewhere
        else "; it is not in the lock at all"
        if name not in ctx.lock.by_name  # type: ignore[union-attr]
        else "; the lock has it only for other platforms or groups"
    )
    return [
        Finding(
            "error",
            "UNLOCKED_PACKAGE",
            f"{name} {version} is installed but not locked for extra {ctx.extra}{where}",
            ctx.fix.recreate(
                "packages installed beside the lock (sglang, flashinfer, flash-attn...) "
                "pull in wheels of another CUDA major silently"
            ),
            {"package": name, "installed": version, "locked_for_extras": elsewhere},
        )
    ]
