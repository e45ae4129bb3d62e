"""In-image runs: command construction, record parsing and image keying (no engine)."""

from __future__ import annotations

import argparse
import json

import pytest
from bench_fakes import make_record

from dflash.bench import image

INFO = {
    "ref": "dflash:cu128",
    "id": "sha256:" + "ab" * 32,
    "digest": None,
    "tags": ["localhost/dflash:cu128"],
    "labels": {"org.opencontainers.image.revision": "deadbeef", "dev.dflash.content-key": "k1"},
}


def args(**kw) -> argparse.Namespace:
    return argparse.Namespace(
        **{"workload": "tiny-cpu", "repeats": None, "image": "dflash:cu128", **kw}
    )


def test_inner_command_and_env():
    assert image.inner_command(args(repeats=3)) == [
        "dflash", "bench", "run", "--workload", "tiny-cpu", "--emit", "--repeats", "3",
    ]  # fmt: skip
    env = image.inner_env(INFO)
    assert env == {"DFLASH_IMAGE_KEY": INFO["id"], "DFLASH_GIT_REVISION": "deadbeef"}


def test_buildah_command_runs_chroot_with_env(monkeypatch):
    monkeypatch.setattr(image.glob, "glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidiactl"])
    cmd = image.buildah_run_command("ctr1", ["dflash", "bench"], {"B": "2", "A": "1"})
    assert cmd[:3] == ["buildah", "run", "--isolation=chroot"]
    assert cmd[3:7] == ["--env", "A=1", "--env", "B=2"]
    assert "--device" in cmd and "/dev/nvidia0" in cmd
    assert cmd[-4:] == ["ctr1", "--", "dflash", "bench"]


def test_docker_kwargs_request_all_gpus_only_for_a_cuda_workload():
    pytest.importorskip("docker")
    kw = image.docker_run_kwargs(["dflash", "bench", "run"], {"X": "1"}, gpus=True)
    assert kw["entrypoint"] == ["dflash"] and kw["command"] == ["bench", "run"]
    assert kw["device_requests"][0]["Count"] == -1
    # podman refuses shm_size together with the host IPC namespace
    assert kw["ipc_mode"] == "host" and "shm_size" not in kw
    assert "device_requests" not in image.docker_run_kwargs(["dflash"], {}, gpus=False)
    assert image.wants_gpus("qwen3-8b-1gpu") and not image.wants_gpus("tiny-cpu")


def test_record_is_parsed_from_output_and_keyed_by_image_id():
    rec = make_record([1.0, 2.0])
    out = "noise\n" + image.MARKER + json.dumps(rec) + "\ntrailing\n"
    got = image.attach_image(image.parse_record(out), INFO, "buildah-chroot", "why")
    env = got["environment"]
    assert env["kind"] == "image" and env["key"] == INFO["id"]
    assert env["runner_reason"] == "why"
    assert (
        env["runner"] == "buildah-chroot"
        and env["image"]["labels"]["dev.dflash.content-key"] == "k1"
    )
    with pytest.raises(RuntimeError, match="no record"):
        image.parse_record("nothing here")


def test_falls_back_to_buildah_without_an_engine(monkeypatch):
    reasons = []
    monkeypatch.setattr(image, "docker_client", lambda: None)
    monkeypatch.setattr(image.shutil, "which", lambda name: "/usr/bin/buildah")
    monkeypatch.setattr(image, "run_buildah", lambda a, log, why: reasons.append(why) or {"ok": 1})
    assert image.run_in_image(args(engine="auto"), log=lambda m: None) == {"ok": 1}
    assert reasons[-1].startswith("fallback: no Docker Engine API answers")
    with pytest.raises(RuntimeError, match="no Docker Engine API"):
        image.run_in_image(args(engine="docker"), log=lambda m: None)


def test_falls_back_to_buildah_when_the_engine_cannot_start_a_container(monkeypatch):
    """An engine that answers but whose runtime fails (a sandbox): auto falls back and
    the record says why; --engine docker reports the engine's error instead."""
    reasons = []
    failure = image.CannotStartContainer("the engine at X could not start a container: boom")

    def cannot_start(client, a, log):
        raise failure

    monkeypatch.setattr(image, "docker_client", lambda: object())
    monkeypatch.setattr(image, "run_docker", cannot_start)
    monkeypatch.setattr(image.shutil, "which", lambda name: "/usr/bin/buildah")
    monkeypatch.setattr(image, "run_buildah", lambda a, log, why: reasons.append(why) or {"ok": 1})
    assert image.run_in_image(args(engine="auto"), log=lambda m: None) == {"ok": 1}
    assert reasons == [f"fallback: {failure}"]
    with pytest.raises(image.CannotStartContainer, match="boom"):
        image.run_in_image(args(engine="docker"), log=lambda m: None)
