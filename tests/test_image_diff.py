"""`dflash image diff` and `dflash env diff`: the manifest diff, the manifest extras,
reading images without starting them, exit codes, --json and bad input.

Three tiers:
  * unit tests of the diff and the extras (always run);
  * engine tests with tiny images made by `podman import` of a rootfs holding only a
    manifest where the real image keeps it (need podman; a few seconds);
  * the slow test: a second build of the real image from a lock with one more package,
    diffed against DFLASH_TEST_IMAGE (`just test-images` sets it).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import uuid
from pathlib import Path

import pytest
from scripts import load_script

from dflash.envcheck.image_read import resolve_in_root
from dflash.envcheck.manifest_diff import diff_manifests, differs, summarize_diff
from dflash.envcheck.site_files import site_files, sonames

ROOT = Path(__file__).resolve().parents[1]
DFLASH = [sys.executable, "-m", "dflash.cli"]
build = load_script(ROOT / "images" / "build.py", "dflash_images_build")
SHA_A, SHA_B = "a" * 64, "b" * 64


def manifest(**changes) -> dict:
    """A small manifest in the shape `dflash env manifest` writes (with the extras)."""
    m = {
        "schema": 1,
        "fingerprint": "fp-a",
        "interpreter": {"version": "3.11.7", "implementation": "cpython"},
        "distributions": {"torch": "2.10.0", "idna": "3.11", "nvidia-cudnn-cu12": "9.10.2.21"},
        "libraries": {
            "torch/lib/libc10.so": {"size": 100, "sha256_sampled": SHA_A},
            "nvidia/cudnn/lib/libcudnn.so.9": {"size": 200, "sha256_sampled": SHA_A},
        },
        "torch": {"__version__": "2.10.0", "cuda": "12.8", "git_version": "abc123"},
        "variables": {},
        "library_info": {
            "torch/lib/libc10.so": {"soname": "libc10.so", "owner": "torch", "version": "2.10.0"},
            "nvidia/cudnn/lib/libcudnn.so.9": {
                "soname": "libcudnn.so.9",
                "owner": "nvidia-cudnn-cu12",
                "version": "9.10.2.21",
            },
        },
        "site_files": {"unrecorded": {}, "size_mismatch": {}},
    }
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = m
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(leaf)
        else:
            node[leaf] = value
    return m


def changed_manifest() -> dict:
    """idna downgraded, six added, libc10 rebuilt under the same torch version, a
    file dropped into site-packages: each one of the four kinds of change."""
    b = manifest(fingerprint="fp-b")
    b["distributions"].update(idna="3.10", six="1.17.0")
    b["libraries"]["torch/lib/libc10.so"] = {"size": 100, "sha256_sampled": SHA_B}
    b["site_files"]["unrecorded"]["torch/_patch.py"] = {"size": 12, "sha256": SHA_B}
    return b


# ---------------------------------------------------------------- the diff


def test_diff_names_each_kind_of_change():
    d = diff_manifests(manifest(), changed_manifest())
    assert differs(d) and not d["same"]
    assert d["distributions"]["added"] == {"six": "1.17.0"}
    assert d["distributions"]["changed"] == {"idna": {"from": "3.11", "to": "3.10"}}
    lib = d["native_libraries"]["torch/lib/libc10.so"]
    assert lib["from"]["soname"] == "libc10.so" and lib["to"]["sha256_sampled"] == SHA_B
    assert [(e["path"], e["change"]) for e in d["unexplained"]] == [
        ("torch/_patch.py", "added"),
        ("torch/lib/libc10.so", "changed"),
    ]
    assert "torch 2.10.0 unchanged" in d["unexplained"][1]["why"]
    lines = summarize_diff(d)
    assert "distributions: + six 1.17.0" in lines
    assert "distributions: ~ idna 3.11 -> 3.10" in lines
    assert any(
        ln.startswith("libraries: ~ torch/lib/libc10.so sha256 (sampled) aaaaaaaaaaaa… -> bbbb")
        for ln in lines
    )
    assert "site-packages: + torch/_patch.py (in no RECORD)" in lines


def test_a_new_owner_version_explains_a_library_change():
    b = manifest(fingerprint="fp-b")
    b["distributions"]["nvidia-cudnn-cu12"] = "9.11.0.0"
    b["library_info"]["nvidia/cudnn/lib/libcudnn.so.9"]["version"] = "9.11.0.0"
    b["libraries"]["nvidia/cudnn/lib/libcudnn.so.9"]["sha256_sampled"] = SHA_B
    d = diff_manifests(manifest(), b)
    assert d["unexplained"] == []
    line = next(ln for ln in summarize_diff(d) if ln.startswith("libraries:"))
    assert "owner nvidia-cudnn-cu12 9.10.2.21 -> nvidia-cudnn-cu12 9.11.0.0" in line


def test_identical_and_older_manifests():
    assert not differs(diff_manifests(manifest(), manifest()))
    # A manifest from before the extras: compared on what both have, never "changed"
    # for lacking them.
    old = manifest(library_info=None, site_files=None)
    d = diff_manifests(old, changed_manifest())
    assert "site_files" not in d["changed_components"]
    assert [e["path"] for e in d["unexplained"]] == []
    assert not differs(diff_manifests(old, manifest()))


# -------------------------------------------------------------- the extras


def _dist(tmp: Path, site: Path, name: str, rows: list[tuple[str, bytes]]) -> dict:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    lines = []
    for rel, data in rows:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        lines.append(f"{rel},sha256=x,{len(data)}")
    lines.append(f"{info.name}/RECORD,,")
    (info / "RECORD").write_text("\n".join(lines) + "\n")
    return {
        "name": name,
        "canonical": name,
        "version": "1.0",
        "site_dir": str(site),
        "dist_info": str(info),
    }


def test_site_files_finds_unrecorded_and_resized_files(tmp_path):
    site = tmp_path / "site-packages"
    d = _dist(tmp_path, site, "pkg", [("pkg/__init__.py", b"x = 1\n"), ("pkg/mod.py", b"y = 2\n")])
    (site / "pkg" / "mod.py").write_bytes(b"y = 2  # edited in place\n")
    (site / "pkg" / "stray.py").write_bytes(b"import os\n")
    (site / "pkg" / "__pycache__").mkdir()
    (site / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    static = {"distributions": [d], "interpreter": {"site_dirs": [str(site)]}}
    found = site_files(static)
    assert list(found["unrecorded"]) == ["pkg/stray.py"]
    stray = found["unrecorded"]["pkg/stray.py"]
    assert stray["size"] == 10 and len(stray["sha256"]) == 64
    resized = found["size_mismatch"]["pkg/mod.py"]
    assert (resized["record_size"], resized["owner"]) == (6, "pkg") and resized["size"] > 6


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
def test_sonames_from_the_elf_dynamic_section(tmp_path):
    torch_dir = importlib.util.find_spec("torch").submodule_search_locations[0]  # no import
    lib = Path(torch_dir) / "lib" / "libc10.so"
    not_elf = tmp_path / "libfake.so"
    not_elf.write_text("INPUT(-lc)\n")  # a linker script: no soname, no crash
    assert sonames([str(lib)]) == {str(lib): "libc10.so"}
    assert sonames([str(lib), str(not_elf)]) == {str(lib): "libc10.so", str(not_elf): None}


def test_paths_resolve_inside_the_image_root(tmp_path):
    (tmp_path / "opt" / "data").mkdir(parents=True)
    (tmp_path / "opt" / "data" / "m.json").write_text("{}")
    (tmp_path / "opt" / "link").symlink_to("/opt/data")  # absolute: the image's /opt
    assert resolve_in_root(tmp_path, "/opt/link/m.json") == tmp_path / "opt/data/m.json"
    (tmp_path / "up").symlink_to("../../../../../opt/data")
    assert resolve_in_root(tmp_path, "/up/m.json") == tmp_path / "opt/data/m.json"


# ------------------------------------------------------------------ engine

podman = pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman")


def dflash(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "DFLASH_ENGINE": "", **env}
    return subprocess.run(
        [*DFLASH, *args], capture_output=True, text=True, cwd=ROOT, env=full, timeout=300
    )


def podman_import(tmp: Path, name: str, files: dict[str, bytes | str], labels: dict) -> str:
    """A tiny image: only `files` (a str value makes a symlink), with labels and the
    real image's VIRTUAL_ENV."""
    tar_path = tmp / f"{name.replace(':', '_').replace('/', '_')}.tar"
    with tarfile.open(tar_path, "w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path.lstrip("/"))
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    cmd = ["podman", "import", "--change", "ENV VIRTUAL_ENV=/opt/venv"]
    for k, v in labels.items():
        cmd += ["--change", f"LABEL {k}={v}"]
    subprocess.run([*cmd, str(tar_path), name], check=True, capture_output=True, timeout=120)
    return name


MANIFEST = "/opt/venv/share/dflash/manifest.json"


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("images")
    tag = f"localhost/dflash-imagediff-test-{uuid.uuid4().hex[:8]}"
    made = {
        "a": podman_import(
            tmp,
            f"{tag}:a",
            {MANIFEST: json.dumps(manifest()).encode()},
            {"dev.dflash.lock-sha256": "1" * 64},
        ),
        "b": podman_import(
            tmp,
            f"{tag}:b",
            # B's manifest is a symlink to an absolute path: read inside B, not on this host.
            {
                MANIFEST: "/srv/dflash-imagediff/m.json",
                "/srv/dflash-imagediff/m.json": json.dumps(changed_manifest()).encode(),
            },
            {"dev.dflash.lock-sha256": "2" * 64, "dev.dflash.extra-label": "x"},
        ),
        "empty": podman_import(tmp, f"{tag}:empty", {"/etc/hostname": b"x\n"}, {}),
    }
    assert not Path("/srv/dflash-imagediff/m.json").exists()
    yield {**made, "tmp": tmp}
    subprocess.run(["podman", "rmi", "-f", *made.values()], capture_output=True, timeout=120)


@podman
@pytest.mark.parametrize("engine", ["podman", "buildah"])
def test_image_diff_of_two_images(images, engine):
    if engine == "buildah" and shutil.which("buildah") is None:
        pytest.skip("needs buildah")
    r = dflash("image", "diff", "--engine", engine, images["a"], images["b"])
    assert r.returncode == 1, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith(f"A: {images['a']} (image sha256:") and f"via {engine}" in out[0]
    assert "torch 2.10.0 (CUDA 12.8, git abc123)" in out[0]
    for line in (
        "distributions: + six 1.17.0",
        "distributions: ~ idna 3.11 -> 3.10",
        "site-packages: + torch/_patch.py (in no RECORD)",
        f"label: ~ dev.dflash.lock-sha256 {'1' * 64} -> {'2' * 64}",
        "label: + dev.dflash.extra-label=x",
    ):
        assert line in out, (line, r.stdout)
    assert any(ln.startswith("libraries: ~ torch/lib/libc10.so") for ln in out)

    same = dflash("image", "diff", "--engine", engine, images["a"], images["a"])
    assert same.returncode == 0 and "identical: fingerprint fp-a" in same.stdout, same.stderr


@podman
def test_json_and_mixed_sides(images):
    r = dflash("image", "diff", "--json", images["a"], images["b"])
    assert r.returncode == 1, r.stderr
    result = json.loads(r.stdout)
    assert result["differ"] and result["a"]["kind"] == "image"
    assert result["manifest"]["distributions"]["added"] == {"six": "1.17.0"}
    assert result["labels"]["added"] == {"dev.dflash.extra-label": "x"}
    assert set(result["labels"]["changed"]) == {"dev.dflash.lock-sha256"}
    # A manifest file on one side: the same manifest diff, labels not compared.
    path = images["tmp"] / "b.json"
    path.write_text(json.dumps(changed_manifest()))
    r = dflash("image", "diff", "--json", images["b"], str(path))
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["labels"] is None
    r = dflash("env", "diff", str(path), str(path))
    assert r.returncode == 0 and "identical" in r.stdout


@podman
def test_bad_input_exits_2_naming_it(images):
    missing = f"localhost/dflash-imagediff-absent-{uuid.uuid4().hex[:8]}:x"
    for args, bad, why in (
        ((images["a"], missing), missing, "no such image"),
        ((images["empty"], images["a"]), images["empty"], f"has no dflash manifest at {MANIFEST}"),
        ((str(ROOT / "README.md"), images["a"]), str(ROOT / "README.md"), "not a JSON manifest"),
        ((str(ROOT / "dflash"), images["a"]), str(ROOT / "dflash"), "not a venv"),
    ):
        r = dflash("image", "diff", *args)
        assert r.returncode == 2, (args, r.stdout)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"dflash image diff: {bad!r}: ") and why in line, line
    r = dflash("env", "diff", images["a"], images["a"])  # env diff takes no images
    assert r.returncode == 2 and "no such file or directory" in r.stderr


