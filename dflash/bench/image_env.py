"""Repeats inside images, for paired image runs: one container per repeat.

`dflash bench run --image CANDIDATE` measures the candidate inside its image (image.py)
and then, when the accepted baseline was an image run whose image is still on this
host (images are content-keyed and kept; `just rmi` refuses to remove a baseline's
image without --force), runs pairs: one repeat in a container of the candidate image,
one in a container of the baseline image, back to back, the order alternating
(runner.run_pairs). Each repeat is `dflash bench worker - -` through the image's own
entrypoint, so a fresh interpreter of that image's environment: the workload comes
in $DFLASH_BENCH_SPEC and the result goes to stdout behind a marker. The containers
are started by the same runner the candidate's own run used (the Docker Engine API,
or buildah's chroot where no container can start).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflash.bench.envs import SPAWN_TIME_ENV
from dflash.bench.image import buildah_run_command, docker_run_kwargs, inner_env

SPEC_ENV = "DFLASH_BENCH_SPEC"
RESULT_MARKER = "DFLASH_BENCH_REPEAT:"
WORKER = ["dflash", "bench", "worker", "-", "-"]


def parse_result(output: str) -> dict[str, Any] | None:
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    return None


@dataclass(frozen=True)
class ImageEnv:
    info: dict[str, Any]  # image.py's image info: id, tags, labels
    label: str
    runner: str  # "docker-api" | "buildah-chroot"
    gpus: bool = False
    client: Any = field(default=None, compare=False, repr=False)
    # What the container runs (through the image's entrypoint unless it is overridden
    # by command[0]); image_bisect.py runs a splicing prelude first.
    command: list[str] = field(default_factory=lambda: list(WORKER))
    variables: dict[str, str] = field(default_factory=dict)  # set on top of the image's ENV
    archive: Path | None = None  # a tar put into the container at / before it starts
    origin_text: str | None = None

    @property
    def origin(self) -> str:
        if self.origin_text:
            return self.origin_text
        return (
            f"image {self.info['id'][:19]} ({', '.join(self.info.get('tags') or []) or 'untagged'})"
        )

    @property
    def where(self) -> str:
        return self.origin

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "origin": self.origin,
            "image": self.info,
            "runner": self.runner,
        }

    def _env(self, spec: Path) -> dict[str, str]:
        return {
            **inner_env(self.info),
            **self.variables,
            SPEC_ENV: spec.read_text(),
            SPAWN_TIME_ENV: repr(time.time()),
        }

    def run(self, spec: Path, out: Path, timeout: float) -> int:
        if self.runner == "docker-api":
            code, stdout, stderr = self._docker(spec, timeout)
        elif self.archive is not None:
            raise RuntimeError(f"{self.origin}: a spliced environment needs the Docker Engine API")
        else:
            code, stdout, stderr = self._buildah(spec, timeout)
        sys.stderr.write(stderr)
        result = parse_result(stdout)
        if code == 0 and result is not None:
            out.write_text(json.dumps(result))
        elif code == 0:
            sys.stderr.write(f"{self.origin} printed no repeat result (an image built before "
                             "paired runs has no `dflash bench worker`)\n")  # fmt: skip
            return 2
        return code

    def _docker(self, spec: Path, timeout: float) -> tuple[int, str, str]:
        archive = self.archive

        def put(container) -> None:
            if archive is not None:
                with open(archive, "rb") as f:
                    container.put_archive("/", f)

        return run_container(
            self.client, self.info["id"], self.command, self._env(spec), self.gpus, timeout,
            before_start=put,
        )  # fmt: skip

    def _buildah(self, spec: Path, timeout: float) -> tuple[int, str, str]:
        name = subprocess.run(
            ["buildah", "from", "--pull-never", self.info["id"]],
            capture_output=True, text=True, check=True, timeout=600,
        ).stdout.strip()  # fmt: skip
        try:
            proc = subprocess.run(
                buildah_run_command(name, self.command, self._env(spec)),
                capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
            return proc.returncode, proc.stdout, proc.stderr
        finally:
            subprocess.run(["buildah", "rm", name], capture_output=True, timeout=120)


def run_container(
    client,
    image_id: str,
    command: list[str],
    env: dict[str, str],
    gpus: bool,
    timeout: float,
    before_start: Callable[[Any], None] | None = None,
    after_exit: Callable[[Any], None] | None = None,
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `command` in a fresh container of the image,
    removed afterwards whatever happened."""
    container = client.containers.create(image_id, **docker_run_kwargs(command, env, gpus))
    try:
        if before_start is not None:
            before_start(container)
        container.start()
        status = container.wait(timeout=timeout)
        if after_exit is not None:
            after_exit(container)
        logs = container.logs
        return (
            int(status.get("StatusCode", 1)),
            logs(stdout=True, stderr=False).decode(errors="replace"),
            logs(stdout=False, stderr=True).decode(errors="replace"),
        )
    finally:
        container.remove(force=True)


def image_info(runner: str, ref: str, client=None) -> dict[str, Any] | None:
    """The image's info from the runner's engine, or None when it is not on this host."""
    from dflash.bench.image import buildah_image_info, docker_image_info

    try:
        if runner == "docker-api":
            return docker_image_info(client, ref)
        return buildah_image_info(ref)
    except Exception:  # noqa: BLE001 - not found / unreadable: no paired baseline
        return None


def image_pair_envs(
    rec: dict[str, Any], base: dict[str, Any] | None
) -> tuple[ImageEnv, ImageEnv] | str:
    """(candidate, baseline) image environments for `rec`, or why there are none."""
    from dflash.bench.image import docker_client, wants_gpus

    if base is None:
        return "no accepted baseline yet"
    benv = base["environment"]
    if benv.get("kind") != "image" or not (benv.get("image") or {}).get("id"):
        return f"baseline {base['id']} was not an image run"
    runner = rec["environment"]["runner"]
    client = docker_client() if runner == "docker-api" else None
    info = image_info(runner, benv["image"]["id"], client)
    if info is None:
        return f"the baseline's image {benv['image']['id'][:19]} is not on this host any more"
    gpus = wants_gpus(rec["workload"]["name"])
    cand = ImageEnv(rec["environment"]["image"], "candidate", runner, gpus, client)
    return cand, ImageEnv(info, "baseline", runner, gpus, client)
