"""Environments between GOOD and BAD: GOOD with a chosen subset of BAD's differences.

The differences are per distribution: added in BAD, removed from it, or installed at
another version or build (its RECORD hashes differ). A spliced environment is a copy
of GOOD made of hard links (seconds, no extra disk), with each chosen difference
applied from the distributions' own RECORD files: a removed distribution's files are
unlinked, an added one's files are linked in from BAD, a changed one is both. Nothing
is fetched, so a package that exists only in BAD's site-packages (a local wheel, a
hand-copied file) is reproduced exactly. Files are never written in place (a hard
link shares its inode with GOOD): every change is an unlink and a new link or file.
Console scripts are rewritten to the copy's own interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Run by each environment's own interpreter: its distributions and their RECORDs.
_LIST_SCRIPT = r"""
import hashlib, json, sys, importlib.metadata as md, sysconfig
site = sysconfig.get_paths()["purelib"]
out = {}
for d in md.distributions():
    name = (d.metadata["Name"] or "").lower().replace("_", "-")
    if not name or name in out:
        continue
    rec = d.read_text("RECORD") or ""
    out[name] = {"version": d.version, "info": str(d._path),
                 "record": hashlib.sha256(rec.encode()).hexdigest(),
                 "files": [line.rsplit(",", 2)[0] for line in rec.splitlines() if line]}
print(json.dumps({"site": site, "prefix": sys.prefix, "dists": out}))
"""


_HEADER_BYTES = 1024  # where a console script names its interpreter
VAR = "$"  # a Change whose name starts with it is a variable, not a distribution


class SpliceError(RuntimeError):
    pass


@dataclass(frozen=True)
class Change:
    name: str
    kind: str  # "added" | "removed" | "changed"
    good: str | None  # version in GOOD
    bad: str | None  # version in BAD

    def __str__(self) -> str:
        if self.kind == "added":
            return f"+ {self.name} {self.bad}"
        if self.kind == "removed":
            return f"- {self.name} {self.good}"
        return f"~ {self.name} {self.good} -> {self.bad}"


def python_of(ref: str) -> Path:
    """A venv directory or an interpreter path -> the interpreter."""
    p = Path(ref)
    if p.is_dir() and (p / "bin" / "python").exists():
        return p / "bin" / "python"
    if p.is_file() and os.access(p, os.X_OK):
        return p
    raise SpliceError(f"{ref}: not a virtual environment (no bin/python) or an interpreter")


def inventory(python: Path) -> dict:
    proc = subprocess.run(
        [str(python), "-I", "-c", _LIST_SCRIPT], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise SpliceError(f"{python}: cannot list its distributions: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def differences(good: dict, bad: dict) -> list[Change]:
    g, b = good["dists"], bad["dists"]
    out = [Change(n, "added", None, b[n]["version"]) for n in sorted(set(b) - set(g))]
    out += [Change(n, "removed", g[n]["version"], None) for n in sorted(set(g) - set(b))]
    out += [
        Change(n, "changed", g[n]["version"], b[n]["version"])
        for n in sorted(set(g) & set(b))
        if (g[n]["version"], g[n]["record"]) != (b[n]["version"], b[n]["record"])
    ]
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _fix_scripts(venv: Path, old_prefix: str) -> None:
    """Console scripts name their interpreter in their header: point them at the copy's.
    The header is a `#!` line, or, for paths longer than the kernel's 127-byte shebang
    limit, a `#!/bin/sh` trampoline that execs the interpreter (uv and pip write one), so
    the old prefix is replaced wherever it stands in the first lines."""
    old = old_prefix.encode()
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file():
            continue
        with open(script, "rb") as f:
            head = f.read(_HEADER_BYTES)
        if not head.startswith(b"#!") or old not in head:
            continue
        data = script.read_bytes()
        data = data[:_HEADER_BYTES].replace(old, str(venv).encode()) + data[_HEADER_BYTES:]
        mode = script.stat().st_mode
        script.unlink()  # a new file: the old inode is GOOD's
        script.write_bytes(data)
        os.chmod(script, mode)


def _prune(folder: Path, stop: Path) -> None:
    """Remove folders left empty (an empty .dist-info would still be a distribution)."""
    while folder != stop and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def _files(env: dict, name: str) -> list[Path]:
    site = Path(env["site"])
    # normpath, not resolve: RECORD paths may climb out of site-packages (../../bin/x),
    # and a listed symlink must stay a path inside the environment.
    return [Path(os.path.normpath(site / f)) for f in env["dists"][name]["files"]]


def splice(good: dict, bad: dict, changes: list[Change], dest: Path) -> Path:
    """GOOD's venv with `changes` applied, at `dest`; returns its interpreter."""
    good_prefix, bad_prefix = Path(good["prefix"]), Path(bad["prefix"])
    if dest.exists():
        shutil.rmtree(dest)
    proc = subprocess.run(
        ["cp", "-al", str(good_prefix), str(dest)], capture_output=True, text=True
    )
    if proc.returncode != 0:  # another filesystem: a real copy (slow, but correct)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(good_prefix, dest, symlinks=True)
    _fix_scripts(dest, str(good_prefix))

    def moved(path: Path, src_prefix: Path) -> Path:
        try:
            return dest / path.relative_to(os.path.normpath(src_prefix))
        except ValueError:
            raise SpliceError(f"{path} lies outside {src_prefix}: cannot splice it") from None

    for c in changes:
        if c.kind in ("removed", "changed"):
            for f in _files(good, c.name):
                target = moved(f, good_prefix)
                if target.exists() or target.is_symlink():
                    target.unlink()
                    _prune(target.parent, dest)
        if c.kind in ("added", "changed"):
            for f in _files(bad, c.name):
                if f.exists():
                    _link_or_copy(f, moved(f, bad_prefix))
    _fix_scripts(dest, str(bad_prefix))  # scripts that came from BAD
    return dest / "bin" / "python"
