"""Bisect between two images: GOOD's container with a subset of BAD's differences.

The differences are read by each image's own interpreter inside a container of it
(envsplice's listing script): distributions added, removed or at another version or
build, plus the speed-relevant variables baked into each image's ENV. A subset is
measured in a container started from GOOD, never from a derived image: before the
container starts, a tar with a plan and the chosen distributions' files from BAD is
put into it (the Docker Engine API's archive endpoint); its first process, a short
Python prelude, unlinks GOOD's files of the removed and changed distributions, unpacks
BAD's, sets and unsets the chosen variables and then execs `dflash bench worker`, so
the repeat itself is a fresh interpreter of the spliced environment with its site
hooks, exactly as a training process would be. The container is removed afterwards:
GOOD's image is never written.

BAD's files are taken once per bisection: one container of BAD writes a tar per
distribution in the difference, which is copied out of it to the host.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dflash.bench.envsplice import _LIST_SCRIPT, VAR, Change, SpliceError
from dflash.bench.image_env import WORKER, ImageEnv, run_container

SPLICE_DIR = "/tmp/dflash-splice"  # where the plan and the bundles go inside GOOD's container
BUNDLE_DIR = "/tmp/dflash-bundles"  # where BAD's container writes them

# The container's first process (argv: plan, then the command to exec). Python's own
# tarfile: the images have no guarantee of a tar binary.
PRELUDE = r"""
import json, os, sys, tarfile
plan = json.load(open(sys.argv[1]))
for path in plan["remove"]:
    try:
        os.unlink(path)
    except FileNotFoundError:
        continue
    try:
        os.removedirs(os.path.dirname(path))  # an empty .dist-info would still be a dist
    except OSError:
        pass
for bundle in plan["bundles"]:
    with tarfile.open(bundle) as tf:
        tf.extractall("/")
for name in plan["unset"]:
    os.environ.pop(name, None)
os.environ.update(plan["set"])
os.execvp(sys.argv[2], sys.argv[2:])
"""

# Run in BAD's container: one tar per named distribution, of its RECORD's files.
_BUNDLE_SCRIPT = r"""
import json, os, sys, tarfile
want = json.loads(sys.argv[1])
os.makedirs(sys.argv[2], exist_ok=True)
for name, files in want.items():
    with tarfile.open(os.path.join(sys.argv[2], name + ".tar"), "w") as tf:
        for f in files:
            if os.path.lexists(f):
                tf.add(f, arcname=f.lstrip("/"), recursive=False)
"""


@dataclass(frozen=True)
class ImageSide:
    """One end of an image bisection: the image, its client and its variables."""

    info: dict[str, Any]
    variables: dict[str, str]
    origin: str
    client: Any = field(compare=False, repr=False)


def image_variables(client, image_id: str) -> dict[str, str]:
    """The speed-relevant variables baked into the image's ENV."""
    from dflash.bench.worker import relevant_variables

    config = client.images.get(image_id).attrs.get("Config") or {}
    env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
    return relevant_variables(env)


def resolve_image(ref: str, extra_vars: dict[str, str], origin: str | None = None) -> ImageSide:
    from dflash.bench.image import docker_client, docker_image_info, engine_address

    client = docker_client()
    if client is None:
        raise SpliceError(
            f"{ref}: not a venv, an interpreter or a record id, and no Docker Engine API "
            f"answers at {engine_address()} to look it up as an image (start the engine, "
            "or `podman system service`, and set DOCKER_HOST to its socket)"
        )
    try:
        info = docker_image_info(client, ref)
    except Exception as exc:  # noqa: BLE001 - docker.errors.* or a bad reference
        raise SpliceError(
            f"{ref}: not a venv, an interpreter, a record id or an image on this host ({exc})"
        ) from None
    variables = {**image_variables(client, info["id"]), **extra_vars}
    return ImageSide(info, variables, origin or f"image {ref} ({info['id'][:19]})", client)


