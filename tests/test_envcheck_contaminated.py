"""`dflash doctor` on small REAL venvs, one per contamination class of issue 16.

Each venv holds a few locked distributions installed by uv from its cache
(hardlinks: no copy, no download), then contaminated the way users do it: a
`.pth` that runs code, sitecustomize/usercustomize, PYTHONPATH ahead of the
locked copy, an editable install, a locally built wheel of the locked version, a
file edited after installation, a torchvision built for another torch, settings
that slow training down. The doctor audits them with --python (and --extra,
since a venv without torch cannot tell its extra). Files are never written in
place: uv hardlinks them to its cache, so edits replace the file (unlink + write).
Needs uv on PATH; PyPI for the sdist and the torchvision wheel (cached after).
"""

import importlib.metadata
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from isolated_env import scratch_beside_uv_cache
from packaging.requirements import Requirement
from test_envcheck_envs import BASE_PYTHON, EXTRA, SITE, dflash, doctor, find, locked_version

pytestmark = pytest.mark.slow
IDNA = locked_version("idna")


@pytest.fixture(scope="module")
def uv():
    exe = shutil.which("uv")
    assert exe, "uv is required on PATH (the Justfile and .ci/run install it)"
    return exe


@pytest.fixture
def cache_root(tmp_path):
    """Keeps the --verify baseline of each test to itself."""
    return tmp_path / "dflash-cache"


@pytest.fixture
def small(uv, tmp_path, cache_root):
    root = scratch_beside_uv_cache(tmp_path, "envcheck-small-")
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    env.pop("VIRTUAL_ENV", None)
    made = []

    def make(*packages: str, name: str = "venv", system_site: bool = False, args=()) -> Path:
        venv = root / name
        extra = ["--system-site-packages"] if system_site else []
        run = dict(env=env, check=True, capture_output=True, timeout=600)
        subprocess.run([uv, "venv", "-q", str(venv), "--python", BASE_PYTHON, *extra], **run)
        if packages:
            python = str(venv / "bin" / "python")
            cmd = [uv, "pip", "install", "-q", "--no-deps", "--python", python, *args]
            subprocess.run([*cmd, *packages], **run)
        made.append(venv)
        return venv

    yield make
    for venv in made:
        shutil.rmtree(venv, ignore_errors=True)


def audit(venv: Path, cache_root: Path, *args: str, **env_vars: str) -> dict:
    env = {**os.environ, "DFLASH_COMPILE_CACHE_ROOT": str(cache_root / "compile"), **env_vars}
    for name in ("PYTHONPATH", "PYTHONNOUSERSITE"):
        if name not in env_vars:
            env.pop(name, None)
    return doctor(venv, "--no-import", "--extra", EXTRA, *args, env=env)


def replace(path: Path, text: str) -> None:
    """A new file where the old one was: never a write into the cache's inode."""
    path.unlink()
    path.write_text(text)


def test_startup_hooks_name_file_and_owner(small, cache_root):
    venv = small(f"idna=={IDNA}")
    site = venv / SITE
    (site / "zz_busy.pth").write_text(
        "# starts a thread in every interpreter\n"
        "import threading; threading.Thread(target=lambda: None, daemon=True).start()\n"
    )
    (site / "sitecustomize.py").write_text("import os  # patched at every start\n")
    report = audit(venv, cache_root)
    (pth,) = find(report, "STARTUP_HOOK", file=str(site / "zz_busy.pth"))
    assert pth["severity"] == "error" and pth["details"]["line"] == 2
    assert "zz_busy.pth line 2" in pth["message"] and "unowned" in pth["message"]
    assert "import threading" in pth["message"] and pth["fix"].startswith("delete ")
    (custom,) = find(report, "STARTUP_HOOK", kind="sitecustomize")
    assert custom["severity"] == "error" and custom["details"]["file"] == str(
        site / "sitecustomize.py"
    )


