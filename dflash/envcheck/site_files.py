"""Descriptive manifest extras for `dflash image diff`: not part of the fingerprint.

  library_info  per native library (keyed like the manifest's `libraries`): its ELF
                soname (from `readelf -d`; None where readelf is missing or the file
                has none), the distribution whose RECORD owns it and that one's version
  site_files    `unrecorded`: files in a site-packages directory that no RECORD lists
                (size and full sha256); `size_mismatch`: files whose size on disk differs
                from their RECORD entry (size, RECORD's size, sha256, owner). Byte code
                is left out (recreated on demand). A same-size edit of a recorded file
                is not seen: verifying every RECORD hash reads ~700 MB of a torch venv.

The fingerprint formula is unchanged, so images, compile caches and bench baselines
keep their keys; manifest_diff.py compares the extras only when both sides have them.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

_SONAME = re.compile(r"\(SONAME\)\s+Library soname: \[(.+)\]")
_CHUNK = 200  # files per readelf call (argument-length bound)


def sonames(paths: Iterable[str]) -> dict[str, str | None]:
    """DT_SONAME of each ELF file, by one `readelf -d` per chunk of files."""
    paths = list(paths)
    out: dict[str, str | None] = dict.fromkeys(paths)
    readelf = shutil.which("readelf")
    if readelf is None:
        return out
    for i in range(0, len(paths), _CHUNK):
        chunk = paths[i : i + _CHUNK]
        proc = subprocess.run(
            [readelf, "-d", "-W", *chunk], capture_output=True, text=True, timeout=120
        )
        # readelf names each file ("File: PATH") only when given more than one.
        current = chunk[0] if len(chunk) == 1 else None
        for line in proc.stdout.splitlines():
            if line.startswith("File: "):
                current = line[len("File: ") :]
            elif current in out and (m := _SONAME.search(line)):
                out[current] = m.group(1)
    return out


def library_info(static: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    versions = {d["canonical"]: d["version"] for d in static["distributions"] if d["canonical"]}
    canon = {d["name"]: d["canonical"] for d in static["distributions"]}
    libs = static["libraries"]
    names = sonames(libs)
    out = {}
    for full, lib in libs.items():
        owners = lib.get("owners") or []
        owner = lib.get("content_owner") or (owners[0] if owners else None)
        owner = canon.get(owner, owner)
        out[lib["rel"]] = {
            "soname": names.get(full),
            "owner": owner,
            "version": versions.get(owner),
        }
    return dict(sorted(out.items()))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _claims(static: Mapping[str, Any]) -> dict[str, tuple[str, int | None]]:
    """Every RECORD row: absolute path -> (owner, RECORD's size)."""
    claims: dict[str, tuple[str, int | None]] = {}
    for d in static["distributions"]:
        record = os.path.join(d["dist_info"], "RECORD")
        try:
            with open(record, encoding="utf-8", newline="") as fh:
                rows = list(csv.reader(fh))
        except OSError:
            continue  # a dist-info without RECORD: its files show up as unrecorded
        for row in rows:
            if row and row[0]:
                size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
                full = os.path.normpath(os.path.join(d["site_dir"], row[0]))
                claims[full] = (d["canonical"] or d["name"], size)
    return claims


def _bytecode(name: str) -> bool:
    return name.endswith((".pyc", ".pyo"))


def site_files(static: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    claims = _claims(static)
    unrecorded: dict[str, Any] = {}
    mismatch: dict[str, Any] = {}
    for site in static["interpreter"]["site_dirs"]:
        site = os.path.normpath(site)  # so that walked paths match the claims as they are
        for root, dirs, files in os.walk(site):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                full = os.path.join(root, name)
                if _bytecode(name):
                    continue
                try:
                    size = os.stat(full).st_size
                except OSError:
                    continue  # a dangling link: not a file any loader can read
                rel = full[len(site) + 1 :]
                claim = claims.get(full)
                if claim is None:
                    unrecorded[rel] = {"size": size, "sha256": _sha256(full)}
                elif claim[1] is not None and claim[1] != size:
                    mismatch[rel] = {
                        "size": size,
                        "record_size": claim[1],
                        "sha256": _sha256(full),
                        "owner": claim[0],
                    }
    return {"unrecorded": unrecorded, "size_mismatch": mismatch}


def manifest_extras(static: Mapping[str, Any]) -> dict[str, Any]:
    return {"library_info": library_info(static), "site_files": site_files(static)}
