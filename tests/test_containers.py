"""The built image, started as users start it: `docker run` / `podman run` for real.

Needs the image `just build cu128` made (DFLASH_TEST_IMAGE; `just test-images cu128`
sets it) and an engine that can start containers: docker, or podman (CI's .ci/run sets
up a runtime its sandbox can start containers with). Where no container can start,
these tests skip, unless DFLASH_TEST_CONTAINERS=required (CI), where that fails them.
The bench test also needs a Docker Engine API ($DOCKER_HOST; podman serves one with
`podman system service`). Every container a test starts is removed after it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
TEST_IMAGE = os.environ.get("DFLASH_TEST_IMAGE", "")
REQUIRED = os.environ.get("DFLASH_TEST_CONTAINERS") == "required"
# A non-root user for --user: CI runs as root, so take a uid that is not the caller's.
USER = "1000:1000" if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not TEST_IMAGE, reason="set DFLASH_TEST_IMAGE to a built image (just test-images cu128)"
    ),
]


def _load_build():
    return load_script(ROOT / "images/build.py", "dflash_images_build")


def _unavailable(why: str):
    if REQUIRED:
        pytest.fail(f"DFLASH_TEST_CONTAINERS=required, but {why}")
    pytest.skip(why)


class Engine:
    """The host's engine CLI (images/build.py picks it) and the containers a test made."""

    def __init__(self, name: str):
        self.name = name
        self.made: list[str] = []

    def __call__(self, *args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.name, *args], capture_output=True, text=True, timeout=timeout, **kw
        )

    def new_name(self) -> str:
        name = f"dflash-test-{uuid.uuid4().hex[:10]}"
        self.made.append(name)
        return name

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`ENGINE run --name N ARGS`: named, so that teardown removes it whatever happens."""
        return self("run", "--name", self.new_name(), *args, timeout=timeout)

    def exit_code(self, name: str) -> int:
        r = self("inspect", "--format", "{{.State.ExitCode}}", name, timeout=60)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.strip())

    def cleanup(self) -> list[str]:
        for name in self.made:  # one by one: a missing name (--rm) stops a batch
            self("kill", name, timeout=120)  # rm alone waits out a SIGTERM-deaf process
            self("rm", "--force", name, timeout=120)
        left = self("ps", "--all", "--format", "{{.Names}}", timeout=60).stdout.split()
        return sorted(set(left) & set(self.made))


@pytest.fixture(scope="session")
def engine_name() -> str:
    build = _load_build()
    try:
        name = build.Engine().name
    except build.BuildError as exc:
        _unavailable(str(exc))
    if build.Engine(name).image_id(TEST_IMAGE) is None:
        pytest.fail(f"DFLASH_TEST_IMAGE={TEST_IMAGE} is not an image of {name}")
    eng = Engine(name)
    probe = eng.run("--rm", "--entrypoint", "true", TEST_IMAGE, timeout=300)
    eng.cleanup()
    if probe.returncode != 0:
        _unavailable(f"{name} cannot start a container here: {probe.stderr.strip()[-500:]}")
    return name


@pytest.fixture
def engine(engine_name):
    eng = Engine(engine_name)
    yield eng
    assert not eng.cleanup(), "containers left behind"


@pytest.fixture
def work(tmp_path) -> Path:
    """The directory a user mounts at /work, writable by USER (as theirs would be)."""
    d = tmp_path / "work"
    d.mkdir()
    if os.geteuid() == 0:
        uid, gid = (int(x) for x in USER.split(":"))
        os.chown(d, uid, gid)
    return d


def _tail(r: subprocess.CompletedProcess) -> str:
    return f"rc={r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    # The last line may be half-written while the run is going.
    return [json.loads(x) for x in lines[:-1] if x.strip()] + [
        json.loads(x) for x in lines[-1:] if x.strip().endswith("}")
    ]


def _finished_run(run_dir: Path, steps: int) -> dict:
    assert (run_dir / "drafter" / "model.safetensors").is_file(), sorted(run_dir.rglob("*"))
    assert [m["step"] for m in _metrics(run_dir)][-1] == steps
    return json.loads((run_dir / "run.json").read_text())


# ---------------------------------------------------------------- the commands


def test_default_command_is_a_clean_doctor(engine):
    r = engine.run("--rm", TEST_IMAGE)
    assert r.returncode == 0, _tail(r)
    assert "0 error(s)" in r.stdout and "clean (exit 0" in r.stdout, _tail(r)


def test_bare_train_writes_a_tiny_run_under_work(engine, work):
    r = engine.run("--rm", "-v", f"{work}:/work", TEST_IMAGE, "train")
    assert r.returncode == 0, _tail(r)
    (run_dir,) = (work / "runs").iterdir()
    assert run_dir.name.startswith("tiny-")
    record = _finished_run(run_dir, steps=30)
    assert record["config"]["preset"] == "tiny"
    assert "write a recipe" in r.stdout


def test_bare_train_as_a_non_root_user_owns_its_files(engine, work):
    """No passwd entry for the uid: HOME, the caches and wandb's directory must be
    writable all the same, and everything in /work belongs to the caller."""
    r = engine.run("--user", USER, "-v", f"{work}:/work", TEST_IMAGE, "train")
    name = engine.made[-1]
    assert r.returncode == 0, _tail(r)
    (run_dir,) = (work / "runs").iterdir()
    record = _finished_run(run_dir, steps=30)
    assert record["config"]["wandb"] == "offline"
    assert any((run_dir / "wandb").glob("offline-run-*")), "wandb wrote no offline run"
    uid, gid = (int(x) for x in USER.split(":"))
    wrong = [
        p
        for p in [run_dir, *run_dir.rglob("*")]
        if (p.lstat().st_uid, p.lstat().st_gid) != (uid, gid)
    ]
    assert not wrong, f"not owned by {USER}: {wrong[:5]}"
    # What the run wrote outside /work went to the image's per-user home.
    changed = engine("diff", name, timeout=120).stdout.split("\n")
    written = {line.split(maxsplit=1)[1] for line in changed if line[:2] in ("A ", "C ")}
    assert "/home/dflash/.cache/dflash/compile" in written, sorted(written)[:40]


def test_recipe_in_work_is_what_trains(engine, work):
    recipe = work / "dflash.toml"
    recipe.write_text(
        'preset = "tiny"\ndata = "random"\nmax_steps = 4\nlog_every = 1\n'
        'draft_layers = 1\nseed = 7\nwandb = "off"\nout = "runs/from-recipe"\n'
    )
    r = engine.run("--rm", "-v", f"{work}:/work", TEST_IMAGE, "train")
    assert r.returncode == 0, _tail(r)
    record = _finished_run(work / "runs" / "from-recipe", steps=4)
    cfg = record["config"]
    assert (cfg["max_steps"], cfg["draft_layers"], cfg["seed"]) == (4, 1, 7)
    assert [m["step"] for m in _metrics(work / "runs" / "from-recipe")] == [1, 2, 3, 4]
    assert record["recipe"]["sha256"] == hashlib.sha256(recipe.read_bytes()).hexdigest()


def test_stop_checkpoints_and_resume_continues_the_same_trace(engine, work):
    """`stop` mid-run: checkpoint, exit 143; a new container resumes it, and the trace is
    the one an uninterrupted run makes. A constant learning rate (no warm-up, floor =
    peak) makes the run independent of --max-steps, so the first run can be long
    enough to be stopped on any machine and the two traces still match step by step."""
    train = ["train", "--log-every", "1", "--wandb", "off"]
    train += ["--warmup-ratio", "0", "--min-lr-ratio", "1"]
    mount = ["-v", f"{work}:/work", TEST_IMAGE]
    stopped = work / "runs" / "stopped"
    r = engine.run("-d", *mount, *train, "--max-steps", "100000", "--out", "/work/runs/stopped")
    assert r.returncode == 0, _tail(r)
    name = engine.made[-1]

    def running() -> bool:
        state = engine("inspect", "--format", "{{.State.Running}}", name, timeout=300)
        return state.stdout.strip() == "true"

    deadline = time.monotonic() + 600
    polls = 0
    while len(_metrics(stopped)) < 3:
        polls += 1
        # Now and then only: on a loaded host an inspect can wait long for podman's lock.
        ok = time.monotonic() < deadline and (polls % 20 or running())
        assert ok, engine("logs", name).stderr[-3000:]
        time.sleep(0.5)
    assert running()
    # SIGTERM, then SIGKILL after the grace period: 60 s, not the default 10, so that
    # a loaded machine's slow step still ends in the handler (143), not in a kill (137).
    assert engine("stop", "--time", "60", name, timeout=120).returncode == 0
    logs = engine("logs", name, timeout=60)
    assert engine.exit_code(name) == 143, logs.stderr[-3000:]
    assert "continue with --resume" in logs.stdout + logs.stderr
    at = _metrics(stopped)[-1]["step"]
    assert sorted((stopped / "checkpoints").iterdir())[-1].name == f"step_{at:08d}"

    steps = ["--max-steps", str(at + 3)]
    r = engine.run("--rm", *mount, *train, *steps, "--resume", "--out", "/work/runs/stopped")
    assert r.returncode == 0, _tail(r)
    assert f"resumed from /work/runs/stopped/checkpoints/step_{at:08d}" in r.stdout
    r = engine.run("--rm", *mount, *train, *steps, "--out", "/work/runs/straight")
    assert r.returncode == 0, _tail(r)

    def trace(run_dir: Path) -> list[tuple]:
        return [
            (m["step"], m["loss"], m["lr"], m["grad_norm"], m["data"]) for m in _metrics(run_dir)
        ]

    assert len(trace(stopped)) == at + 3
    assert trace(stopped) == trace(work / "runs" / "straight")


# ---------------------------------------------------------------- in-place changes


def _tiny_wheel(directory: Path) -> Path:
    """A real, minimal wheel (not on any index), built here so the test needs no network."""
    name, version = "dflash_mutation_probe", "0.1"
    files = {
        f"{name}/__init__.py": b"PROBE = True\n",
        f"{name}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
        ),
        f"{name}-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: dflash-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record_name = f"{name}-{version}.dist-info/RECORD"
    rows = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{path},sha256={digest},{len(data)}")
    rows.append(f"{record_name},,")
    files[record_name] = ("\n".join(rows) + "\n").encode()
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def test_pip_install_in_a_running_container_is_refused_unless_allowed(engine, tmp_path):
    """pip-install into a running container: the doctor says "mutated in place",
    `dflash train` refuses (ENV_MUTATED), --allow-dirty-env trains a marked run."""
    r = engine.run("-d", "--entrypoint", "sleep", TEST_IMAGE, "infinity")
    assert r.returncode == 0, _tail(r)
    name = engine.made[-1]

    def exec_(*cmd: str) -> subprocess.CompletedProcess:
        return engine("exec", name, *cmd)

    clean = exec_("dflash", "doctor", "--no-import", "--json")
    assert clean.returncode == 0, _tail(clean)
    assert "MANIFEST_MATCH" in {f["code"] for f in json.loads(clean.stdout)["findings"]}

    wheel = _tiny_wheel(tmp_path)
    assert engine("cp", str(wheel), f"{name}:/tmp/{wheel.name}").returncode == 0
    for cmd in (
        ("python", "-m", "ensurepip"),
        ("python", "-m", "pip", "install", "--no-index", f"/tmp/{wheel.name}"),
    ):
        r = exec_(*cmd)
        assert r.returncode == 0, _tail(r)

    human = exec_("dflash", "doctor", "--no-import")
    assert human.returncode == 1 and "mutated in place" in human.stdout, _tail(human)
    report = json.loads(exec_("dflash", "doctor", "--no-import", "--json").stdout)
    (mutated,) = [f for f in report["findings"] if f["code"] == "ENV_MUTATED"]
    assert mutated["severity"] == "error"
    added = mutated["details"]["diff"]["distributions"]["added"]
    assert "dflash-mutation-probe" in added and "pip" in added

    train = ["dflash", "train", "--max-steps", "2", "--log-every", "1", "--wandb", "off"]
    refused = exec_(*train, "--out", "/tmp/refused")
    assert refused.returncode == 3, _tail(refused)
    assert "ENV_MUTATED" in refused.stderr and "--allow-dirty-env" in refused.stderr
    assert exec_("test", "-e", "/tmp/refused").returncode == 1

    ran = exec_(*train, "--out", "/tmp/dirty", "--allow-dirty-env")
    assert ran.returncode == 0, _tail(ran)
    assert "DIRTY ENVIRONMENT" in ran.stdout + ran.stderr
    run_record = json.loads(exec_("cat", "/tmp/dirty/run.json").stdout)
    assert run_record["environment"]["dirty"] is True
    metrics = [json.loads(x) for x in exec_("cat", "/tmp/dirty/metrics.jsonl").stdout.splitlines()]
    assert metrics and all(m["dirty_env"] is True for m in metrics)


# ---------------------------------------------------------------- the bench


def _bench(store: Path, *args: str, env: dict[str, str] | None = None):
    out = store / f"record-{uuid.uuid4().hex[:6]}.json"
    cmd = [sys.executable, "-m", "dflash.cli", "bench", "run", "--image", TEST_IMAGE]
    cmd += ["--store", str(store), "--repeats", "2", "--no-auto-accept", "--json-out", str(out)]
    r = subprocess.run(
        [*cmd, *args],
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, **(env or {})},
    )
    assert r.returncode == 0, _tail(r)
    return json.loads(out.read_text())


def test_bench_runs_in_a_started_container_keyed_by_the_image_id(engine, tmp_path):
    pytest.importorskip("docker")
    from dflash.bench.image import docker_client, engine_address

    if docker_client() is None:
        _unavailable(
            f"no Docker Engine API at {engine_address()} (podman: "
            "`podman system service --time=0 unix:///tmp/podman.sock &` and "
            "DOCKER_HOST=unix:///tmp/podman.sock)"
        )
    image_id = _load_build().Engine(engine.name).image_id(TEST_IMAGE)
    rec = _bench(tmp_path, "--engine", "auto")
    env = rec["environment"]
    assert (env["kind"], env["runner"], env["key"]) == ("image", "docker-api", image_id)
    assert env["image"]["id"] == image_id
    assert env["runner_reason"].startswith("a container started through the Docker Engine API")
    assert env["image"]["labels"]["dev.dflash.content-key"].startswith(TEST_IMAGE[-16:])
    left = engine("ps", "--all", "--filter", f"ancestor={image_id}", "--format", "{{.ID}}")
    assert not left.stdout.strip(), "the bench left its container behind"


def test_bench_falls_back_to_buildah_where_no_engine_answers(engine, tmp_path):
    """Only podman shares its image store with buildah."""
    if engine.name != "podman":
        pytest.skip("the buildah fallback sees podman's images only")
    nowhere = f"unix://{tmp_path}/no-engine.sock"
    rec = _bench(tmp_path, "--engine", "auto", env={"DOCKER_HOST": nowhere})
    env = rec["environment"]
    image_id = _load_build().Engine(engine.name).image_id(TEST_IMAGE)
    assert (env["runner"], env["key"]) == ("buildah-chroot", image_id)
    assert env["runner_reason"] == f"fallback: no Docker Engine API answers at {nowhere}"