def test_user_site_usercustomize_and_pythonpath_shadowing(small, cache_root, tmp_path):
    venv = small(f"idna=={IDNA}", system_site=True)
    userbase = tmp_path / "userbase"
    user_site = userbase / SITE
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text("print('hello from ~/.local')\n")
    shutil.copytree(venv / SITE / "idna", user_site / "idna")
    report = audit(venv, cache_root, PYTHONUSERBASE=str(userbase))
    (hook,) = find(report, "STARTUP_HOOK", kind="usercustomize")
    assert hook["severity"] == "error" and hook["details"]["file"] == str(
        user_site / "usercustomize.py"
    )
    # site puts a venv's own site-packages ahead of the user site: its idna still wins
    assert not find(report, "MODULE_SHADOWED", package="idna")

    other = tmp_path / "other-checkout"
    shutil.copytree(venv / SITE / "idna", other / "idna")
    report = audit(venv, cache_root, PYTHONPATH=str(other), PYTHONNOUSERSITE="1")
    (shadow,) = find(report, "MODULE_SHADOWED", package="idna")
    assert shadow["severity"] == "error" and shadow["details"]["cause"] == "PYTHONPATH"
    assert shadow["details"]["loaded"] == str(other / "idna" / "__init__.py")
    assert str(venv / SITE) in shadow["message"] and "PYTHONPATH" in shadow["fix"]
    assert not find(report, "STARTUP_HOOK", kind="usercustomize")  # PYTHONNOUSERSITE


def test_editable_install_of_a_locked_package(small, cache_root, tmp_path):
    src = tmp_path / "idna-checkout"
    (src / "idna").mkdir(parents=True)
    (src / "idna" / "__init__.py").write_text(f'__version__ = "{IDNA}"\n')
    (src / "pyproject.toml").write_text(
        f'[project]\nname = "idna"\nversion = "{IDNA}"\n'
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
    )
    venv = small("-e", str(src))
    report = audit(venv, cache_root)
    (editable,) = find(report, "EDITABLE_INSTALL", package="idna")
    assert editable["severity"] == "warning" and editable["details"]["source"] == str(src)
    assert str(src) in editable["message"]
    assert not find(report, "VERSION_MISMATCH", package="idna")  # the locked version


def test_same_version_built_from_the_sdist(small, cache_root):
    version = locked_version("markupsafe")
    venv = small(f"markupsafe=={version}", args=("--no-binary", "markupsafe"))
    report = audit(venv, cache_root)
    (build,) = find(report, "BUILD_MISMATCH", package="markupsafe")
    # linux_x86_64 with the C speedups, py3-none-any where no compiler built them
    what = build["details"]["what"]
    assert (
        build["severity"] == "error" and what.startswith("wheel tag ") and "manylinux" not in what
    )
    assert build["details"]["locked"].startswith(f"markupsafe-{version}-")
    assert not find(report, "VERSION_MISMATCH", package="markupsafe")


def test_files_changed_in_place(small, cache_root):
    venv = small(f"idna=={IDNA}")
    pkg = venv / SITE / "idna"
    clean = audit(venv, cache_root, "--verify")
    (verified,) = find(clean, "RECORD_VERIFIED")
    assert verified["details"]["mode"] == "full" and verified["details"]["hashed"] > 5
    assert not find(clean, "FILE_MODIFIED")

    core = (pkg / "core.py").read_text()
    replace(pkg / "core.py", core + "\n# hand-patched\n")  # another size
    codec = (pkg / "codec.py").read_text()
    same_size = codec.replace("import", "IMPORT", 1)  # same size, other content
    assert len(same_size) == len(codec) and same_size != codec
    replace(pkg / "codec.py", same_size)

    quick = audit(venv, cache_root)  # with the baseline of the --verify above
    (mod,) = find(quick, "FILE_MODIFIED", package="idna")
    assert set(mod["details"]["files"]) == {"idna/core.py", "idna/codec.py"}
    assert "size" in mod["details"]["why"]["idna/core.py"]
    assert "rebuild" in mod["fix"] and "never uninstall" in mod["fix"]
    assert find(quick, "RECORD_VERIFIED")[0]["details"]["hashed"] <= 2  # only what changed

    fresh = cache_root / "fresh"  # no baseline: sizes only, the same-size edit is unseen
    (mod,) = find(audit(venv, fresh), "FILE_MODIFIED", package="idna")
    assert mod["details"]["files"] == ["idna/core.py"]
    (mod,) = find(audit(venv, fresh, "--verify"), "FILE_MODIFIED", package="idna")
    assert mod["details"]["files"] == ["idna/codec.py", "idna/core.py"]
    # a baseline taken of a modified distribution never blesses its bad file
    (mod,) = find(audit(venv, fresh), "FILE_MODIFIED", package="idna")
    assert mod["details"]["files"] == ["idna/codec.py", "idna/core.py"]


