"""uv.lock parsing and the dependency walk that says what one extra needs.

uv writes one lock for all extras. With `[tool.uv] conflicts`, packages needed
by only one of two conflicting extras appear once per extra (two `torch`
entries distinguished by version) and their markers mention the extras in uv's
encoding, `extra == 'extra-14-dflash-trainer-cu128'` (length-prefixed package name).
Walking the graph from the root with the markers evaluated for this interpreter
and the active extra yields exactly the set `uv sync --extra X` installs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, Marker

from .paths import DFLASH_LOCK_ENV, baked_lock_path, default_compile_cache_root

ROOT_NAME = "dflash-trainer"


class LockError(ValueError):
    """The lock is missing, unreadable or not the dflash project's lock."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def encoded_extra(package: str, extra: str) -> str:
    """uv's conflict-marker spelling of `package[extra]`."""
    return f"extra-{len(package)}-{package}-{extra}"


def encoded_group(package: str, group: str) -> str:
    return f"group-{len(package)}-{package}-{group}"


@dataclass(frozen=True)
class LockPackage:
    name: str
    version: str
    source: dict[str, Any]
    dependencies: tuple[dict[str, Any], ...]
    optional: dict[str, tuple[dict[str, Any], ...]]
    dev: dict[str, tuple[dict[str, Any], ...]]
    resolution_markers: tuple[str, ...]
    # the locked artifacts: [{url, hash, size}], the wheels' file names carry their tags
    wheels: tuple[dict[str, Any], ...] = ()
    sdist: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.name, self.version)


@dataclass
class Lock:
    path: Path
    packages: list[LockPackage]
    by_name: dict[str, list[LockPackage]]
    root: LockPackage

    @property
    def extras(self) -> list[str]:
        return sorted(self.root.optional)

    @property
    def groups(self) -> list[str]:
        return sorted(self.root.dev)


def _deps(raw: Any) -> tuple[dict[str, Any], ...]:
    return tuple(d for d in (raw or []) if isinstance(d, dict) and "name" in d)


def toml_cache_path(text: str) -> Path:
    """Beside the compile caches: one JSON copy of each parsed TOML text, by its sha256."""
    key = hashlib.sha256(text.encode()).hexdigest()
    return default_compile_cache_root().parent / "toml" / f"{key}.json"


def load_toml(text: str) -> dict[str, Any]:
    """tomllib.loads(text), through a JSON copy keyed by the text's sha256: parsing
    the 230 kB uv.lock in pure Python is a third of the doctor's own CPU time after
    its probes, json.loads is ten times faster. The key is the content, so an
    edited lock is parsed afresh; a cache that cannot be read or written is skipped."""
    cache = toml_cache_path(text)
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            return data
    except (OSError, ValueError):
        pass
    data = tomllib.loads(text)
    try:
        encoded = json.dumps(data)  # TypeError: a TOML date or time (uv.lock has none)
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(encoded, encoding="utf-8")
        tmp.replace(cache)
        _prune(cache.parent)
    except (OSError, TypeError, ValueError):
        pass
    return data


TOML_CACHE_KEEP = 32  # parsed texts kept (tests parse many throwaway locks)


def _prune(folder: Path) -> None:
    entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[TOML_CACHE_KEEP:]:
        old.unlink(missing_ok=True)


def parse_lock(text: str, path: Path = Path("uv.lock")) -> Lock:
    try:
        data = load_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise LockError(f"{path}: not valid TOML: {exc}") from exc
    packages = []
    for raw in data.get("package", []):
        if "name" not in raw:
            raise LockError(f"{path}: a [[package]] entry has no name")
        packages.append(
            LockPackage(
                name=canonical(raw["name"]),
                version=str(raw.get("version", "")),
                source=dict(raw.get("source", {})),
                dependencies=_deps(raw.get("dependencies")),
                optional={k: _deps(v) for k, v in raw.get("optional-dependencies", {}).items()},
                dev={k: _deps(v) for k, v in raw.get("dev-dependencies", {}).items()},
                resolution_markers=tuple(raw.get("resolution-markers", [])),
                wheels=tuple(w for w in raw.get("wheels", []) if isinstance(w, dict)),
                sdist=raw.get("sdist") if isinstance(raw.get("sdist"), dict) else None,
            )
        )
    by_name: dict[str, list[LockPackage]] = {}
    for pkg in packages:
        by_name.setdefault(pkg.name, []).append(pkg)
    roots = by_name.get(ROOT_NAME, [])
    if len(roots) != 1:
        raise LockError(f"{path}: expected one `{ROOT_NAME}` package, found {len(roots)}")
    return Lock(path=path, packages=packages, by_name=by_name, root=roots[0])


def load_lock(path: str | os.PathLike[str]) -> Lock:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise LockError(f"cannot read {p}: {exc.strerror or exc}") from exc
    return parse_lock(text, p)


def marker_matches(marker: str | None, env: Mapping[str, str], extras: Iterable[str]) -> bool:
    """Evaluate a lock marker for this interpreter with a set of active extras.

    packaging evaluates `extra == X` against one value at a time (sets only from
    packaging 26.4), so a marker holds if it holds for one active extra. That is
    exact for uv's conflict markers, whose `and`-ed extras are never both active.
    """
    if not marker:
        return True
    try:
        parsed = Marker(marker)
    except InvalidMarker as exc:
        raise LockError(f"invalid marker {marker!r}: {exc}") from exc
    candidates = list(extras) or [""]
    return any(parsed.evaluate({**env, "extra": e}) for e in candidates)


