"""Start-up probe, run INSIDE the audited interpreter as `python -I -S probe_startup.py`.

What a user's `python` does before `main`, worked out without doing it:
`-S` keeps `site` from running, so no `.pth` line and no sitecustomize executes
here; the probe then runs the stdlib's own `site.main()` with the two places
that execute code swapped for recorders (`site.addpackage`, which reads a
`.pth` file, and `execsitecustomize`/`execusercustomize`). Everything else is
the real algorithm of this interpreter's `site`: venv detection, user site,
system site-packages, `.pth` path lines. PYTHONPATH is put back where the
interpreter puts it (`-I` drops it), and the user site is enabled as it would be
without `-I`. Then, for every installed distribution, each top-level module it
installed is looked up with `importlib.util.find_spec` on that path: the real
finders of this interpreter, without importing the module.

Standard library only (like probe.py), and it never imports an audited package.
"""

from __future__ import annotations

import ast
import email.message
import email.parser
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import site
import sys
from typing import Any

MARKER = "DFLASH_PROBE_JSON:"
IMPORT_LINE = ("import ", "import\t")  # what site.addpackage executes
EDITABLE_FINDER = re.compile(r"^__editable___.*_finder$")
HEADER_END = re.compile(r"\r?\n\r?\n")  # the empty line that ends METADATA's headers


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class Recorder:
    """Replaces site's code-executing steps; records where each path entry came from."""

    def __init__(self) -> None:
        self.hooks: list[dict[str, Any]] = []
        self.causes: dict[str, str] = {}
        self.site_dirs: list[str] = []

    def addpackage(self, sitedir: str, name: str, known_paths: set | None) -> set | None:
        # Mirrors site.addpackage (3.11-3.13), except that import lines are recorded,
        # never executed.
        reset = known_paths is None
        known: set = site._init_pathinfo() if known_paths is None else known_paths  # type: ignore[attr-defined]
        fullname = os.path.join(sitedir, name)
        try:
            with open(fullname, "rb") as fh:
                raw = fh.read()
        except OSError:
            return known
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        for n, line in enumerate(text.splitlines(), 1):
            if line.startswith("#") or not line.strip():
                continue
            if line.startswith(IMPORT_LINE):
                hook = {"kind": "pth", "file": fullname, "line": n, "code": line.strip()[:300]}
                if hook not in self.hooks:  # venv's site dir is processed twice (3.11)
                    self.hooks.append(hook)
                continue
            line = line.rstrip()
            path, case = site.makepath(sitedir, line)
            if case not in known and os.path.exists(path):
                sys.path.append(path)
                known.add(case)
                self.causes.setdefault(path, f".pth file {fullname}")
        return None if reset else known

    def wrap_addsitedir(self, real):
        def addsitedir(sitedir, known_paths=None):
            if os.path.abspath(sitedir) not in self.site_dirs:
                self.site_dirs.append(os.path.abspath(sitedir))
            return real(sitedir, known_paths)

        return addsitedir

    def customize(self, module: str):
        def run() -> None:
            spec = find(module)
            if spec is not None and spec.origin:
                self.hooks.append({"kind": module, "file": spec.origin, "line": None, "code": ""})

        return run


def find(name: str):
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def user_site_allowed() -> bool:
    """site.check_enableusersite() as it answers without -I (which sets -s)."""
    if os.environ.get("PYTHONNOUSERSITE"):
        return False
    if hasattr(os, "getuid") and os.geteuid() != os.getuid():
        return False
    return not (hasattr(os, "getgid") and os.getegid() != os.getgid())


def users_path() -> tuple[list[dict[str, str]], Recorder, dict[str, Any]]:
    rec = Recorder()
    causes = {os.path.abspath(p): "the standard library" for p in sys.path}
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for p in pythonpath:
        causes.setdefault(os.path.abspath(p), "PYTHONPATH")
    sys.path[:0] = pythonpath  # where the interpreter puts it, after the script's dir
    site.addpackage = rec.addpackage  # type: ignore[assignment]
    site.addsitedir = rec.wrap_addsitedir(site.addsitedir)
    site.execsitecustomize = rec.customize("sitecustomize")
    site.execusercustomize = rec.customize("usercustomize")
    site.ENABLE_USER_SITE = user_site_allowed()  # venv() turns it off unless system site
    site.main()
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    for d in rec.site_dirs:
        if user_site and d == os.path.abspath(user_site):
            causes.setdefault(d, "the user site-packages (~/.local)")
        elif d.startswith(os.path.abspath(sys.prefix) + os.sep):
            causes.setdefault(d, "the environment's site-packages")
        else:
            causes.setdefault(d, "the system site-packages (include-system-site-packages)")
    causes.update({k: v for k, v in rec.causes.items() if k not in causes})
    entries = [{"path": p, "cause": causes.get(os.path.abspath(p), "unknown")} for p in sys.path]
    info = {
        "user_site": user_site,
        "user_site_enabled": bool(site.ENABLE_USER_SITE),
        "pythonpath": pythonpath,
        "prefix": sys.prefix,
        "pyvenv_cfg": pyvenv_cfg(sys.prefix),
    }
    return entries, rec, info


