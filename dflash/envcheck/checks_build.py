"""Build identity (the locked wheel, not just the locked version) and ABI pairs.

Two builds of one version differ in what the installed metadata keeps of the
wheel: the local version tag (torch 2.10.0+cu126 against the lock's 2.10.0), the
WHEEL file's tags and build number (a cp311-linux_x86_64 build from the sdist
against the lock's manylinux wheel), and, where the installer recorded it in
direct_url.json, the archive's hash. uv.lock stores each wheel's URL (whose file
name carries version, build and tags) and sha256, so all three are compared.

ABI pairs come from the packages' own metadata: torchvision 0.24.0 declares
`Requires-Dist: torch==2.9.0`, torch declares its triton; an installed pin that
the installed torch or triton does not satisfy is a build made for another one.
"""

from __future__ import annotations

import re
import sys
from functools import cache
from typing import Any
from urllib.parse import unquote, urlparse

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, parse_tag, sys_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .checks_lock import same_version
from .context import Context
from .findings import Finding
from .lockfile import ROOT_NAME, LockPackage

# What compiled extensions bind to: a pin on one of these that the installed
# version does not meet is a binary built against another release.
ABI_TARGETS = frozenset({"torch", "triton", "pytorch-triton"})
_MAY_NAME_TARGET = re.compile(r"^\s*(torch|triton|pytorch[-_.]triton)\b", re.IGNORECASE)


def check_build(ctx: Context) -> list[Finding]:
    return _identity(ctx) + _abi_pairs(ctx)


def _wheel_of(url: str) -> tuple[str, Version, tuple, frozenset[Tag]] | None:
    filename = unquote(urlparse(url).path.rsplit("/", 1)[-1])
    try:
        name, version, build, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    return filename, version, build, tags


@cache
def _supported_tags() -> frozenset[Tag]:
    return frozenset(sys_tags())


def _compatible(ctx: Context, wheels: list) -> list:
    """The lock's wheels this interpreter can install; all of them when the audited
    interpreter is not this one (its tags cannot be computed from here)."""
    interp = ctx.static["interpreter"]
    here = default_environment()
    if (
        interp["marker_environment"].get("python_full_version") != here["python_full_version"]
        or interp.get("platform") != sys.platform
    ):
        return wheels
    supported = _supported_tags()
    return [w for w in wheels if w[3] & supported]


def _installed_tags(d: dict[str, Any]) -> frozenset[Tag]:
    tags: set[Tag] = set()
    for text in d.get("wheel_tags", []):
        try:
            tags |= parse_tag(text)
        except ValueError:
            continue
    return frozenset(tags)


def _build_tuple(build: str | None) -> tuple:
    if not build:
        return ()
    digits = "".join(c for c in build if c.isdigit())
    return (int(digits), build[len(digits) :]) if digits and build.startswith(digits) else ()


def _identity(ctx: Context) -> list[Finding]:
    res = ctx.resolution
    if res is None:
        return []
    findings = []
    for name, ds in sorted(ctx.by_name.items()):
        pkg: LockPackage | None = res.required.get(name) or res.dev.get(name)
        d = ds[0]
        if pkg is None or name == ROOT_NAME or d.get("editable"):
            continue  # unlocked, the project itself, or editable (reported elsewhere)
        if not same_version(d["version"], pkg.version):
            continue  # VERSION_MISMATCH already says it
        problem = _mismatch(ctx, d, pkg)
        if problem is None:
            continue
        what, expected = problem
        findings.append(
            Finding(
                "error",
                "BUILD_MISMATCH",
                f"{d['name']} {d['version']} is another build than the lock's: {what}; the "
                f"lock's wheel is {expected}",
                ctx.fix.recreate(
                    "uv sees the version as installed and would not replace the build"
                ),
                {"package": name, "installed": d["version"], "what": what, "locked": expected},
            )
        )
    return findings


def _mismatch(ctx: Context, d: dict[str, Any], pkg: LockPackage) -> tuple[str, str] | None:
    wheels = [w for w in (_wheel_of(x.get("url", "")) for x in pkg.wheels) if w]
    locked_hashes = {
        str(a.get("hash", "")).partition(":")[2] for a in (*pkg.wheels, pkg.sdist or {})
    } - {""}
    recorded = d.get("archive_hashes", {}).get("sha256")
    if recorded and locked_hashes and recorded not in locked_hashes:
        shown = wheels[0][0] if wheels else pkg.version
        return f"its archive's sha256 {recorded[:16]}… is none of the lock's", shown
    if not wheels:
        return None  # the lock has only an sdist: a local build is what it asks for
    candidates = _compatible(ctx, wheels)
    if not candidates:
        return None  # no locked wheel fits this interpreter: built from the locked sdist
    try:
        version = Version(d["version"])
    except InvalidVersion:
        return None
    shown = candidates[0][0]
    same_version_wheels = [w for w in candidates if w[1] == version]
    if not same_version_wheels:
        local = f"+{version.local}" if version.local else "no local version tag"
        locked = sorted({str(w[1]) for w in candidates})
        return f"version {version} ({local}) where the lock's wheels are {', '.join(locked)}", shown
    tags = _installed_tags(d)
    if not tags:
        return "it has no WHEEL tags (not installed from a wheel)", same_version_wheels[0][0]
    build = _build_tuple(d.get("wheel_build"))
    for _filename, _v, wbuild, wtags in same_version_wheels:
        if wtags & tags and (wbuild == build or not wbuild and not build):
            return None
    shown_tags = ", ".join(sorted(d.get("wheel_tags", [])))
    build_txt = f", build {d['wheel_build']}" if d.get("wheel_build") else ""
    return f"wheel tag {shown_tags}{build_txt}", same_version_wheels[0][0]


def _abi_pairs(ctx: Context) -> list[Finding]:
    env = {**ctx.static["interpreter"]["marker_environment"], "extra": ""}
    res = ctx.resolution
    findings = []
    for name, ds in sorted(ctx.by_name.items()):
        d = ds[0]
        for text in d.get("requires", []):
            if not _MAY_NAME_TARGET.match(text):
                continue  # parsing every requirement of every distribution costs 50 ms
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            target = canonicalize_name(req.name)
            if target not in ABI_TARGETS or target not in ctx.by_name:
                continue
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            have = ctx.by_name[target][0]["version"]
            if req.specifier.contains(have, prereleases=True):
                continue
            locked = (res.required.get(name) or res.dev.get(name)) if res else None
            match = (
                f"the lock pins {name} {locked.version}"
                if locked
                else f"install a {name} release whose metadata requires {target}=={have}"
                if name != "torch"
                else f"the {target} that torch {d['version']} requires"
            )
            findings.append(
                Finding(
                    "error",
                    "ABI_PAIR_MISMATCH",
                    f"{d['name']} {d['version']} is built for {target}{req.specifier} but "
                    f"{target} {have} is installed; {match}",
                    ctx.fix.recreate(
                        f"a binary built against another {target} fails to load or "
                        "crashes at run time"
                    ),
                    {
                        "package": name,
                        "version": d["version"],
                        "requires": f"{target}{req.specifier}",
                        "installed": have,
                        "locked": locked.version if locked else None,
                    },
                )
            )
    return findings
