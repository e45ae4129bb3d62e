"""Paired image runs: the candidate image and the accepted baseline's image, one
container per repeat. Fakes for the decisions; the slow test starts real containers
from the built image (DFLASH_TEST_IMAGE, as tests/test_containers.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_fakes import make_record
from scripts import load_script

from dflash.bench import image_env
from dflash.bench.image_env import RESULT_MARKER, ImageEnv, image_pair_envs


def image_record(image_id: str, runner: str = "docker-api") -> dict:
    rec = make_record([100.0, 101.0])
    info = {"id": image_id, "tags": ["dflash:cu128"], "labels": {}}
    rec["environment"].update(kind="image", key=image_id, runner=runner, image=info)
    return rec


def test_no_pairs_without_an_image_baseline_still_on_the_host(monkeypatch):
    cand = image_record("sha256:" + "c" * 64, runner="buildah-chroot")
    assert image_pair_envs(cand, None) == "no accepted baseline yet"
    host = make_record([1.0, 2.0])
    assert "was not an image run" in image_pair_envs(cand, host)
    monkeypatch.setattr(image_env, "image_info", lambda runner, ref, client=None: None)
    base = image_record("sha256:" + "b" * 64)
    assert "is not on this host any more" in image_pair_envs(cand, base)
    monkeypatch.setattr(image_env, "image_info", lambda runner, ref, client=None: {"id": ref})
    c, b = image_pair_envs(cand, base)
    assert (c.label, b.label, b.info["id"], b.runner) == (
        "candidate",
        "baseline",
        "sha256:" + "b" * 64,
        "buildah-chroot",
    )


class FakeContainer:
    def __init__(self, stdout: str, code: int = 0):
        self.stdout, self.code, self.removed, self.kwargs = stdout, code, False, None

    def start(self):
        pass

    def wait(self, timeout):
        return {"StatusCode": self.code}

    def logs(self, stdout, stderr):
        return (self.stdout if stdout else "worker log\n").encode()

    def remove(self, force):
        self.removed = True


class FakeClient:
    def __init__(self, container):
        self.container = container
        self.containers = self

    def create(self, image, **kwargs):
        self.container.kwargs = dict(kwargs, image=image)
        return self.container


def test_image_repeat_runs_the_worker_by_image_id_and_reads_its_result(tmp_path):
    spec = tmp_path / "w.json"
    spec.write_text('{"name": "tiny-cpu"}')
    box = FakeContainer("noise\n" + RESULT_MARKER + json.dumps({"steps": [1]}) + "\n")
    env = ImageEnv(
        {"id": "sha256:abc", "labels": {}}, "baseline", "docker-api", False, FakeClient(box)
    )
    assert env.run(spec, tmp_path / "out.json", 60) == 0
    assert json.loads((tmp_path / "out.json").read_text()) == {"steps": [1]}
    kw = box.kwargs
    assert kw["image"] == "sha256:abc" and kw["entrypoint"] == ["dflash"]
    assert kw["command"] == ["bench", "worker", "-", "-"] and box.removed
    assert kw["environment"]["DFLASH_BENCH_SPEC"] == '{"name": "tiny-cpu"}'
    silent = ImageEnv(
        {"id": "sha256:abc"}, "baseline", "docker-api", False, FakeClient(FakeContainer(""))
    )
    assert silent.run(spec, tmp_path / "none.json", 60) == 2  # an image without the worker


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DFLASH_TEST_IMAGE"), reason="set DFLASH_TEST_IMAGE")
def test_second_image_run_is_paired_with_the_baseline_image(tmp_path):
    image = os.environ["DFLASH_TEST_IMAGE"]
    cmd = [sys.executable, "-m", "dflash", "bench", "run", "--image", image, "--repeats", "2",
           "--store", str(tmp_path)]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert first.returncode == 0 and "auto-accepted" in first.stdout, first.stderr[-3000:]
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert second.returncode in (0, 1), second.stderr[-3000:]
    rec = json.loads(Path(second.stdout.split("record: ")[1].splitlines()[0]).read_text())
    assert rec["comparison"]["method"] == "paired", second.stdout
    assert rec["paired"]["env"]["image"]["id"] == rec["environment"]["image"]["id"]
    assert len(rec["paired"]["candidate_repeats"]) == len(rec["paired"]["repeats"]) == 2


def test_rmi_refuses_an_accepted_baselines_image_without_force(tmp_path, monkeypatch):
    from dflash.bench.store import Store, baseline_images

    build = load_script(
        Path(__file__).resolve().parents[1] / "images" / "build.py", "dflash_images_build"
    )
    monkeypatch.setenv("DFLASH_BENCH_STORE", str(tmp_path))
    image_id = "sha256:" + "a" * 64
    store = Store(tmp_path)
    rec = image_record(image_id)
    store.add(rec)
    store.accept(rec, reason="test")
    assert list(baseline_images()) == [image_id]
    with pytest.raises(build.BuildError, match="accepted bench baseline of tiny-cpu--cu128--"):
        build.refuse_baseline_images({image_id, "sha256:other"}, force=False)
    build.refuse_baseline_images({image_id}, force=True)
    build.refuse_baseline_images({"sha256:other"}, force=False)
