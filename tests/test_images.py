"""Per-CUDA-toolkit images: content key, Dockerfile contract, key-tag refusal, and
(with a built image) the idempotent rebuild and the labels.

Three tiers:
  * pure unit tests (always run);
  * engine tests (need podman or docker; build nothing, create and remove a tiny image);
  * image tests, which need the image `just build cu128` made: set
    DFLASH_TEST_IMAGE to its key tag (`just test-images cu128` does; .ci/run runs it).
Containers started from the image: tests/test_containers.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
BUILD_PY = ROOT / "images" / "build.py"


def _load_build():
    return load_script(BUILD_PY, "dflash_images_build")


build = _load_build()
BASE_ID = "sha256:" + "ab" * 32


@pytest.fixture
def tree(tmp_path):
    """A copy of every key input of both variants."""
    for name in ("Dockerfile.cu128", "Dockerfile.cu130", ".dockerignore", *build.KEY_FILES):
        shutil.copy2(ROOT / name, tmp_path / name)
    for d in build.KEY_DIRS:
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


# ---------------------------------------------------------------- content key


def test_key_is_deterministic_and_covers_every_input(tree):
    k0 = build.content_key(tree, "cu128", BASE_ID)
    assert re.fullmatch(r"[0-9a-f]{64}", k0)
    assert build.content_key(tree, "cu128", BASE_ID) == k0
    lines = build.key_lines(tree, "cu128", BASE_ID)
    names = {line.split()[1] for line in lines if line.startswith(("file ", "dockerfile "))}
    assert {"Dockerfile", ".dockerignore", "pyproject.toml", "uv.lock", "README.md"} <= names
    assert "dflash/cli.py" in names and "dflash/envcheck/paths.py" in names

    for rel in ("uv.lock", "pyproject.toml", "Dockerfile.cu128", ".dockerignore", "dflash/cli.py"):
        path = tree / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n# changed\n")
        assert build.content_key(tree, "cu128", BASE_ID) != k0, rel
        path.write_bytes(original)
        assert build.content_key(tree, "cu128", BASE_ID) == k0, rel

    new = tree / "dflash" / "new_module.py"
    new.write_text("X = 1\n")
    assert build.content_key(tree, "cu128", BASE_ID) != k0
    new.unlink()
    assert build.content_key(tree, "cu128", BASE_ID) == k0


def test_key_changes_with_lock_base_and_variant(tree):
    k0 = build.content_key(tree, "cu128", BASE_ID)
    lock = tree / "uv.lock"
    lock.write_text(lock.read_text().replace("version = ", "version =  ", 1))
    k_lock = build.content_key(tree, "cu128", BASE_ID)
    assert k_lock != k0
    assert build.key_tag("dflash", "cu128", k_lock) != build.key_tag("dflash", "cu128", k0)
    assert build.content_key(tree, "cu128", "sha256:" + "cd" * 32) != k_lock
    assert build.content_key(tree, "cu130", BASE_ID) != k_lock
    # a bare id and its sha256: form name the same base
    assert build.content_key(tree, "cu128", "ab" * 32) == k_lock


def test_key_ignores_bytecode_and_the_other_variant(tree):
    k0 = build.content_key(tree, "cu128", BASE_ID)
    cache = tree / "dflash" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "cli.cpython-311.pyc").write_bytes(b"\x00junk")
    (tree / "dflash" / "stray.pyc").write_bytes(b"\x00junk")
    other = tree / "Dockerfile.cu130"
    other.write_text(other.read_text() + "# only cu130 changed\n")
    assert build.content_key(tree, "cu128", BASE_ID) == k0


def test_key_tag_format():
    key = "0123456789abcdef" * 4
    assert build.key_tag("dflash", "cu128", key) == "dflash:cu128-0123456789abcdef"
    with pytest.raises(build.BuildError):
        build.dockerfile_for("cu999")


@pytest.mark.parametrize(
    ("server", "engine"),
    [("Podman Engine;Conmon;Engine;", "podman"), ("Engine;containerd;", "docker")],
)
def test_docker_cli_on_podmans_socket_means_podman(monkeypatch, server, engine):
    """DOCKER_HOST at podman's API socket makes `docker info` answer: build with podman."""
    monkeypatch.delenv("DFLASH_ENGINE", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: f"/usr/bin/{name}")

    def fake_run(cmd, **kw):
        out = server if cmd[:2] == ["docker", "version"] else ""
        return subprocess.CompletedProcess(cmd, 0, stdout=out, stderr="")

    monkeypatch.setattr(build, "_run", fake_run)
    assert build.detect_engine() == engine


