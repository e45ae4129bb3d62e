"""Check 3: file collisions between distributions, holes, library-less CUDA wheels."""

from __future__ import annotations

import os

from .checks_cuda import SHARED_FILES_WHY
from .context import Context
from .cuda import HEADER_ONLY
from .findings import Finding
from .lockfile import ROOT_NAME

SAMPLE = 10  # paths listed per finding; the count says how many in all


def _is_lib(path: str) -> bool:
    base = path.rsplit("/", 1)[-1]
    return base.endswith(".so") or ".so." in base


def check_files(ctx: Context) -> list[Finding]:
    return _collisions(ctx) + _shadowed_editable(ctx) + _holes(ctx) + _library_less(ctx)


def _collisions(ctx: Context) -> list[Finding]:
    # One finding per set of distributions, not per file: cuDNN alone collides on ~30.
    groups: dict[tuple[str, ...], list[dict]] = {}
    for c in ctx.static["collisions"]:
        key = tuple(sorted({f"{x['name']} {x['version']}" for x in c["claimants"]}))
        groups.setdefault(key, []).append(c)
    findings = []
    for claimants, files in sorted(groups.items()):
        files.sort(key=lambda c: (not _is_lib(c["path"]), c["path"]))
        paths = [ctx.rel(c["path"]) for c in files]
        owners = sorted({c["content_owner"] or "none of them (modified)" for c in files})
        findings.append(
            Finding(
                "error",
                "FILE_COLLISION",
                f"{' and '.join(claimants)} install {len(files)} same-named files with "
                f"different contents, e.g. {paths[0]}; the copies on disk are from "
                f"{', '.join(owners)}",
                ctx.fix.recreate(SHARED_FILES_WHY),
                {
                    "claimants": list(claimants),
                    "count": len(files),
                    "files": paths[:SAMPLE],
                    "libraries": {
                        ctx.rel(c["path"]): c["content_owner"] for c in files if _is_lib(c["path"])
                    },
                },
            )
        )
    return findings


def _record_owner(ctx: Context, rel: str) -> dict | None:
    """The distribution whose RECORD lists site-relative path `rel`."""
    for d in ctx.dists:
        try:
            with open(os.path.join(d["dist_info"], "RECORD"), encoding="utf-8") as fh:
                if any(line.split(",", 1)[0] == rel for line in fh):
                    return d
        except OSError:
            continue
    return None


def _shadowed_editable(ctx: Context) -> list[Finding]:
    # An editable project lists no dflash/ files in its RECORD, so another distribution
    # installing a dflash/ package (z-lab's PyPI `dflash`) collides on no recorded file;
    # it wins the import anyway, site-packages coming before the editable path.
    origin = ctx.static["interpreter"].get("dflash_origin")
    ours = [d for d in ctx.by_name.get(ROOT_NAME, []) if d.get("editable")]
    if not origin or not ours:
        return []
    real = os.path.realpath(origin)
    site = next((s for s in ctx.site_dirs if real.startswith(os.path.realpath(s) + os.sep)), None)
    if site is None:
        return []
    rel = os.path.relpath(real, os.path.realpath(site)).replace(os.sep, "/")
    other = _record_owner(ctx, rel)
    who = f"{other['name']} {other['version']}" if other else "no distribution's RECORD"
    mine = f"{ours[0]['name']} {ours[0]['version']}"
    return [
        Finding(
            "error",
            "FILE_COLLISION",
            f"{who} and {mine} (editable) both provide the import package dflash/: "
            f"`import dflash` loads {ctx.rel(real)}, so {mine}'s code and `dflash` command "
            "do not run",
            ctx.fix.recreate("the other distribution's dflash/ files replace the project's import"),
            {
                "claimants": sorted([who, mine]),
                "count": 1,
                "files": [ctx.rel(real)],
                "libraries": {},
            },
        )
    ]


def _holes(ctx: Context) -> list[Finding]:
    findings = []
    for d in ctx.dists:
        missing = d["missing"]
        if not missing:
            continue
        libs = [m for m in missing if _is_lib(m)]
        shown = (libs + [m for m in missing if not _is_lib(m)])[:SAMPLE]
        findings.append(
            Finding(
                "error",
                "FILE_MISSING",
                f"{len(missing)} of {d['n_files']} files of {d['name']} {d['version']} are "
                f"missing on disk, e.g. {shown[0]}",
                ctx.fix.recreate(
                    "reinstalling on top of the broken env is skipped by uv, which sees the "
                    "distribution as installed"
                ),
                {
                    "package": d["canonical"],
                    "version": d["version"],
                    "count": len(missing),
                    "libraries": libs[:SAMPLE],
                    "files": shown,
                },
            )
        )
    return findings


def _library_less(ctx: Context) -> list[Finding]:
    findings = []
    for name in sorted(ctx.torch_needs):
        if not name.startswith("nvidia-") or name in HEADER_ONLY:
            continue
        for d in ctx.by_name.get(name, []):
            if d["libs"] or any(_is_lib(m) for m in d["missing"]):
                continue  # has libraries, or the holes check already reports them
            findings.append(
                Finding(
                    "error",
                    "NO_LIBRARY",
                    f"{d['name']} {d['version']} is a CUDA library torch needs, but the "
                    f"installed distribution ships no shared library ({d['n_files']} files): "
                    "a placeholder or metapackage was installed where the library was expected",
                    ctx.fix.recreate(),
                    {"package": name, "version": d["version"], "files": d["n_files"]},
                )
            )
    return findings
