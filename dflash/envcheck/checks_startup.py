"""Code that runs before `main`, and modules imported from somewhere else than their
locked distribution (facts from probe_startup.py, the user's path as site builds it).

A start-up hook is a `.pth` line starting with `import` (site executes it in
every interpreter: it can import torch, start threads or patch modules before the
program runs) or a sitecustomize/usercustomize module on the path. Shipped by a
locked distribution (cuda-bindings' `_cuda_bindings_redirector.pth`, setuptools'
`distutils-precedence.pth`) it is part of the locked environment: info. Anything
else is an error.
"""

from __future__ import annotations

import os
from typing import Any

from .checks_lock import SEED_PACKAGES
from .context import Context
from .findings import Finding
from .lockfile import ROOT_NAME, canonical


def check_startup(ctx: Context) -> list[Finding]:
    data = ctx.probe.startup
    if not data:
        return []
    if data.get("error"):
        return [
            Finding(
                "warning",
                "STARTUP_PROBE_FAILED",
                f"start-up hooks and import shadowing were not checked: {data['error']}",
                "report this as a dflash bug, with the interpreter's version",
            )
        ]
    return _hooks(ctx, data) + _shadowing(ctx, data) + _editable(ctx)


def _locked(ctx: Context) -> set[str]:
    if ctx.resolution is None:
        return set()
    return set(ctx.resolution.required) | set(ctx.resolution.dev) | {ROOT_NAME}


def _hooks(ctx: Context, data: dict[str, Any]) -> list[Finding]:
    locked = _locked(ctx) | SEED_PACKAGES
    stdlib = {e["path"] for e in data.get("path", []) if e["cause"] == "the standard library"}
    findings = []
    for hook in data.get("hooks", []):
        owner = hook.get("owner")
        where = hook["file"] + (f" line {hook['line']}" if hook.get("line") else "")
        what = (
            f"runs `{hook['code']}` at every interpreter start-up"
            if hook["kind"] == "pth"
            else f"is imported as {hook['kind']} at every interpreter start-up"
        )
        in_stdlib = os.path.dirname(hook["file"]) in stdlib
        # virtualenv writes _virtualenv.pth (import _virtualenv) into every venv it makes
        creator = data.get("pyvenv_cfg", {}).get("virtualenv")
        by_creator = bool(creator) and os.path.basename(hook["file"]) == "_virtualenv.pth"
        owned = owner is not None and canonical(owner) in locked
        who = (
            f"owned by {owner}" + (", locked" if owned else "")
            if owner
            else "part of the Python installation"
            if in_stdlib
            else f"written by virtualenv {creator}, which created the venv"
            if by_creator
            else "unowned (no installed distribution lists it)"
        )
        details = {"file": hook["file"], "line": hook.get("line"), "kind": hook["kind"]}
        details |= {"owner": owner, "code": hook.get("code", "")}
        if owned or in_stdlib or by_creator:
            findings.append(
                Finding("info", "STARTUP_HOOK", f"{where} {what} ({who})", details=details)
            )
            continue
        fix = (
            f"delete {hook['file']}: no distribution installed it, so nothing else removes it"
            if owner is None
            else ctx.fix.recreate(f"{owner} is not locked, and its hook runs in every process")
        )
        findings.append(
            Finding(
                "error",
                "STARTUP_HOOK",
                f"{where} {what}: {who}; it can import modules, start threads or patch "
                "code before the program runs",
                fix,
                details,
            )
        )
    return findings


def _cause_fix(entry: dict[str, str] | None, ctx: Context) -> tuple[str, str]:
    if entry is None:
        return "an editable finder or a built-in module", ctx.fix.recreate()
    cause = entry["cause"]
    if cause == "PYTHONPATH":
        return cause, f"remove {entry['path']} from PYTHONPATH for training runs"
    if cause.startswith("the user site"):
        return cause, (
            f"set PYTHONNOUSERSITE=1 (or remove the copy from {entry['path']}); "
            "a venv created without --system-site-packages ignores the user site"
        )
    if cause.startswith(".pth file"):
        return cause, f"delete the {cause[4:]} that adds {entry['path']}, or " + (
            ctx.fix.recreate()
        )
    if cause.startswith("the system site"):
        return cause, "recreate the venv without --system-site-packages: " + ctx.fix.recreate()
    return cause, ctx.fix.recreate()


def _shadowing(ctx: Context, data: dict[str, Any]) -> list[Finding]:
    locked = _locked(ctx)
    entries = {e["path"].rstrip(os.sep): e for e in data.get("path", [])}
    findings = []
    for d in data.get("distributions", []):
        if d["canonical"] not in locked or d["canonical"] == ROOT_NAME:
            continue
        home = d["site_dir"].rstrip(os.sep)
        for mod, found in sorted(d["modules"].items()):
            if found.get("namespace") and home in {
                os.path.dirname(p.rstrip(os.sep)) for p in found.get("locations", [])
            }:
                continue
            entry_path = found.get("entry")
            if entry_path == home or (found.get("origin") is None and not found.get("namespace")):
                continue  # the locked copy wins (or nothing is importable: FILE_MISSING)
            entry = entries.get(entry_path) if entry_path else None
            cause, fix = _cause_fix(entry, ctx)
            origin = found.get("origin") or ", ".join(found.get("locations", []))
            findings.append(
                Finding(
                    "error",
                    "MODULE_SHADOWED",
                    f"`import {mod}` loads {origin} (put on the path by {cause}), not the "
                    f"{d['name']} {d['version']} the lock installed in {home}",
                    fix,
                    {
                        "module": mod,
                        "package": d["canonical"],
                        "loaded": origin,
                        "expected_dir": home,
                        "entry": entry_path,
                        "cause": cause,
                    },
                )
            )
    return findings


def _editable(ctx: Context) -> list[Finding]:
    """PEP 660 editables say so in direct_url.json; `setup.py develop` leaves an
    .egg-link and a path line in easy-install.pth, so its metadata lies in the
    checkout, outside every site dir."""
    locked = _locked(ctx)
    sites = {os.path.normpath(s) for s in ctx.site_dirs}
    findings = []
    for d in ctx.dists:
        elsewhere = os.path.normpath(d["site_dir"]) not in sites and str(
            d.get("dist_info", "")
        ).endswith(".egg-info")
        if d["canonical"] == ROOT_NAME or d["canonical"] not in locked:
            continue
        if not (d.get("editable") or elsewhere):
            continue
        source = str(d.get("direct_url") or "") if d.get("editable") else d["site_dir"]
        source = source[len("file://") :] if source.startswith("file://") else source
        findings.append(
            Finding(
                "warning",
                "EDITABLE_INSTALL",
                f"{d['name']} {d['version']} is an editable install from {source}: its code is "
                "whatever that directory holds now, not the locked wheel",
                ctx.fix.recreate("an editable install follows its checkout, not the lock"),
                {"package": d["canonical"], "version": d["version"], "source": source},
            )
        )
    return findings