def test_image_manifest_is_the_baseline_for_same_size_edits(small, cache_root):
    venv = small(f"idna=={IDNA}")
    made = dflash("env", "manifest", "--python", str(venv / "bin" / "python"))
    assert made.returncode == 0, made.stderr
    codec = venv / SITE / "idna" / "codec.py"
    text = codec.read_text()
    replace(codec, text.replace("import", "IMPORT", 1))  # same size
    report = audit(venv, cache_root)  # no --verify ever ran: the manifest is the baseline
    (mod,) = find(report, "FILE_MODIFIED", package="idna")
    assert mod["details"]["files"] == ["idna/codec.py"] and mod["fix"].startswith(
        "rebuild the image"
    )
    (verified,) = find(report, "RECORD_VERIFIED")
    assert verified["details"]["baseline"] == "the image manifest"
    assert 0 < verified["details"]["hashed"] < 50  # idna's files only


def test_torchvision_built_for_another_torch(small, cache_root):
    torch = locked_version("torch")
    venv = small(f"torch=={torch}", "torchvision==0.24.0")
    info = next((venv / SITE).glob("torchvision-*.dist-info"))
    requires = importlib.metadata.Distribution.at(info).requires or []
    pins = [r for r in map(Requirement, requires) if r.name == "torch" and r.specifier]
    assert pins, "torchvision 0.24.0 pins its torch in its metadata"
    report = audit(venv, cache_root)
    (pair,) = find(report, "ABI_PAIR_MISMATCH", package="torchvision")
    assert pair["severity"] == "error" and pair["details"]["installed"] == torch
    assert pair["details"]["requires"] == f"torch{pins[0].specifier}" != f"torch=={torch}"
    assert "torchvision 0.24.0" in pair["message"]


def test_settings_that_slow_or_break_training(small, cache_root):
    venv = small(f"idna=={IDNA}")
    bad = dict(ATEN_CPU_CAPABILITY="default", TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    report = audit(venv, cache_root, "--device", "cuda", **bad)
    got = {f["details"]["variable"]: f for f in find(report, "ENV_VAR_DANGEROUS")}
    assert got["ATEN_CPU_CAPABILITY"]["severity"] == "warning"
    assert "AVX2" in got["ATEN_CPU_CAPABILITY"]["message"]
    assert "interpreter" in got["TRITON_INTERPRET"]["message"]
    assert got["TRITON_INTERPRET"]["details"]["source"].startswith("https://")
    assert got["CUDA_VISIBLE_DEVICES"]["severity"] == "error"  # --device cuda
    on_cpu = audit(venv, cache_root, "--device", "cpu", CUDA_VISIBLE_DEVICES="")
    (hidden,) = find(on_cpu, "ENV_VAR_DANGEROUS", variable="CUDA_VISIBLE_DEVICES")
    assert hidden["severity"] == "info"


def test_clean_small_env_has_none_of_these(small, cache_root):
    report = audit(
        small(f"idna=={IDNA}", f"markupsafe=={locked_version('markupsafe')}"), cache_root
    )
    new = {"STARTUP_HOOK", "MODULE_SHADOWED", "EDITABLE_INSTALL", "BUILD_MISMATCH"}
    new |= {"FILE_MODIFIED", "ABI_PAIR_MISMATCH", "ENV_VAR_DANGEROUS", "STARTUP_PROBE_FAILED"}
    assert not [f for f in report["findings"] if f["code"] in new], report["findings"]