def image_inventory(side: ImageSide, timeout: float = 600) -> dict:
    """envsplice.inventory, run by the image's own interpreter in a container of it."""
    code, out, err = run_container(
        side.client, side.info["id"], ["python", "-I", "-c", _LIST_SCRIPT], {}, False, timeout
    )
    if code != 0:
        raise SpliceError(f"{side.origin}: cannot list its distributions: {err.strip()[-300:]}")
    return json.loads(out.strip().splitlines()[-1])


def _abs_files(inv: dict, name: str) -> list[str]:
    import posixpath

    site = inv["site"]
    return [posixpath.normpath(posixpath.join(site, f)) for f in inv["dists"][name]["files"]]


def fetch_bundles(bad: ImageSide, inv: dict, changes: list[Change], dest: Path) -> Path:
    """One tar per added or changed distribution, of BAD's files, copied to `dest`."""
    want = {c.name: _abs_files(inv, c.name) for c in changes if c.kind in ("added", "changed")}
    dest.mkdir(parents=True, exist_ok=True)
    if not want:
        return dest
    cmd = ["python", "-I", "-c", _BUNDLE_SCRIPT, json.dumps(want), BUNDLE_DIR]
    outer_tar = dest / "from-bad.tar"  # streamed to disk: a changed torch is gigabytes

    def copy_out(container) -> None:
        stream, _ = container.get_archive(BUNDLE_DIR)
        with open(outer_tar, "wb") as f:
            for chunk in stream:
                f.write(chunk)

    code, _, err = run_container(
        bad.client, bad.info["id"], cmd, {}, False, 1800, after_exit=copy_out
    )
    if code != 0 or not outer_tar.exists():
        raise SpliceError(f"{bad.origin}: cannot pack its distributions: {err.strip()[-300:]}")
    with tarfile.open(outer_tar) as outer:
        for member in outer.getmembers():
            name = Path(member.name).name
            if member.isfile() and name.endswith(".tar") and name[:-4] in want:
                data = outer.extractfile(member)
                assert data is not None
                with open(dest / name, "wb") as f:
                    shutil.copyfileobj(data, f)
    outer_tar.unlink()
    missing = sorted(set(want) - {p.stem for p in dest.glob("*.tar")})
    if missing:
        raise SpliceError(f"{bad.origin}: no files came back for {', '.join(missing)}")
    return dest


def splice_archive(
    good_inv: dict, changes: list[Change], bundles: Path, variables: dict[str, str],
    unset: list[str], dest: Path,
) -> Path:  # fmt: skip
    """The tar put into GOOD's container, written to `dest`: the plan and the chosen
    bundles (a file, not bytes: a changed torch is gigabytes)."""
    dists = [c for c in changes if not c.name.startswith(VAR)]
    remove = [
        f for c in dists if c.kind in ("removed", "changed") for f in _abs_files(good_inv, c.name)
    ]
    chosen = [c.name for c in dists if c.kind in ("added", "changed")]
    plan = {
        "remove": remove,
        "bundles": [f"{SPLICE_DIR}/{n}.tar" for n in chosen],
        "set": variables,
        "unset": unset,
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, mode="w") as tf:
        data = json.dumps(plan).encode()
        info = tarfile.TarInfo(SPLICE_DIR.lstrip("/") + "/plan.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
        for n in chosen:
            tf.add(bundles / f"{n}.tar", arcname=f"{SPLICE_DIR.lstrip('/')}/{n}.tar")
    return dest


def spliced_env(good: ImageEnv, archive: Path, label: str, origin: str) -> ImageEnv:
    """GOOD's image, with the archive put in before its prelude runs the worker."""
    command = ["python", "-I", "-c", PRELUDE, f"{SPLICE_DIR}/plan.json", *WORKER]
    return replace(good, label=label, command=command, archive=archive, origin_text=origin)


def check_same_prefix(good_inv: dict, bad_inv: dict) -> None:
    if good_inv["prefix"] != bad_inv["prefix"] or good_inv["site"] != bad_inv["site"]:
        raise SpliceError(
            f"GOOD's environment is at {good_inv['prefix']} and BAD's at {bad_inv['prefix']}: "
            "splicing between images needs the same venv path in both"
        )
