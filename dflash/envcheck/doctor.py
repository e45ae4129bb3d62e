"""The doctor: probe an interpreter, locate lock and manifest, run every check."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .caches import check_caches
from .checks_build import check_build
from .checks_cuda import check_cuda, check_gpu
from .checks_env import check_manifest, check_variables
from .checks_files import check_files
from .checks_integrity import check_integrity
from .checks_libs import check_libs
from .checks_lock import check_lock
from .checks_startup import check_startup
from .collect import ProbeData, ProbeError, Probes, collect
from .context import Context
from .findings import Finding, FixContext, has_errors, sort_findings
from .fingerprint import build_manifest, components_from_probe, fingerprint
from .lockfile import Lock, LockError, detect_extra, find_lock, load_lock, resolve
from .paths import default_compile_cache_root, manifest_path
from .settings import DEVICES
from .site_files import manifest_extras

CHECKS: tuple[Callable[[Context], list[Finding]], ...] = (
    check_manifest,
    check_cuda,
    check_lock,
    check_files,
    check_integrity,
    check_build,
    check_startup,
    check_libs,
    check_caches,
    check_gpu,
    check_variables,
)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # checkout containing dflash/


@dataclass
class Report:
    python: str
    findings: list[Finding]
    prefix: str = ""
    lock: str | None = None
    extra: str | None = None
    fingerprint: str = ""
    duration_s: float = 0.0
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Clean means no errors; warnings and info do not fail the run."""
        return not has_errors(self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def counts(self) -> dict[str, int]:
        out = {"error": 0, "warning": 0, "info": 0}
        for f in self.findings:
            out[f.severity] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "python": self.python,
            "prefix": self.prefix,
            "lock": self.lock,
            "extra": self.extra,
            "fingerprint": self.fingerprint,
            "duration_s": round(self.duration_s, 3),
            "notes": self.notes,
            "counts": self.counts(),
            "findings": [f.to_dict() for f in self.findings],
        }


def _start_dirs(static: dict[str, Any]) -> list[str]:
    dirs = [os.getcwd()]
    origin = static["interpreter"].get("dflash_origin")
    if origin:
        dirs.append(str(Path(origin).parent.parent))
    dirs.append(str(PACKAGE_ROOT))
    return dirs


def _load_manifest(prefix: str) -> tuple[dict[str, Any] | None, str | None]:
    path = manifest_path(prefix)
    if not path.exists():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"image manifest {path} is unreadable: {exc}"
    if not isinstance(data, dict) or "fingerprint" not in data:
        return None, f"image manifest {path} has no fingerprint"
    return data, None


def choose_extra(
    lock: Lock, installed: dict[str, str], explicit: str | None, manifest: dict | None
) -> tuple[str | None, str]:
    if explicit:
        if explicit not in lock.extras:
            return None, f"--extra {explicit} is not one of {lock.extras}"
        return explicit, "--extra"
    if manifest and manifest.get("extra") in lock.extras:
        return manifest["extra"], "from the image manifest"
    found = detect_extra(lock, installed)
    if found:
        return found, f"matches installed torch {installed.get('torch')}"
    if not lock.extras:
        return None, "the lock has no extras"
    return None, f"installed torch {installed.get('torch', 'missing')} matches no extra"


def prepare(
    probe: ProbeData,
    lock_path: str | None = None,
    extra: str | None = None,
    cache_root: str | os.PathLike[str] | None = None,
    device: str = "auto",
    verify: bool = False,
) -> Context:
    static = probe.static
    interp = static["interpreter"]
    manifest, manifest_error = _load_manifest(interp["prefix"])
    ctx = Context(
        probe=probe,
        fix=FixContext(
            prefix=interp["prefix"],
            is_venv=interp["prefix"] != interp["base_prefix"],
            in_image=manifest is not None,
        ),
        manifest=manifest,
        manifest_error=manifest_error,
        cache_root=Path(cache_root) if cache_root else default_compile_cache_root(),
        device=device,
        verify=verify,
    )
    path, ctx.lock_note = find_lock(lock_path, interp["prefix"], _start_dirs(static))
    if path is not None:
        try:
            ctx.lock = load_lock(path)
            chosen, ctx.extra_note = choose_extra(ctx.lock, ctx.installed, extra, manifest)
            env = interp["marker_environment"]
            if chosen or not ctx.lock.extras:
                ctx.extra = chosen
                ctx.resolution = resolve(ctx.lock, chosen, env)
            ctx.other_resolutions = {
                e: resolve(ctx.lock, e, env) for e in ctx.lock.extras if e != chosen
            }
        except LockError as exc:
            ctx.lock, ctx.resolution, ctx.lock_error = None, None, str(exc)
        if ctx.lock and (ctx.lock.path.parent / "pyproject.toml").is_file():
            ctx.fix.project_dir = str(ctx.lock.path.parent.absolute())
    ctx.fix.extra = ctx.extra
    ctx.components = components_from_probe(static)
    ctx.fingerprint = fingerprint(ctx.components)
    return ctx


def run_checks(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    for check in CHECKS:
        try:
            findings.extend(check(ctx))
        except Exception:  # noqa: BLE001 - one broken check must not hide the others
            findings.append(
                Finding(
                    "error",
                    "CHECK_CRASHED",
                    f"{check.__name__} crashed: {traceback.format_exc(limit=4)}",
                )
            )
    return sort_findings(findings)


def run_doctor(
    python: str | None = None,
    lock: str | None = None,
    extra: str | None = None,
    import_torch: bool = True,
    cache_root: str | os.PathLike[str] | None = None,
    device: str = "auto",
    verify: bool = False,
    probes: Probes | None = None,
) -> Report:
    """Audit `python`'s environment (default: this interpreter). Never raises for
    a broken environment: every problem is a finding. `device` is what the run is
    meant to use (auto, cpu, cuda): hiding every GPU is an error only for cuda.
    `verify` hashes every installed file against RECORD (seconds to a minute).
    `probes`: the same interpreter's probes, already started by the caller
    (`collect.start_probes(python, import_torch)`), to be gathered here."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not one of {DEVICES}")
    start = time.perf_counter()
    try:
        probe = probes.finish() if probes else collect(python, import_torch=import_torch)
    except ProbeError as exc:
        finding = Finding(
            "error",
            "PROBE_FAILED",
            str(exc),
            "check that the path is a Python 3 interpreter (a venv's bin/python)",
        )
        shown = str(python) if python else sys.executable
        return Report(shown, [finding], duration_s=time.perf_counter() - start)
    ctx = prepare(probe, lock, extra, cache_root, device=device, verify=verify)
    return Report(
        python=probe.python,
        findings=run_checks(ctx),
        prefix=ctx.fix.prefix,
        lock=str(ctx.lock.path) if ctx.lock else None,
        extra=ctx.extra,
        fingerprint=ctx.fingerprint,
        duration_s=time.perf_counter() - start,
        notes={"lock": ctx.lock_note, "extra": ctx.extra_note},
    )


def environment_manifest(
    python: str | None = None, lock: str | None = None, extra: str | None = None
) -> dict[str, Any]:
    """The manifest `dflash env manifest` writes (what an image build bakes)."""
    from .collect import collect_static

    static = collect_static(python)
    probe = ProbeData(python=static["interpreter"]["executable"], static=static, gpu={}, torch=None)
    ctx = prepare(probe, lock, extra)
    manifest = build_manifest(static, ctx.extra)
    manifest["lock"] = str(ctx.lock.path) if ctx.lock else None
    manifest.update(manifest_extras(static))  # sonames, owners, unrecorded files (image diff)
    return manifest
