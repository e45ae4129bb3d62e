"""Read an image's baked manifest and its labels without starting it.

Three readers, chosen by what the host has (the same engine rule as images/build.py):
  docker   the Docker Engine API (the `docker` package, also podman's compatible
           socket): labels from the image's inspect data, the file through a container
           that is created and never started (`get_archive`), removed at once
  podman   `podman image mount` (rootless: inside `podman unshare`), read, unmount
  buildah  `buildah from` + `buildah mount` (rootless: inside `buildah unshare`)
The manifest sits at `<VIRTUAL_ENV>/share/dflash/manifest.json`, VIRTUAL_ENV taken
from the image's configuration (the Dockerfile sets /opt/venv).

Run as `python -m dflash.envcheck.image_read TOOL IMAGE_ID PATH` it prints that file;
that is how a rootless user reads it inside the engine's user namespace.
"""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .paths import manifest_path

DEFAULT_PREFIX = "/opt/venv"  # when the image's configuration sets no VIRTUAL_ENV
READERS = ("docker", "podman", "buildah")
TIMEOUT_S = 300
MAX_LINKS = 40  # symlink hops while resolving a path inside an image's root


class BadInput(ValueError):
    """An input that names nothing usable; the message names it."""

    def __init__(self, ref: str, why: str):
        super().__init__(f"{ref!r}: {why}")
        self.ref = ref


@dataclass
class ImageInfo:
    ref: str
    id: str
    labels: dict[str, str]
    prefix: str
    reader: str
    tags: list[str] = field(default_factory=list)


def _prefix(env: list[str] | None) -> str:
    for item in env or []:
        if item.startswith("VIRTUAL_ENV="):
            return item.split("=", 1)[1] or DEFAULT_PREFIX
    return DEFAULT_PREFIX


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def choose_reader(choice: str = "auto") -> str:
    """`choice` if given, else DFLASH_ENGINE, else docker where its API answers,
    else podman, else buildah."""
    if choice == "auto":
        choice = os.environ.get("DFLASH_ENGINE", "").strip() or "auto"
    if choice not in ("auto", *READERS):
        raise RuntimeError(f"engine {choice!r}: one of auto, {', '.join(READERS)}")
    if choice == "docker" or (choice == "auto" and _docker() is not None):
        if _docker() is None:
            raise RuntimeError("no Docker Engine API answers (start dockerd or set DOCKER_HOST)")
        return "docker"
    for tool in READERS[1:] if choice == "auto" else (choice,):
        if shutil.which(tool):
            return tool
    wanted = "podman, buildah or docker" if choice == "auto" else choice
    raise RuntimeError(f"no container engine found: install {wanted}")


@functools.cache
def _docker():
    from dflash.bench.image import docker_client

    return docker_client()


