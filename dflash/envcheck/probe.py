"""Static environment probe, run INSIDE the audited interpreter as `python -I probe.py`.

Self-contained on purpose: it imports nothing but the standard library, so the
doctor can audit a contaminated venv that does not even have dflash (or
`packaging`) installed. It only collects facts and prints them as JSON; every
judgement happens in the doctor process. It never imports torch. Its one write:
given a file (`python -I probe.py SAMPLE_CACHE`), it keeps the sampled hashes of
the environment's libraries there for the next run (see SampleCache).
"""

from __future__ import annotations

import ast
import base64
import csv
import email.message
import email.parser
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import time
from typing import Any

# Environment variables worth reporting (and, filtered, fingerprinting): they change
# speed without changing an installed file. The one list: the bench's settings diff
# uses it too. MALLOC_*/GLIBC_TUNABLES tune glibc's allocator, PYTHONMALLOC CPython's.
VAR_PREFIXES = (
    "OMP_", "MKL_", "KMP_", "GOMP_", "ATEN_", "DNNL_", "ONEDNN_", "OPENBLAS_", "CUDA_",
    "NCCL_", "TORCH", "PYTORCH_", "TRITON_", "LD_", "NVIDIA_", "CUBLAS", "CUDNN",
    "MALLOC_", "GLIBC_TUNABLES", "PYTHONMALLOC",
)  # fmt: skip
# Sampled hashing of native libraries: the size plus the first and last 256 KiB.
# Full hashing costs ~10 s for the 5 GB of CUDA libraries a torch venv holds;
# the samples hold the ELF header, the linker's build-id note (itself a hash of
# the build) and the section tables at the end, so another build hashes apart.
SAMPLE_BYTES = 256 << 10
RACY_NS = 2_000_000_000  # SampleCache keeps files unchanged for this long before hashing
SAMPLE_CACHE_KEEP = 32  # cache files kept (one per audited interpreter)
MARKER = "DFLASH_PROBE_JSON:"
HEADER_END = re.compile(r"\r?\n\r?\n")  # the empty line that ends METADATA's headers


def is_shared_lib(name: str) -> bool:
    base = name.rpartition("/")[2]  # os.path.basename, cheaper on 28k RECORD rows
    return base.endswith(".so") or ".so." in base


def sampled_sha256(path: str, size: int) -> str:
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        if size <= 2 * SAMPLE_BYTES:
            h.update(fh.read())
        else:
            h.update(fh.read(SAMPLE_BYTES))
            fh.seek(-SAMPLE_BYTES, os.SEEK_END)
            h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()