def pyvenv_cfg(prefix: str) -> dict[str, str]:
    """The venv's creator writes its name and version here (`uv = 0.13.9`,
    `virtualenv = 20.29.1`): virtualenv also writes a `_virtualenv.pth` hook."""
    out: dict[str, str] = {}
    try:
        with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.partition("=")
                if sep:
                    out[key.strip()] = value.strip()
    except OSError:
        pass
    return out


def editable_mappings() -> dict[str, str]:
    """Top-level name -> source path from setuptools' editable finders (`MAPPING = {...}`
    in __editable___*_finder.py), read as literals. Those finders sit at the end of
    sys.meta_path: they answer only for names no path entry has."""
    out: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        for name in names:
            stem = name[:-3]
            if not (name.endswith(".py") and EDITABLE_FINDER.match(stem)):
                continue
            try:
                with open(os.path.join(entry, name), encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
            except (OSError, SyntaxError, UnicodeDecodeError):
                continue
            for node in tree.body:
                value: ast.expr | None
                if isinstance(node, ast.Assign):
                    target, value = node.targets[0], node.value
                elif isinstance(node, ast.AnnAssign):
                    target, value = node.target, node.value
                else:
                    continue
                if isinstance(target, ast.Name) and target.id == "MAPPING" and value is not None:
                    try:
                        mapping = ast.literal_eval(value)
                    except ValueError:
                        continue
                    for key, value in dict(mapping).items():
                        out.setdefault(str(key), str(value))
    return out


def metadata_headers(dist: importlib.metadata.Distribution) -> email.message.Message:
    """`dist.metadata` without its body (as in probe.py): importlib parses the whole
    file, long description included, on every access; the headers end at the first
    empty line, so parsing only them gives the same values."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("") or ""
    return email.parser.HeaderParser().parsestr(HEADER_END.split(text, 1)[0])


def record_tops(dist: importlib.metadata.Distribution, suffixes: list[str]):
    """From one read of RECORD: the importable top-level names the distribution
    installed, and its top-level files (.pth, sitecustomize.py...) for ownership."""
    names: set[str] = set()
    dirs: set[str] = set()
    files: list[str] = []
    for line in (dist.read_text("RECORD") or "").splitlines():
        path = line.split(",", 1)[0].strip('"')
        head, sep, _ = path.partition("/")
        if sep:
            dirs.add(head)  # judged once per directory below, not once per file
            continue
        files.append(head)
        for suffix in suffixes:
            if head.endswith(suffix):
                stem = head[: -len(suffix)]
                if stem.isidentifier():
                    names.add(stem)
                break
    names.update(d for d in dirs if d.isidentifier() and d != "__pycache__")
    return sorted(names), files


def where(origin: str | None, locations, entries: list[dict[str, str]]) -> str | None:
    """The path entry a found module lies in."""
    paths = [origin] if origin else list(locations or [])
    best = None
    for e in entries:
        root = os.path.abspath(e["path"]).rstrip(os.sep) + os.sep
        inside = any(os.path.abspath(p).startswith(root) for p in paths)
        if inside and (best is None or len(root) > len(best)):
            best = root
    return best.rstrip(os.sep) if best else None


def resolve(entries, own: list[str]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """For each distribution installed in the environment's own site dirs: where each
    of its top-level modules would be imported from. Also: which distribution owns
    each top-level file of any site dir on the path."""
    editable = editable_mappings()
    suffixes = sorted(importlib.machinery.all_suffixes(), key=len, reverse=True)
    owners: dict[str, str] = {}
    out = []
    for dist in importlib.metadata.distributions(path=[e["path"] for e in entries]):
        meta = metadata_headers(dist)
        name = meta["Name"]
        if not name:
            continue
        base = os.path.abspath(str(dist.locate_file("")))
        tops, files = record_tops(dist, suffixes)
        for f in files:
            owners[os.path.normpath(os.path.join(base, f))] = name
        if base not in own:
            continue
        modules = {}
        for mod in tops:
            spec = find(mod)
            origin = spec.origin if spec is not None else None
            if origin in ("built-in", "frozen"):
                found = {"origin": origin, "entry": None, "namespace": False}
            elif spec is None:
                found = {"origin": editable.get(mod), "entry": None, "namespace": False}
            else:
                locations = list(spec.submodule_search_locations or [])
                found = {
                    "origin": origin,
                    "locations": locations,
                    "entry": where(origin, locations, entries),
                    # a namespace package is the union of every portion: no shadowing
                    "namespace": origin is None,
                }
            modules[mod] = found
        out.append(
            {
                "name": name,
                "canonical": canonical(name),
                "version": meta["Version"],
                "site_dir": base,
                "modules": modules,
            }
        )
    return out, owners


def collect() -> dict[str, Any]:
    entries, rec, info = users_path()
    # The environment's own site dirs (what the static probe, python -I, sees): the
    # distributions installed there are the ones whose modules must win.
    own = [d for d in rec.site_dirs if d.startswith(os.path.abspath(sys.prefix) + os.sep)]
    dists, owners = resolve(entries, own)
    for hook in rec.hooks:
        hook["owner"] = owners.get(os.path.normpath(hook["file"]))
    return {
        **info,
        "path": entries,
        "hooks": rec.hooks,
        "own_site_dirs": own,
        "distributions": dists,
    }


if __name__ == "__main__":
    print(MARKER + json.dumps(collect()))