# ---------------------------------------------------------------- inspect
def inspect(ref: str, reader: str) -> ImageInfo:
    """Id, labels and environment prefix of `ref`; BadInput if there is no such image."""
    if reader == "docker":
        import docker.errors

        try:
            img = _docker().images.get(ref)
        except docker.errors.ImageNotFound:
            raise BadInput(ref, "no such image (Docker Engine API)") from None
        except docker.errors.APIError as exc:
            raise BadInput(ref, f"not an image: {_last_line(str(exc))}") from None
        cfg = img.attrs.get("Config") or {}
        return ImageInfo(
            ref, img.id, img.labels or {}, _prefix(cfg.get("Env")), reader, list(img.tags)
        )
    cmd = (
        ["podman", "image", "inspect", ref]
        if reader == "podman"
        else ["buildah", "inspect", "--type", "image", ref]
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise BadInput(ref, f"no such image ({cmd[0]}: {_last_line(proc.stderr)})")
    data = json.loads(proc.stdout)
    if reader == "podman":
        data = data[0]
        cfg = data.get("Config") or {}
        return ImageInfo(
            ref,
            "sha256:" + data["Id"].removeprefix("sha256:"),
            cfg.get("Labels") or {},
            _prefix(cfg.get("Env")),
            reader,
            list(data.get("RepoTags") or []),
        )
    cfg = (data.get("OCIv1") or {}).get("config") or {}
    return ImageInfo(
        ref,
        "sha256:" + data["FromImageID"],
        cfg.get("Labels") or {},
        _prefix(cfg.get("Env")),
        reader,
        [t for t in [data.get("FromImage")] if t],
    )


# ------------------------------------------------------------------- read
def resolve_in_root(root: Path, path: str) -> Path:
    """`path` inside the image mounted at `root`, following symlinks the way the
    image's own processes would: an absolute link target stays inside `root`."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = done[:-1]
            continue
        if part == ".":
            continue
        here = root.joinpath(*done, part)
        if here.is_symlink():
            hops += 1
            if hops > MAX_LINKS:
                raise OSError(f"too many symlinks resolving {path}")
            target = os.readlink(here)
            if target.startswith("/"):
                done = []
            parts = [p for p in target.split("/") if p] + parts
            continue
        done.append(part)
    return root.joinpath(*done)


def _read_mounted(root: str, path: str) -> bytes:
    return resolve_in_root(Path(root), path).read_bytes()


def read_mounted(tool: str, image_id: str, path: str) -> bytes:
    """Mount the image's root with `tool`, read `path`, unmount. Needs the engine's
    mount namespace: root, or inside `podman unshare` / `buildah unshare`."""
    if tool == "podman":
        root = _check(["podman", "image", "mount", image_id])
        try:
            return _read_mounted(root, path)
        finally:
            subprocess.run(["podman", "image", "unmount", image_id], capture_output=True)
    container = _check(["buildah", "from", "--pull-never", "--quiet", image_id])
    try:
        return _read_mounted(_check(["buildah", "mount", container]), path)
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True)  # also unmounts


def _check(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])}: {_last_line(proc.stderr)}")
    return proc.stdout.strip().splitlines()[-1]


def _read_unshared(tool: str, image_id: str, path: str) -> bytes:
    cmd = [tool, "unshare", sys.executable, "-m", __name__, tool, image_id, path]
    proc = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT_S)
    if proc.returncode == 3:
        raise FileNotFoundError(path)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} unshare: {_last_line(proc.stderr.decode(errors='replace'))}")
    return proc.stdout


def _read_docker(image_id: str, path: str) -> bytes:
    import docker.errors

    client = _docker()
    # Created, never started: the entrypoint only has to satisfy the API.
    container = client.containers.create(image_id, entrypoint=["/dflash-never-started"])
    try:
        stream, _ = container.get_archive(path)
        blob = b"".join(stream)
    except docker.errors.NotFound:
        raise FileNotFoundError(path) from None
    finally:
        container.remove(force=True)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        member = tar.next()
        if member is None or not member.isfile():
            raise FileNotFoundError(path)
        fh = tar.extractfile(member)
        if fh is None:
            raise FileNotFoundError(path)
        return fh.read()


def read_file(info: ImageInfo, path: str) -> bytes:
    if info.reader == "docker":
        return _read_docker(info.id, path)
    if os.geteuid() == 0:
        return read_mounted(info.reader, info.id, path)
    return _read_unshared(info.reader, info.id, path)


def image_manifest(info: ImageInfo) -> dict[str, Any]:
    path = str(manifest_path(info.prefix))
    try:
        blob = read_file(info, path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise BadInput(
            info.ref, f"has no dflash manifest at {path} (not a dflash image: `just build`)"
        ) from None
    try:
        data = json.loads(blob)
    except ValueError as exc:
        raise BadInput(info.ref, f"its manifest {path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or "fingerprint" not in data:
        raise BadInput(info.ref, f"its manifest {path} has no fingerprint")
    return data


def _main(argv: list[str]) -> int:
    tool, image_id, path = argv
    try:
        sys.stdout.buffer.write(read_mounted(tool, image_id, path))
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
