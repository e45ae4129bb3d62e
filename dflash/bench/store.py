"""Append-only results store with explicitly promoted baselines.

Layout under the store root (default ~/.cache/dflash/bench, or $DFLASH_BENCH_STORE):
  records/<workload>/<time>-<id>.json   one file per run, never rewritten
  baselines/<baseline key>.json         pointer to the accepted record of a key
  baselines/promotions.jsonl            every promotion, appended
  .lock                                 flock serialising baseline changes
Records are written to a temporary file and hard-linked to their final name: a link
fails if the name exists, so a record can never be overwritten, and readers never
see half a file. Baseline pointers are replaced with os.replace under the lock, so
two concurrent `accept`s leave one valid pointer and both are logged.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

STORE_ENV = "DFLASH_BENCH_STORE"
# What every comparison and report reads from a record: checked on load, so a wrong
# file is named with what it lacks instead of failing later with a bare KeyError.
REQUIRED = {
    "workload": ("name", "hash", "topology", "definition"),
    "hardware": ("key",),
    "environment": ("key", "variant"),
    "summary": ("metric", "unit", "samples", "median", "stages_s", "step_s"),
}


class BenchInputError(ValueError):
    """A file or reference given to `dflash bench` that is not what it must be."""


def check_record(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise BenchInputError(f"{where}: not a bench record (a JSON object is expected)")
    missing = [k for k in REQUIRED if not isinstance(data.get(k), dict)]
    missing += [
        f"{k}.{f}" for k, fields in REQUIRED.items() if k not in missing for f in fields
        if f not in data[k]
    ]  # fmt: skip
    if missing:
        raise BenchInputError(
            f"{where}: not a bench record (missing {', '.join(missing)}); records are "
            "written by `dflash bench run` (--json-out FILE for a copy)"
        )
    if not data["summary"]["samples"]:
        raise BenchInputError(f"{where}: bench record without samples")
    return data


def load_record(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchInputError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from exc
    return check_record(data, str(path))


def default_root() -> Path:
    env = os.environ.get(STORE_ENV)
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "dflash" / "bench"


def baseline_key(record: dict[str, Any]) -> str:
    """One accepted baseline per (hardware, workload, CUDA variant)."""
    w = record["workload"]["name"]
    variant = record["environment"].get("variant") or "none"
    return f"{w}--{variant}--{record['hardware']['key']}"


def _write_new(path: Path, data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide records from other CI users
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # FileExistsError instead of overwriting
    finally:
        os.unlink(tmp)


def _replace(path: Path, data: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Store:
    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root else default_root()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def add(self, record: dict[str, Any]) -> Path:
        """Store a new record; sets and returns its id-bearing path."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(record.get("time_unix")))
        for _ in range(5):
            rid = f"{stamp}-{secrets.token_hex(4)}"
            path = self.root / "records" / record["workload"]["name"] / f"{rid}.json"
            record["id"] = rid
            try:
                _write_new(path, json.dumps(record, indent=1, sort_keys=True))
                return path
            except FileExistsError:
                continue
        raise RuntimeError(f"could not find a free record name under {path.parent}")

    def records(self, workload: str | None = None) -> list[dict[str, Any]]:
        base = self.root / "records"
        pattern = f"{workload}/*.json" if workload else "*/*.json"
        out = [load_record(p) for p in sorted(base.glob(pattern))]
        return sorted(out, key=lambda r: (r.get("time_unix", 0), r.get("id", "")))

    def find(self, ref: str) -> dict[str, Any]:
        """A record by id, id prefix or file path."""
        p = Path(ref)
        if p.is_file() or p.suffix == ".json" or os.sep in ref:
            return load_record(p)
        hits = sorted((self.root / "records").glob(f"*/{ref}*.json"))
        if not hits:
            raise BenchInputError(
                f"{ref}: no such file, and no record id starting with it in {self.root} "
                "(`dflash bench list` shows the ids)"
            )
        if len(hits) > 1:
            raise BenchInputError(
                f"{ref}: {len(hits)} records match this id prefix in {self.root}: "
                + ", ".join(h.stem for h in hits[:5])
            )
        return load_record(hits[0])

    def baseline(self, key: str) -> dict[str, Any] | None:
        ptr = self.root / "baselines" / f"{key}.json"
        if not ptr.exists():
            return None
        try:
            meta = json.loads(ptr.read_text(encoding="utf-8"))
            rid = meta["record"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise BenchInputError(
                f"{ptr}: baseline pointer unreadable ({exc}); `dflash bench accept` rewrites it"
            ) from exc
        record = self.find(rid)
        record["_baseline"] = meta
        return record

    def accept(self, record: dict[str, Any], *, reason: str, only_if_absent: bool = False) -> bool:
        """Promote `record` to the baseline of its key. With `only_if_absent` it is a
        compare-and-set: False (and nothing changes) when a baseline already exists."""
        key = baseline_key(record)
        ptr = self.root / "baselines" / f"{key}.json"
        meta = {
            "key": key,
            "record": record["id"],
            "accepted_unix": time.time(),
            "reason": reason,
            "user": os.environ.get("USER") or os.environ.get("GITHUB_ACTOR") or "",
        }
        with self._locked():
            if only_if_absent and ptr.exists():
                return False
            _replace(ptr, json.dumps(meta, indent=1, sort_keys=True))
            with open(self.root / "baselines" / "promotions.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(meta, sort_keys=True) + "\n")
        return True

    def promotions(self) -> list[dict[str, Any]]:
        path = self.root / "baselines" / "promotions.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def baseline_images(root: str | os.PathLike[str] | None = None) -> dict[str, list[str]]:
    """Image id -> the baseline keys whose accepted record ran in that image. Standard
    library only: images/build.py (`just rmi`) reads it without the project's venv."""
    store = Store(root)
    out: dict[str, list[str]] = {}
    for ptr in sorted((store.root / "baselines").glob("*.json")):
        try:
            rec = store.find(json.loads(ptr.read_text(encoding="utf-8"))["record"])
        except (BenchInputError, json.JSONDecodeError, KeyError, TypeError):
            continue  # an unreadable pointer protects nothing; `bench accept` repairs it
        env = rec.get("environment") or {}
        image_id = (env.get("image") or {}).get("id")
        if env.get("kind") == "image" and image_id:
            out.setdefault(image_id, []).append(ptr.stem)
    return out