@dataclass
class Resolution:
    extra: str | None
    required: dict[str, LockPackage] = field(default_factory=dict)
    dev: dict[str, LockPackage] = field(default_factory=dict)
    edges: dict[str, set[str]] = field(default_factory=dict)

    def closure(self, start: str) -> set[str]:
        """Names reachable from `start` (itself included) in the walked graph."""
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.edges.get(name, ()))
        return seen


def _select(lock: Lock, dep: Mapping[str, Any], env: Mapping[str, str], extras: set[str]):
    candidates = lock.by_name.get(canonical(dep["name"]), [])
    if "version" in dep:
        candidates = [p for p in candidates if p.version == dep["version"]]
    if len(candidates) > 1:  # uv names the version when ambiguous; be safe anyway
        fitting = [
            p
            for p in candidates
            if not p.resolution_markers
            or any(marker_matches(m, env, extras) for m in p.resolution_markers)
        ]
        candidates = fitting or candidates
    if not candidates:
        raise LockError(f"{lock.path}: dependency {dep['name']} has no [[package]] entry")
    return candidates[0]


def _walk(lock, start_deps, env, extras, out: dict[str, LockPackage], edges) -> None:
    todo: list[tuple[str, dict[str, Any]]] = [(ROOT_NAME, d) for d in start_deps]
    seen: set[tuple[str, str, frozenset[str]]] = set()
    while todo:
        parent, dep = todo.pop()
        if not marker_matches(dep.get("marker"), env, extras):
            continue
        pkg = _select(lock, dep, env, extras)
        edges.setdefault(parent, set()).add(pkg.name)
        wanted = frozenset(dep.get("extra", []))
        if (pkg.name, pkg.version, wanted) in seen:
            continue
        seen.add((pkg.name, pkg.version, wanted))
        out[pkg.name] = pkg
        todo.extend((pkg.name, d) for d in pkg.dependencies)
        for extra in wanted:
            todo.extend((pkg.name, d) for d in pkg.optional.get(extra, ()))


def resolve(lock: Lock, extra: str | None, env: Mapping[str, str]) -> Resolution:
    """What `uv sync --extra <extra>` installs (required) and what the dev groups
    add on top (allowed, never required)."""
    if extra is not None and extra not in lock.root.optional:
        raise LockError(f"{lock.path}: unknown extra {extra!r}; the lock has {lock.extras}")
    active = {extra, encoded_extra(ROOT_NAME, extra)} if extra else set()
    res = Resolution(extra=extra)
    start = list(lock.root.dependencies) + list(lock.root.optional.get(extra or "", ()))
    _walk(lock, start, env, active, res.required, res.edges)
    dev_active = active | {encoded_group(ROOT_NAME, g) for g in lock.groups}
    dev_deps = [d for group in lock.root.dev.values() for d in group]
    dev_all: dict[str, LockPackage] = {}
    _walk(lock, dev_deps, env, dev_active, dev_all, {})
    res.dev = {n: p for n, p in dev_all.items() if n not in res.required}
    return res


def detect_extra(lock: Lock, installed: Mapping[str, str]) -> str | None:
    """The extra whose own pins (e.g. torch==2.10.0 for cu128) are what is installed."""
    from packaging.version import InvalidVersion, Version

    def same(installed_v: str, locked_v: str) -> bool:
        try:
            a, b = Version(installed_v), Version(locked_v)
        except InvalidVersion:
            return installed_v == locked_v
        return a == b or (not b.local and a.public == b.public)

    matches = []
    for extra, deps in lock.root.optional.items():
        pins = [(canonical(d["name"]), d.get("version")) for d in deps]
        if pins and all(n in installed and (v is None or same(installed[n], v)) for n, v in pins):
            matches.append(extra)
    return matches[0] if len(matches) == 1 else None


def _is_dflash_project(pyproject: Path) -> bool:
    try:
        data = load_toml(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return False
    return canonical(str(data.get("project", {}).get("name", ""))) == ROOT_NAME


def find_lock(
    explicit: str | None = None,
    prefix: str | None = None,
    start_dirs: Iterable[str | os.PathLike[str]] = (),
    environ: Mapping[str, str] = os.environ,
) -> tuple[Path | None, str]:
    """Locate uv.lock; returns (path, how it was found). Order: --lock, $DFLASH_LOCK,
    the project root above each start dir (cwd, the dflash package), the baked copy."""
    if explicit:
        return Path(explicit), "--lock"
    if environ.get(DFLASH_LOCK_ENV):
        return Path(environ[DFLASH_LOCK_ENV]), f"${DFLASH_LOCK_ENV}"
    for start in start_dirs:
        for d in [Path(start).absolute(), *Path(start).absolute().parents]:
            if (d / "uv.lock").is_file() and _is_dflash_project(d / "pyproject.toml"):
                return d / "uv.lock", f"project root {d}"
    if prefix and baked_lock_path(prefix).is_file():
        return baked_lock_path(prefix), "baked into the image"
    return None, "not found"
