"""Run the benchmark inside an image and key the record by the image itself.

Preferred: the Docker Engine API (the `docker` package; podman's compatible socket
works too), a container with every GPU. Where the host cannot start containers (a
rootless sandbox where the OCI runtime fails), fall back to `buildah from` +
`buildah run --isolation=chroot`, which runs a command in the image's filesystem
without a container runtime. Either way the image's own `dflash bench run --emit`
measures and prints its record; this side adds the image id, digest and labels read
from the engine, sets the environment key to the image id, says which runner was
used, and stores and compares the record like any other.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

MARKER = "DFLASH_BENCH_RECORD:"
TIMEOUT_S = 4 * 3600


def inner_command(args: argparse.Namespace) -> list[str]:
    """The bench command inside the image (its entrypoint is `dflash`)."""
    cmd = ["dflash", "bench", "run", "--workload", args.workload, "--emit"]
    if args.repeats:
        cmd += ["--repeats", str(args.repeats)]
    return cmd


def inner_env(info: dict[str, Any]) -> dict[str, str]:
    labels = info.get("labels") or {}
    env = {"DFLASH_IMAGE_KEY": info["id"]}
    if labels.get("org.opencontainers.image.revision"):
        env["DFLASH_GIT_REVISION"] = labels["org.opencontainers.image.revision"]
    return env


def parse_record(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    raise RuntimeError("the in-image bench printed no record:\n" + output[-3000:])


def attach_image(rec: dict[str, Any], info: dict[str, Any], runner: str) -> dict[str, Any]:
    env = rec["environment"]
    env.update(kind="image", key=info["id"], runner=runner, image=info)
    return rec


# ------------------------------------------------------------------ Docker Engine API
def docker_client():
    """A client for $DOCKER_HOST / the default socket, or None if none answers."""
    try:
        import docker
    except ImportError:
        return None
    try:
        client = docker.from_env()
        client.ping()
        return client
    except Exception:  # noqa: BLE001 - any failure to reach the engine means "no engine"
        return None


def docker_image_info(client, ref: str) -> dict[str, Any]:
    img = client.images.get(ref)
    return {
        "ref": ref,
        "id": img.id,
        "digest": (img.attrs.get("RepoDigests") or [None])[0],
        "tags": img.tags,
        "labels": img.labels or {},
    }


def docker_run_kwargs(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    from docker.types import DeviceRequest

    return {
        # The image's entrypoint is `dflash`; the command carries the whole argv.
        "entrypoint": [command[0]],
        "command": command[1:],
        "environment": env,
        "device_requests": [DeviceRequest(count=-1, capabilities=[["gpu"]])],  # all GPUs
        "shm_size": "16g",  # dataloader and NCCL shared memory
        "ipc_mode": "host",
        "detach": True,
    }


def run_docker(client, args, log: Callable[[str], object]) -> dict[str, Any]:
    info = docker_image_info(client, args.image)
    kwargs = docker_run_kwargs(inner_command(args), inner_env(info))
    container = client.containers.run(args.image, **kwargs)
    try:
        for chunk in container.logs(stream=True, stdout=False, stderr=True):
            log(chunk.decode(errors="replace").rstrip())
        status = container.wait(timeout=TIMEOUT_S)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
    finally:
        container.remove(force=True)
    if status.get("StatusCode") != 0:
        raise RuntimeError(f"in-image bench exited {status.get('StatusCode')}:\n{out[-3000:]}")
    return attach_image(parse_record(out), info, "docker-api")


# ----------------------------------------------------------------- buildah fallback
def buildah_image_info(ref: str) -> dict[str, Any]:
    out = subprocess.run(
        ["buildah", "inspect", "--type", "image", ref],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    data = json.loads(out)
    oci = data.get("OCIv1") or {}
    return {
        "ref": ref,
        "id": "sha256:" + data["FromImageID"],
        "digest": data.get("FromImageDigest"),
        "tags": [t for t in [data.get("FromImage")] if t],  # empty when run by id
        "labels": (oci.get("config") or {}).get("Labels") or {},
    }


def buildah_run_command(container: str, command: list[str], env: dict[str, str]) -> list[str]:
    cmd = ["buildah", "run", "--isolation=chroot"]
    for k, v in sorted(env.items()):
        cmd += ["--env", f"{k}={v}"]
    # No container runtime to inject GPUs: pass the host's NVIDIA device nodes through.
    for dev in sorted(glob.glob("/dev/nvidia*")):
        if not os.path.isdir(dev):
            cmd += ["--device", dev]
    return [*cmd, container, "--", *command]


def run_buildah(args, log: Callable[[str], object]) -> dict[str, Any]:
    info = buildah_image_info(args.image)
    container = subprocess.run(
        ["buildah", "from", "--pull-never", args.image],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout.strip()  # fmt: skip
    try:
        cmd = buildah_run_command(container, inner_command(args), inner_env(info))
        log("running: " + " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        log(proc.stderr.rstrip())
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"in-image bench exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return attach_image(parse_record(proc.stdout), info, "buildah-chroot")


def run_in_image(args: argparse.Namespace, log: Callable[[str], object]) -> dict[str, Any]:
    client = docker_client() if args.engine in ("auto", "docker") else None
    if client is not None:
        return run_docker(client, args, log)
    if args.engine == "docker":
        raise RuntimeError("no Docker Engine API answers (install `docker`, set DOCKER_HOST)")
    if shutil.which("buildah") is None:
        raise RuntimeError("no Docker Engine API and no buildah: cannot run in an image")
    log("no Docker Engine API reachable: falling back to buildah run --isolation=chroot")
    return run_buildah(args, log)