@podman
def test_docker_engine_api_reader(images, tmp_path):
    """The Docker Engine API path, against podman's compatible socket."""
    sock = tmp_path / "podman.sock"
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        env = {"DOCKER_HOST": f"unix://{sock}"}
        r = dflash("image", "diff", "--engine", "docker", images["a"], images["b"], **env)
        assert r.returncode == 1, r.stderr
        assert "via docker" in r.stdout and "distributions: + six 1.17.0" in r.stdout
        r = dflash("image", "diff", images["empty"], images["a"], **env)  # auto picks docker
        assert r.returncode == 2 and "has no dflash manifest" in r.stderr
        listed = subprocess.run(
            ["podman", "ps", "-a", "--filter", f"ancestor={images['a']}", "-q"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert listed.stdout.strip() == "", "the reader must remove the container it created"
    finally:
        service.terminate()
        service.wait(timeout=30)


def test_venv_against_its_own_manifest(tmp_path):
    out = tmp_path / "m.json"
    made = dflash("env", "manifest", "--out", str(out))
    assert made.returncode == 0, made.stderr
    written = json.loads(out.read_text())
    assert "library_info" in written and set(written["site_files"]) == {
        "unrecorded",
        "size_mismatch",
    }
    assert written["library_info"], "the project venv has native libraries"
    r = dflash("env", "diff", sys.prefix, str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"A: {sys.prefix} (venv), torch ")


# -------------------------------------------------------------------- slow

TEST_IMAGE = os.environ.get("DFLASH_TEST_IMAGE")
EXTRA_PACKAGE = "six"  # small, pure Python, and not in uv.lock (checked below)


@pytest.mark.slow
@pytest.mark.skipif(not TEST_IMAGE, reason="set DFLASH_TEST_IMAGE (just test-images)")
def test_builds_whose_locks_differ_by_one_package(tmp_path):
    """Build the image again from a lock with one more package; the diff names it
    and nothing else in the environment."""
    locked = {p["name"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    assert EXTRA_PACKAGE not in locked, "pick a package that is not in uv.lock"
    eng = build.Engine("podman")
    labels = eng.labels(TEST_IMAGE)
    variant = labels[build.LABEL_VARIANT]
    ctx = build.snapshot_context(variant, tmp_path / "context")
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    subprocess.run(
        ["uv", "add", "--no-sync", EXTRA_PACKAGE], cwd=ctx, env=env, check=True, timeout=600
    )
    new_lock = tomllib.loads((ctx / "uv.lock").read_text())["package"]
    version = next(p["version"] for p in new_lock if p["name"] == EXTRA_PACKAGE)
    old_versions = {
        (p["name"], p.get("version"))
        for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    }
    new_versions = {(p["name"], p.get("version")) for p in new_lock}
    assert new_versions - old_versions == {(EXTRA_PACKAGE, version)}, "uv moved other pins"

    base_id = labels["org.opencontainers.image.base.digest"]
    key = build.content_key(ctx, variant, base_id)
    args = build.build_args(variant, key, labels["org.opencontainers.image.base.name"], base_id)
    # build_args labels the checkout's lock; this image holds the modified one.
    old_sha, new_sha = (build._sha256_file(p / "uv.lock") for p in (ROOT, ctx))
    args = [a.replace(f"LOCK_SHA256={old_sha}", f"LOCK_SHA256={new_sha}") for a in args]
    iid = tmp_path / "iid"
    t0 = time.monotonic()
    # --layers=false: nothing of this build stays behind once its image is removed.
    cmd = [
        "podman",
        "build",
        "--isolation",
        os.environ.get("DFLASH_ISOLATION", "chroot"),
        "--layers=false",
    ]
    cmd += ["-f", str(ctx / f"Dockerfile.{variant}"), "--target", "runtime", "--iidfile", str(iid)]
    cmd += [*args, *build.secret_args(), str(ctx)]
    subprocess.run(cmd, check=True, timeout=3600)
    other = iid.read_text().strip()
    print(f"second image built in {time.monotonic() - t0:.0f} s")
    try:
        r = dflash("image", "diff", "--json", TEST_IMAGE, other, DFLASH_ENGINE="podman")
        assert r.returncode == 1, r.stderr
        diff = json.loads(r.stdout)["manifest"]
        assert diff["distributions"] == {
            "added": {EXTRA_PACKAGE: version},
            "removed": {},
            "changed": {},
        }
        for name in ("interpreter", "libraries", "torch", "variables"):
            assert not any(diff[name].values()), (name, diff[name])
        assert diff["native_libraries"] == {} and diff["unexplained"] == []
        human = dflash("image", "diff", TEST_IMAGE, other, DFLASH_ENGINE="podman")
        lines = [ln for ln in human.stdout.splitlines() if ln.startswith("distributions:")]
        assert lines == [f"distributions: + {EXTRA_PACKAGE} {version}"], human.stdout
    finally:
        subprocess.run(["podman", "rmi", other], capture_output=True, timeout=600)
