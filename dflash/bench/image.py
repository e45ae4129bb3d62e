"""Run the benchmark inside an image and key the record by the image itself.

Preferred: a container started through the Docker Engine API (the `docker` package,
against $DOCKER_HOST or the default socket; podman's `podman system service` socket
works too), with every GPU for a CUDA workload. Only where no engine answers, or the
engine answers but cannot start a container (a sandbox whose OCI runtime fails), does
`--engine auto` fall back to `buildah from` + `buildah run --isolation=chroot`, which
runs a command in the image's filesystem without a container runtime. Either way the
image's own `dflash bench run --emit` measures and prints its record; this side adds
the image id, digest and labels read from the engine, sets the environment key to the
image id, records which runner ran it and why (`runner_reason`), and stores and
compares the record like any other.
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


def attach_image(
    rec: dict[str, Any], info: dict[str, Any], runner: str, reason: str
) -> dict[str, Any]:
    env = rec["environment"]
    env.update(kind="image", key=info["id"], runner=runner, runner_reason=reason, image=info)
    return rec


def wants_gpus(workload: str) -> bool:
    from dflash.bench.workloads import WORKLOADS

    return WORKLOADS[workload].device == "cuda"


class CannotStartContainer(RuntimeError):
    """The engine answered but could not create or start the container."""


# ------------------------------------------------------------------ Docker Engine API
def engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or "the default Docker socket"


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


def engine_name(client) -> str:
    """E.g. "Podman Engine 4.3.1" or "Engine 27.1.0" (Docker), for the record."""
    try:
        version = client.version()
    except Exception:  # noqa: BLE001 - the name is informative only
        return "unknown engine"
    parts = [f"{c.get('Name')} {c.get('Version')}" for c in version.get("Components") or []]
    return parts[0] if parts else f"engine {version.get('Version')}"


def docker_image_info(client, ref: str) -> dict[str, Any]:
    img = client.images.get(ref)
    return {
        "ref": ref,
        "id": img.id,
        "digest": (img.attrs.get("RepoDigests") or [None])[0],
        "tags": img.tags,
        "labels": img.labels or {},
    }


def docker_run_kwargs(command: list[str], env: dict[str, str], gpus: bool) -> dict[str, Any]:
    from docker.types import DeviceRequest

    kwargs: dict[str, Any] = {
        # The image's entrypoint is `dflash`; the command carries the whole argv.
        "entrypoint": [command[0]],
        "command": command[1:],
        "environment": env,
        # The host's IPC namespace, hence its /dev/shm, for dataloader and NCCL shared
        # memory. No shm_size with it: it sizes a private /dev/shm, and podman refuses
        # the pair ("cannot set shmsize when running in the host IPC Namespace").
        "ipc_mode": "host",
    }
    if gpus:  # Docker without the NVIDIA runtime refuses any GPU request, so only on need
        kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return kwargs


def run_docker(client, args, log: Callable[[str], object]) -> dict[str, Any]:
    import docker.errors

    try:
        info = docker_image_info(client, args.image)
    except docker.errors.ImageNotFound:
        raise RuntimeError(
            f"image {args.image} not found by the engine at {engine_address()}: build it "
            "there (`just build cu128`) or point DOCKER_HOST at the engine that has it"
        ) from None
    kwargs = docker_run_kwargs(inner_command(args), inner_env(info), wants_gpus(args.workload))
    container = None
    try:
        # By id: the record is keyed by this image even if the tag moves meanwhile.
        # Create and start apart, so that a container that cannot start is removed.
        container = client.containers.create(info["id"], **kwargs)
        container.start()
    except docker.errors.APIError as exc:
        if container is not None:
            container.remove(force=True)
        raise CannotStartContainer(
            f"the engine at {engine_address()} could not start a container: {exc}"
        ) from exc
    try:
        for chunk in container.logs(stream=True, stdout=False, stderr=True):
            log(chunk.decode(errors="replace").rstrip())
        status = container.wait(timeout=TIMEOUT_S)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
    finally:
        container.remove(force=True)
    if status.get("StatusCode") != 0:
        raise RuntimeError(f"in-image bench exited {status.get('StatusCode')}:\n{out[-3000:]}")
    reason = f"a container started through the Docker Engine API at {engine_address()}"
    return attach_image(parse_record(out), info, "docker-api", f"{reason} ({engine_name(client)})")


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


def run_buildah(args, log: Callable[[str], object], reason: str) -> dict[str, Any]:
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
    return attach_image(parse_record(proc.stdout), info, "buildah-chroot", reason)


def run_in_image(args: argparse.Namespace, log: Callable[[str], object]) -> dict[str, Any]:
    """`--engine docker`: a container or an error. `buildah`: the chroot runner.
    `auto`: a container where one can start, else buildah, saying why in the record."""
    if args.engine == "buildah":
        return run_buildah(args, log, "--engine buildah")
    client = docker_client()
    if client is None:
        why = f"no Docker Engine API answers at {engine_address()}"
        if args.engine == "docker":
            raise RuntimeError(f"{why}: start the engine or set DOCKER_HOST to its socket")
    else:
        try:
            return run_docker(client, args, log)
        except CannotStartContainer as exc:
            if args.engine == "docker":
                raise
            why = str(exc)
    if shutil.which("buildah") is None:
        raise RuntimeError(f"{why}, and buildah is not installed: cannot run in an image")
    log(f"{why}: falling back to buildah run --isolation=chroot")
    return run_buildah(args, log, f"fallback: {why}")
