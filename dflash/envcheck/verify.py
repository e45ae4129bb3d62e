"""Installed files against their RECORD sha256 (no installer checks them afterwards:
pypa/pip#1463 left it to other tools).

Two modes:
  full (`dflash doctor --verify`)  hash every file every distribution's RECORD lists,
        on a thread pool (hashlib releases the GIL), with a progress line on a
        terminal; the (size, mtime) of every verified file is kept as the baseline.
  quick (the default run)  every file's size against RECORD's (the static probe
        stats every file anyway and reports those that differ: proof of a change);
        where a baseline exists (the last --verify's, or the image manifest's
        `record_stats` baked at build time), a distribution whose (path, size, mtime)
        digest moved since is re-read and its changed files hashed. Without a baseline
        a same-size edit goes unseen: run --verify once to arm it.
        Measured on the 7 GB cu128 env: quick adds ~0 s to the static probe, full takes
        the time docs/doctor.md states.
Runs in the doctor's process: the RECORD paths are read from the dist-info
directories the static probe reported.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .paths import verify_baseline_path

CHUNK = 1 << 22
QUICK_MAX_BYTES = 512 << 20  # what a default run hashes at most (~0.5 s on one core)


@dataclass(frozen=True)
class Entry:
    dist: str
    version: str
    path: str  # absolute
    rel: str  # as RECORD lists it
    digest: str  # sha256=<urlsafe b64>
    size: int | None


@dataclass
class Result:
    mode: str
    files: int = 0
    hashed: int = 0
    hashed_bytes: int = 0
    seconds: float = 0.0
    baseline: str | None = None  # path of the baseline used or written
    stale: int = 0  # distributions left unhashed: too much moved since the baseline
    modified: list[tuple[Entry, str]] = field(default_factory=list)  # (entry, why)


def record_entries(dists: Iterable[dict[str, Any]]) -> list[Entry]:
    out = []
    for d in dists:
        info = d.get("dist_info")
        if not info:
            continue
        try:
            text = (Path(info) / "RECORD").read_text(encoding="utf-8")
        except OSError:
            continue
        for row in csv.reader(text.splitlines()):
            if len(row) < 2 or not row[1].startswith("sha256="):
                continue  # RECORD itself, byte-code caches: unhashed by design
            if "__pycache__" in row[0] or row[0].endswith(".pyc"):
                continue  # byte code pip recorded: Python rewrites it when the source changes
            size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
            full = os.path.normpath(os.path.join(d["site_dir"], row[0]))
            out.append(Entry(d["name"], d["version"], full, row[0], row[1], size))
    return out


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _files_path(path: Path) -> Path:
    # The per-file (size, mtime) lists (MBs for a torch env) live beside the small
    # per-distribution digests, read only when a digest moved.
    return path.with_suffix(".files.json")


class Progress:
    """One self-overwriting stderr line, only on a terminal, at most 10 updates a second."""

    def __init__(self, total_bytes: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total_bytes, 0, enabled
        self.lock, self.last = threading.Lock(), 0.0

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if self.enabled and (now - self.last > 0.1 or self.done >= self.total):
                self.last = now
                pct = 100.0 * self.done / max(self.total, 1)
                sys.stderr.write(
                    f"\rverify: {self.done / 1e9:6.2f} / {self.total / 1e9:.2f} GB ({pct:5.1f}%)"
                )
                sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def verify(
    dists: Iterable[dict[str, Any]],
    prefix: str,
    full: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
    built: dict[str, str] | None = None,
) -> Result:
    """Check installed files against RECORD. `dists` are the static probe's entries
    (dist_info, site_dir, resized, stat_digest); `built` the image manifest's digests
    of the same, a baseline for distributions the last --verify did not cover."""
    start = time.perf_counter()
    dists = [d for d in dists if d.get("dist_info")]
    base_path = verify_baseline_path(prefix)
    loaded = None if full else _load_json(base_path)
    baseline = loaded.get("dists") if loaded else None
    if not full and built:  # the --verify baseline, where there is one, is the newer
        baseline = {**built, **(baseline or {})}
    file_lists: dict[str, Any] | None = None
    result = Result(mode="full" if full else "quick")
    result.baseline = (
        str(base_path) if full or loaded else "the image manifest" if baseline else None
    )
    todo: list[tuple[Entry, os.stat_result]] = []
    for d in dists:
        result.files += int(d.get("n_files", 0))
        resized = {r[0] for r in d.get("resized", [])}
        for rel, disk, listed in d.get("resized", []):
            e = Entry(d["name"], d["version"], os.path.join(d["site_dir"], rel), rel, "", listed)
            result.modified.append((e, f"size {disk} where RECORD says {listed}"))
        known = baseline is not None and d["dist_info"] in baseline
        if not full and (not known or baseline[d["dist_info"]] == d.get("stat_digest")):  # type: ignore[index]
            continue  # no baseline for it, or nothing changed since the last --verify
        entries = record_entries([d])  # parsed only where something is to be hashed
        if not full and file_lists is None:
            file_lists = (_load_json(_files_path(base_path)) or {}).get("files", {})
        files = {} if full else dict((file_lists or {}).get(d["dist_info"], {}))
        for e in entries:
            if e.rel in resized:
                continue
            try:
                st = os.stat(e.path)
            except OSError:
                continue  # missing files are FILE_MISSING's
            if full or files.get(e.path) != [st.st_size, int(st.st_mtime)]:
                todo.append((e, st))
    if not full and sum(st.st_size for _, st in todo) > QUICK_MAX_BYTES:
        # Most of the environment moved since the baseline (a copy that reset mtimes):
        # hashing it on every run would make the default run a --verify.
        result.stale = len({e.dist for e, _ in todo})
        todo = []
    enabled = sys.stderr.isatty() if progress is None else progress
    bar = Progress(sum(st.st_size for _, st in todo), enabled)

    def check(item: tuple[Entry, os.stat_result]) -> tuple[Entry, os.stat_result, str | None]:
        e, st = item
        try:
            digest = file_digest(e.path)
        except OSError as exc:
            return e, st, f"unreadable: {exc.strerror or exc}"
        bar.add(st.st_size)
        return e, st, None if digest == e.digest else "content differs from its RECORD sha256"

    ok: dict[str, dict[str, list[int]]] = {}
    info_of = {(d["name"], d["version"]): d["dist_info"] for d in dists}
    with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
        for e, st, why in pool.map(check, todo):
            result.hashed += 1
            result.hashed_bytes += st.st_size
            if why:
                result.modified.append((e, why))
            else:
                key = info_of.get((e.dist, e.version), "")
                ok.setdefault(key, {})[e.path] = [st.st_size, int(st.st_mtime)]
    bar.close()
    if full:
        bad = {info_of.get((e.dist, e.version)) for e, _ in result.modified}
        _write_baseline(base_path, prefix, dists, ok, bad)
    result.seconds = time.perf_counter() - start
    return result


def _write_baseline(path: Path, prefix: str, dists: list, ok: dict, bad: set) -> None:
    """Per distribution: the probe's stat digest, and each verified file's (size,
    mtime). A distribution with a bad file gets no digest, so later quick runs keep
    hashing whatever changed in it."""
    digests = {
        d["dist_info"]: None if d["dist_info"] in bad else d.get("stat_digest") for d in dists
    }
    files = {d["dist_info"]: ok.get(d["dist_info"], {}) for d in dists}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for target, data in ((_files_path(path), {"files": files}), (path, {"dists": digests})):
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps({"prefix": prefix, **data}), encoding="utf-8")
            tmp.replace(target)
    except OSError:
        pass  # a read-only home: later quick runs compare sizes only