# ---------------------------------------------------------------- Dockerfile contract


def _dockerignore_whitelist() -> set[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return {ln[1:].strip() for ln in lines if ln.startswith("!")}


def test_build_context_is_exactly_the_key_inputs():
    assert _dockerignore_whitelist() == {*build.KEY_FILES, *build.KEY_DIRS}
    text = (ROOT / ".dockerignore").read_text()
    assert "\n*\n" in "\n" + text and "**/__pycache__" in text and "**/*.pyc" in text
    for variant in build.VARIANTS:
        for line in build.dockerfile_for(variant).read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                sources = line.split()[1:-1]
                assert set(sources) <= {*build.KEY_FILES, *build.KEY_DIRS}, line


def test_dockerfiles_differ_only_in_the_variant():
    a = (ROOT / "Dockerfile.cu128").read_text()
    b = (ROOT / "Dockerfile.cu130").read_text()
    assert "cu130" not in a and "cu128" in a
    assert b.replace("cu130", "cu128") == a


@pytest.mark.parametrize("variant", build.VARIANTS)
def test_dockerfile_contract(variant):
    text = build.dockerfile_for(variant).read_text()
    assert re.search(r"^ARG BASE_IMAGE$", text, re.M), "base image must come from a build arg"
    assert "nvidia/cuda" not in text and "cuda-toolkit" not in text
    assert re.search(r"^ENV DFLASH_EXTRA=" + variant, text, re.M)
    assert 'uv sync --locked --no-dev --no-editable --extra "$DFLASH_EXTRA"' in text
    assert f"--mount=type=cache,target=/root/.cache/uv,id={build.UV_CACHE_ID}" in text
    assert "--mount=type=secret,id=dflash_ca" in text
    assert re.search(r"^ARG UV_VERSION=\d+\.\d+\.\d+$", text, re.M)
    assert re.search(r"^ARG UV_WHEEL_SHA256=[0-9a-f]{64}$", text, re.M)
    assert "--require-hashes" in text
    assert "RUN dflash env manifest && dflash doctor" in text
    assert 'ENTRYPOINT ["dflash"]' in text
    # any uid can run it (tests/test_containers.py runs it with --user)
    assert re.search(r"^ENV HOME=/home/dflash \\$", text, re.M)
    assert "RUN install -d -m 1777 /home/dflash /work\nWORKDIR /work\n" in text
    for stage in ("base", "builder", "runtime", "smoke"):
        assert re.search(rf"^FROM \S+ AS {stage}$", text, re.M), stage
    assert text.rstrip().splitlines()[-1] == "FROM runtime AS image"
    for label in (
        "org.opencontainers.image.source",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.base.digest",
        "dev.dflash.lock-sha256",
        build.LABEL_KEY,
        build.LABEL_VARIANT,
    ):
        assert f"{label}=" in text, label
    assert f'{build.LABEL_VARIANT}="{variant}"' in text


def test_uv_pin_matches_ci():
    ci = (ROOT / ".ci" / "run").read_text()
    pinned = re.search(r'"uv==([\d.]+)"', ci).group(1)
    text = (ROOT / "Dockerfile.cu128").read_text()
    assert f"ARG UV_VERSION={pinned}\n" in text


def test_flake_pins_a_full_nixpkgs_revision_and_parses():
    text = (ROOT / "flake.nix").read_text()
    assert re.search(r'nixpkgs\.url = "github:NixOS/nixpkgs/[0-9a-f]{40}"', text)
    assert "python311" in text and "pkgs.uv" in text and "pkgs.just" in text
    assert 'UV_PYTHON_DOWNLOADS = "never"' in text
    nix = shutil.which("nix-instantiate")
    if nix is None:
        pytest.skip("nix-instantiate not installed (apt-get install nix-bin)")
    r = subprocess.run([nix, "--parse", str(ROOT / "flake.nix")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- engine tests


def _engine():
    try:
        return build.Engine()
    except build.BuildError as exc:
        pytest.skip(str(exc))


def _build_py(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BUILD_PY), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=3600,
    )


@pytest.fixture
def tiny_image():
    """A one-file image made with `import` (no registry, no build); removed after."""
    eng = _engine()
    name = f"dflash-test-{uuid.uuid4().hex[:8]}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = name.encode()
        info = tarfile.TarInfo("marker")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    r = subprocess.run(
        eng.cmd("import", "-", f"{name}:base"), input=buf.getvalue(), capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"{eng.name} cannot import images here: {r.stderr.decode()[-300:]}")
    try:
        yield eng, name
    finally:
        for ref in eng.tags_of_repo(name):
            eng.untag_or_remove(ref)
        leftover = eng.tags_of_repo(name)
        assert not leftover, leftover


def test_build_refuses_to_repoint_an_existing_key_tag(tiny_image):
    eng, name = tiny_image
    env = {"DFLASH_BASE": f"{name}:base", "DFLASH_IMAGE": name}
    key = build.content_key(ROOT, "cu128", eng.image_id(f"{name}:base"))
    tag = build.key_tag(name, "cu128", key)
    assert _build_py("tag", "cu128", env=env).stdout.strip() == tag
    # Something that is not this key's image sits on the key tag.
    eng.tag(eng.image_id(f"{name}:base"), tag)
    before = eng.image_id(tag)
    r = _build_py("build", "cu128", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "refusing" in r.stderr and key in r.stderr
    assert eng.image_id(tag) == before
    assert eng.image_id(f"{name}:cu128") is None  # pointers untouched


def test_build_without_base_says_how_to_make_one():
    _engine()
    r = _build_py("build", "cu128", env={"DFLASH_BASE": f"dflash-missing-{uuid.uuid4().hex}:x"})
    assert r.returncode == 1 and "just base" in r.stderr


# ---------------------------------------------------------------- image tests

TEST_IMAGE = os.environ.get("DFLASH_TEST_IMAGE", "")
needs_image = pytest.mark.skipif(
    not TEST_IMAGE, reason="set DFLASH_TEST_IMAGE to a built image (just test-images cu128)"
)


@pytest.mark.slow
@needs_image
def test_second_build_changes_nothing():
    eng = build.Engine()
    variant = eng.labels(TEST_IMAGE)[build.LABEL_VARIANT]
    tag = _build_py("tag", variant).stdout.strip()
    assert build.short_name(tag) == build.short_name(TEST_IMAGE)
    before = {ref: eng.image_id(ref) for ref in (tag, f"dflash:{variant}", "dflash:latest")}
    r = _build_py("build", variant)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up to date" in r.stdout and "podman build" not in r.stdout
    assert r.stdout.strip().splitlines()[-1] == tag
    after = {ref: eng.image_id(ref) for ref in before}
    assert after[tag] == before[tag]
    assert after[f"dflash:{variant}"] == before[tag]


@pytest.mark.slow
@needs_image
def test_image_labels():
    eng = build.Engine()
    labels = eng.labels(TEST_IMAGE)
    assert labels[build.LABEL_KEY].startswith(TEST_IMAGE.rsplit("-", 1)[1])
    assert (
        labels["dev.dflash.lock-sha256"]
        == hashlib.sha256((ROOT / "uv.lock").read_bytes()).hexdigest()
    )
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", labels["org.opencontainers.image.base.digest"])
    assert labels["org.opencontainers.image.revision"]
    assert labels["org.opencontainers.image.source"]