class SampleCache:
    """The sampled hashes of the last run, reused for a library whose stat identity
    (size, mtime and ctime in ns, inode, device) has not changed: hashing the samples
    of a torch env's 370 to 610 libraries was a fifth of this probe's time. Writing a
    file updates its ctime and no call sets ctime back (utime sets atime and mtime
    only), so a file changed in place or replaced never matches. File times come from a coarse clock
    (a few ms): a file changed within RACY_NS of being hashed is not kept, or an
    edit in the same tick could look unchanged (git's "racily clean" rule)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.old: dict[str, Any] = {}
        self.new: dict[str, list] = {}
        self.started_ns = time.time_ns()
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    data = json.load(fh)
                self.old = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                pass

    def sha(self, full: str, st: os.stat_result) -> str:
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
        hit = self.old.get(full)
        if isinstance(hit, list) and len(hit) == 2 and hit[0] == key:
            digest = str(hit[1])
        else:
            digest = sampled_sha256(full, st.st_size)
        if st.st_ctime_ns < self.started_ns - RACY_NS:
            self.new[full] = [key, digest]
        return digest

    def save(self) -> None:
        if not self.path or self.new == self.old:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.new, fh)
            os.replace(tmp, self.path)
            _prune(os.path.dirname(self.path))
        except OSError:
            pass  # read-only home (an image): the next run hashes again


def _prune(folder: str) -> None:
    """Keep the newest SAMPLE_CACHE_KEEP files: tests audit many throwaway venvs."""
    entries = sorted(os.scandir(folder), key=lambda e: e.stat().st_mtime, reverse=True)
    for entry in entries[SAMPLE_CACHE_KEEP:]:
        os.unlink(entry.path)


def record_hash(path: str) -> str:
    """Full-content hash in RECORD's format (sha256=<urlsafe b64, no padding>)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_environment() -> dict[str, str]:
    """Same keys as packaging.markers.default_environment(), without packaging."""
    impl = sys.implementation
    iv = impl.version
    impl_version = f"{iv.major}.{iv.minor}.{iv.micro}"
    if iv.releaselevel != "final":
        impl_version += iv.releaselevel[0] + str(iv.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": impl_version,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def read_record(dist: importlib.metadata.Distribution) -> list[tuple[str, str, int | None]]:
    text = dist.read_text("RECORD") or ""
    rows = []
    for row in csv.reader(text.splitlines()):
        if not row or not row[0]:
            continue
        size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
        rows.append((row[0], row[1] if len(row) > 1 else "", size))
    return rows


def _direct_url(dist: importlib.metadata.Distribution) -> dict[str, Any]:
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return {}
    return direct if isinstance(direct, dict) else {}


def wheel_identity(dist: importlib.metadata.Distribution) -> dict[str, Any]:
    """What tells two builds of one version apart: the WHEEL file's tags and build
    number, and the archive hash where the installer recorded one (direct_url.json;
    uv and pip write it for URL and path installs, not for index installs)."""
    tags, build = [], None
    for line in (dist.read_text("WHEEL") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Tag":
            tags.append(value.strip())
        elif key.strip() == "Build":
            build = value.strip()
    direct = _direct_url(dist)
    archive = direct.get("archive_info", {}) if isinstance(direct.get("archive_info"), dict) else {}
    hashes = dict(archive.get("hashes") or {})
    if not hashes and "=" in str(archive.get("hash", "")):
        algo, _, value = str(archive["hash"]).partition("=")
        hashes[algo] = value
    return {
        "wheel_tags": tags,
        "wheel_build": build,
        "archive_hashes": hashes,
        "direct_url": direct.get("url"),
        "editable": bool((direct.get("dir_info") or {}).get("editable")),
    }


def torch_version_info(site_dir: str) -> dict[str, object]:
    """Literal assignments of torch/version.py, read without importing torch."""
    path = os.path.join(site_dir, "torch", "version.py")
    info: dict[str, object] = {"path": path}
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError) as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        return info
    for node in tree.body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            try:
                info[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return info


def content_owner(full: str, size: int, claimants: list[dict]) -> str | None:
    """Which claimant's RECORD entry the file on disk matches (last writer wins)."""
    by_size = [c for c in claimants if c["size"] == size]
    if len(by_size) == 1:
        return by_size[0]["name"]
    if by_size and len({c["hash"] for c in by_size}) > 1:
        digest = record_hash(full)  # rare: only colliding files of equal size
        for c in by_size:
            if c["hash"] == digest:
                return c["name"]
    return None


def metadata_headers(dist: importlib.metadata.Distribution) -> email.message.Message:
    """`dist.metadata` without its body: importlib parses the whole file, long
    description included (torch's is 50k lines), on every access; the headers end
    at the first empty line, so parsing only them gives the same values."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or dist.read_text("") or ""
    return email.parser.HeaderParser().parsestr(HEADER_END.split(text, 1)[0])


def collect_distributions(samples: SampleCache | None = None) -> dict[str, Any]:
    dists: list[dict[str, Any]] = []
    # path -> [(name, version, RECORD hash, RECORD size)]: tuples, one per RECORD row
    # (28k for a torch env), made dicts only for the few paths two distributions claim
    claims: dict[str, list[tuple]] = {}
    stats: dict[str, int] = {}
    lib_stats: dict[str, os.stat_result] = {}
    for dist in importlib.metadata.distributions():
        meta = metadata_headers(dist)
        name, version = meta["Name"], meta["Version"]
        site_dir = str(dist.locate_file(""))
        info_dir = str(getattr(dist, "_path", ""))
        entry: dict[str, Any] = {
            "name": name,
            "canonical": canonical(name) if name else None,
            "version": version,
            "site_dir": site_dir,
            "dist_info": info_dir,
            "installer": (dist.read_text("INSTALLER") or "").strip(),
            # its own pins on other distributions (torchvision's torch==X): the ABI pairs
            "requires": list(meta.get_all("Requires-Dist") or []),
            **wheel_identity(dist),
        }
        missing: list[str] = []
        libs: list[str] = []
        nvidia_dirs: set[str] = set()
        # Files changed in place (verify.py): a size other than RECORD's is proof; the
        # digest of every (path, size, mtime) tells a later run, in one comparison per
        # distribution, whether anything changed since `doctor --verify` hashed it all.
        resized: list[list] = []
        stat_lines: list[str] = []
        base = os.path.normpath(site_dir)
        base = "" if base == "/" else base
        rows = read_record(dist)
        for rel, digest, size in rows:
            # Byte-code caches are optional and recreated on demand: not holes.
            if "__pycache__" in rel or rel.endswith(".pyc"):
                continue
            # what normpath would change: "." or ".." parts (../../bin/x), "//", a leading
            # or trailing "/" (the test is wider than that: a name ending in "." is rare)
            if "./" in rel or "//" in rel or rel.endswith(("/", ".")) or rel.startswith("/"):
                full = os.path.normpath(os.path.join(site_dir, rel))
            else:  # what normpath(join()) gives, without its cost on every row
                full = base + "/" + rel
            if rel.startswith("nvidia/"):
                parts = rel.split("/")
                if len(parts) > 2:
                    nvidia_dirs.add("/".join(parts[:2]))
            claim = (name, version, digest, size)
            known = claims.get(full)
            if known is None:
                claims[full] = [claim]
            else:
                known.append(claim)
            try:
                st = os.stat(full)
            except OSError:
                missing.append(rel)
                continue
            stats[full] = st.st_size
            # whole seconds: image layers (tar) may not keep sub-second mtimes
            stat_lines.append(f"{rel}\0{st.st_size}\0{int(st.st_mtime)}\n")
            if size is not None and st.st_size != size:
                resized.append([rel, st.st_size, size])
            if ".so" in rel and is_shared_lib(rel):  # the test first: no call for most rows
                libs.append(rel)
                lib_stats[full] = st
        stat_digest = hashlib.sha256("".join(stat_lines).encode()).hexdigest()
        entry.update(n_files=len(rows), missing=missing, libs=libs, nvidia_dirs=sorted(nvidia_dirs))
        entry.update(resized=resized, stat_digest=stat_digest)
        dists.append(entry)
    samples = samples or SampleCache(None)
    found = _libraries_and_collisions(dists, claims, stats, lib_stats, samples)
    return {"distributions": dists, **found}


def _claim(c: tuple) -> dict[str, Any]:
    return {"name": c[0], "version": c[1], "hash": c[2], "size": c[3]}


def _libraries_and_collisions(
    dists: list, claims: dict, stats: dict, lib_stats: dict, samples: SampleCache
) -> dict[str, Any]:
    libraries: dict[str, dict] = {}
    for d in dists:
        for rel in d["libs"]:
            full = os.path.normpath(os.path.join(d["site_dir"], rel))
            if full in libraries:
                continue
            owners = sorted({c[0] for c in claims[full]})
            libraries[full] = {
                "rel": rel,
                "size": stats[full],
                "sha256_sampled": samples.sha(full, lib_stats[full]),
                "owners": owners,
                "content_owner": owners[0] if len(owners) == 1 else None,
            }
    collisions = []
    for full, rows in claims.items():
        if len(rows) < 2:
            continue
        names = {canonical(c[0]) for c in rows if c[0]}
        # One distribution listing a file twice is no collision, nor are namespace
        # files such as nvidia/__init__.py that every claimant ships identically.
        if len(names) < 2 or len({c[2] for c in rows}) < 2:
            continue
        claimants = [_claim(c) for c in rows]
        on_disk = stats.get(full)
        owner = content_owner(full, on_disk, claimants) if on_disk is not None else None
        if full in libraries:
            libraries[full]["content_owner"] = owner
        collisions.append(
            {"path": full, "claimants": claimants, "size_on_disk": on_disk, "content_owner": owner}
        )
    return {"libraries": libraries, "collisions": collisions}


def loader_paths(lib_names: set[str]) -> dict[str, Any]:
    """Other copies of the env's libraries the dynamic loader could pick instead."""
    found: dict[str, list[dict]] = {"ld_library_path": [], "ld_preload": [], "ldconfig": []}
    for d in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        for name in sorted(lib_names):
            path = os.path.join(d, name)
            if os.path.isfile(path):
                size = os.path.getsize(path)
                found["ld_library_path"].append(
                    {
                        "dir": d,
                        "name": name,
                        "size": size,
                        "sha256_sampled": sampled_sha256(path, size),
                    }
                )
    for item in re.split(r"[:\s]+", os.environ.get("LD_PRELOAD", "")):
        if item:
            found["ld_preload"].append({"path": item, "name": os.path.basename(item)})
    for exe in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in out.splitlines():
            m = re.match(r"\s+(\S+) \(.*\) => (\S+)$", line)
            if m and m.group(1) in lib_names:
                found["ldconfig"].append({"name": m.group(1), "path": m.group(2)})
        break
    return found


def collect(sample_cache: str | None = None) -> dict[str, Any]:
    samples = SampleCache(sample_cache)
    data = collect_distributions(samples)
    samples.save()
    torch_dist = next((d for d in data["distributions"] if d["canonical"] == "torch"), None)
    spec = importlib.util.find_spec("dflash")
    data["interpreter"] = {
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "version": platform.python_version(),
        "implementation": sys.implementation.name,
        "machine": platform.machine(),
        "platform": sys.platform,
        "libc": "-".join(platform.libc_ver()),
        "site_dirs": sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}),
        "marker_environment": marker_environment(),
        "dflash_origin": spec.origin if spec and spec.origin else None,
    }
    data["torch"] = torch_version_info(torch_dist["site_dir"]) if torch_dist else None
    data["variables"] = {k: v for k, v in os.environ.items() if k.startswith(VAR_PREFIXES)}
    lib_names = {os.path.basename(p) for p in data["libraries"]}
    data["loader"] = loader_paths(lib_names)
    return data


if __name__ == "__main__":
    print(MARKER + json.dumps(collect(sys.argv[1] if len(sys.argv) > 1 else None)))
