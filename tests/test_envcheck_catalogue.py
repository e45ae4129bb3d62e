"""Issue 16's checks on synthetic probe data: build identity, hooks, shadowing
causes, the settings catalogue, GPU-query noise (the real-venv versions are in
test_envcheck_contaminated.py)."""

import glob
import hashlib

import pytest
from test_envcheck_fakes import ENV, SITE, SYNTHETIC, context, dist, static

from dflash.envcheck.checks_build import check_build
from dflash.envcheck.checks_cuda import check_gpu
from dflash.envcheck.checks_startup import check_startup
from dflash.envcheck.settings import CATALOGUE, describe, match_settings

WHEEL = "torch-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl"
WHEEL_SHA = hashlib.sha256(b"the locked torch wheel").hexdigest()


@pytest.fixture
def lock_path(tmp_path):
    # the synthetic lock, with the wheel list uv writes for torch 2.10.0
    marker = 'resolution-markers = ["sys_platform == \'linux\'"]\ndependencies = [{ name = "nvidia-cudnn-cu12"'
    assert SYNTHETIC.count(marker) == 1
    wheels = (
        f'wheels = [{{ url = "https://files.example/{WHEEL}", hash = "sha256:{WHEEL_SHA}" }}]\n'
    )
    path = tmp_path / "uv.lock"
    path.write_text(SYNTHETIC.replace(marker, wheels + marker))
    return path


def torch_dist(version="2.10.0", tags=("cp311-cp311-manylinux_2_28_x86_64",), **extra):
    d = dist("torch", version)
    d.update({"wheel_tags": list(tags), "wheel_build": None, "archive_hashes": {}, "requires": []})
    d.update(extra)
    return d


def build_ctx(lock_path, torch, others=()):
    data = static([dist("numpy", "2.3.0"), torch, dist("nvidia-cudnn-cu12", "9.10.2.21"), *others])
    # another interpreter than this one: every locked wheel counts as installable
    data["interpreter"]["marker_environment"] = {**ENV, "python_full_version": "3.11.0"}
    return context(data, lock_path, extra="cu128")


def by_code(findings, code):
    return [f for f in findings if f.code == code]


def test_same_version_from_another_build(lock_path):
    assert by_code(check_build(build_ctx(lock_path, torch_dist())), "BUILD_MISMATCH") == []
    (local,) = by_code(
        check_build(build_ctx(lock_path, torch_dist("2.10.0+cu126"))), "BUILD_MISMATCH"
    )
    assert local.severity == "error" and "+cu126" in local.message and WHEEL in local.message
    sdist_build = torch_dist(tags=["cp311-cp311-linux_x86_64"])
    (tag,) = by_code(check_build(build_ctx(lock_path, sdist_build)), "BUILD_MISMATCH")
    assert "cp311-cp311-linux_x86_64" in tag.details["what"]
    other_hash = torch_dist(archive_hashes={"sha256": hashlib.sha256(b"another").hexdigest()})
    (hashed,) = by_code(check_build(build_ctx(lock_path, other_hash)), "BUILD_MISMATCH")
    assert "sha256" in hashed.message
    same_hash = torch_dist(archive_hashes={"sha256": WHEEL_SHA})
    assert by_code(check_build(build_ctx(lock_path, same_hash)), "BUILD_MISMATCH") == []


def test_abi_pair_read_from_metadata(lock_path):
    vision = dist("torchvision", "0.24.0")
    vision["requires"] = ["numpy", "torch (==2.9.0)", "scipy ; extra == 'scipy'"]
    (pair,) = by_code(
        check_build(build_ctx(lock_path, torch_dist(), [vision])), "ABI_PAIR_MISMATCH"
    )
    assert pair.details == {
        "package": "torchvision",
        "version": "0.24.0",
        "requires": "torch==2.9.0",
        "installed": "2.10.0",
        "locked": None,
    }
    assert "requires torch==2.10.0" in pair.message
    vision["requires"] = ["torch==2.10.0"]
    assert not by_code(
        check_build(build_ctx(lock_path, torch_dist(), [vision])), "ABI_PAIR_MISMATCH"
    )


def startup_ctx(lock_path, startup):
    ctx = build_ctx(lock_path, torch_dist())
    ctx.probe.startup = startup
    return ctx


def test_hook_severity_follows_the_owner(lock_path):
    hooks = [
        {
            "kind": "pth",
            "file": f"{SITE}/numpy.pth",
            "line": 1,
            "code": "import x",
            "owner": "numpy",
        },
        {
            "kind": "pth",
            "file": f"{SITE}/sglang.pth",
            "line": 3,
            "code": "import y",
            "owner": "sglang",
        },
        {"kind": "pth", "file": f"{SITE}/stray.pth", "line": 2, "code": "import z", "owner": None},
    ]
    venv = {
        "kind": "pth",
        "file": f"{SITE}/_virtualenv.pth",
        "line": 1,
        "code": "import _virtualenv",
    }
    data = {"path": [], "hooks": [*hooks, venv], "distributions": []}
    found = check_startup(startup_ctx(lock_path, {**data, "pyvenv_cfg": {"virtualenv": "20.29.1"}}))
    sev = {f.details["file"].rsplit("/", 1)[1]: f for f in found}
    assert sev["numpy.pth"].severity == "info"  # a locked distribution's own hook
    assert sev["sglang.pth"].severity == "error" and "owned by sglang" in sev["sglang.pth"].message
    assert "rm -rf" in sev["sglang.pth"].fix
    assert sev["stray.pth"].severity == "error" and "unowned" in sev["stray.pth"].message
    assert sev["stray.pth"].fix.startswith(f"delete {SITE}/stray.pth")
    assert sev["_virtualenv.pth"].severity == "info"  # the venv's creator wrote it
    (made_by_uv,) = check_startup(startup_ctx(lock_path, {**data, "hooks": [venv]}))
    assert made_by_uv.severity == "error"  # no virtualenv in pyvenv.cfg: nobody owns it


def test_shadowing_names_the_cause_and_skips_namespace_portions(lock_path):
    user = "/home/u/.local/lib/python3.11/site-packages"
    path = [
        {"path": "/usr/lib/python3.11", "cause": "the standard library"},
        {"path": user, "cause": "the user site-packages (~/.local)"},
        {"path": SITE, "cause": "the environment's site-packages"},
        {"path": "/old/checkout", "cause": f".pth file {SITE}/old.pth"},
    ]
    mods = {
        "numpy": {"origin": f"{user}/numpy/__init__.py", "entry": user, "namespace": False},
        "nvidia": {"origin": None, "locations": ["/old/checkout/nvidia", f"{SITE}/nvidia"],
                   "entry": "/old/checkout", "namespace": True},
    }  # fmt: skip
    dists = [{"name": "numpy", "canonical": "numpy", "version": "2.3.0", "site_dir": SITE,
              "modules": {"numpy": mods["numpy"]}},
             {"name": "nvidia-cudnn-cu12", "canonical": "nvidia-cudnn-cu12", "version": "9.10.2.21",
              "site_dir": SITE, "modules": {"nvidia": mods["nvidia"]}}]  # fmt: skip
    found = check_startup(
        startup_ctx(lock_path, {"path": path, "hooks": [], "distributions": dists})
    )
    (shadow,) = by_code(found, "MODULE_SHADOWED")
    assert (
        shadow.details["package"] == "numpy" and user in shadow.message and SITE in shadow.message
    )
    assert "PYTHONNOUSERSITE=1" in shadow.fix


def test_catalogue_entries_cite_a_public_source():
    assert len({s.name for s in CATALOGUE}) == len(CATALOGUE)
    assert all(s.source.startswith("https://") and s.effect for s in CATALOGUE)
    assert describe("TRITON_INTERPRET", "1").startswith("runs Triton kernels in the interpreter")
    assert describe("TRITON_INTERPRET", "0") is None and describe("HOME", "/root") is None
    assert [m.setting.name for m in match_settings({"OMP_NUM_THREADS": "1"}, "cuda")] == []
    assert [m.severity for m in match_settings({"OMP_NUM_THREADS": "1"}, "cpu")] == ["warning"]
    sevs = {
        d: match_settings({"CUDA_VISIBLE_DEVICES": "-1"}, d)[0].severity
        for d in ("cpu", "auto", "cuda")
    }
    assert sevs == {"cpu": "info", "auto": "warning", "cuda": "error"}
    assert match_settings({"CUDA_VISIBLE_DEVICES": "0,1"}, "cuda") == []
    with pytest.raises(ValueError, match="device"):
        match_settings({}, "tpu")


def test_gpu_query_failure_is_noise_only_without_a_gpu(lock_path):
    gpu = {
        "source": "nvml",
        "gpus": [],
        "error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
    }
    ctx = context(static([dist("numpy", "2.3.0")]), lock_path, gpu=gpu, extra="cu128")
    ctx.device = "cuda"
    assert [f.severity for f in check_gpu(ctx)] == ["warning"]
    ctx.device = "auto"
    expected = "warning" if glob.glob("/dev/nvidia[0-9]*") else "info"
    assert [f.severity for f in check_gpu(ctx)] == [expected]


def test_docs_list_every_catalogue_entry_and_code():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "doctor.md").read_text()
    missing = [s.name for s in CATALOGUE if f"| `{s.name}` |" not in text]
    assert missing == [], "add these settings to docs/doctor.md"
    for code in ("STARTUP_HOOK", "MODULE_SHADOWED", "BUILD_MISMATCH", "FILE_MODIFIED"):
        assert f"`{code}`" in text


def test_quick_verify_hashes_what_moved_and_caps_a_stale_baseline(tmp_path, monkeypatch):
    import base64

    from dflash.envcheck import verify as verify_mod

    monkeypatch.setenv("DFLASH_COMPILE_CACHE_ROOT", str(tmp_path / "cache" / "compile"))
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "a.py").write_text("x = 1\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"x = 1\n").digest()).rstrip(b"=").decode()
    info = site / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "RECORD").write_text(f"pkg/a.py,sha256={digest},6\npkg-1.0.dist-info/RECORD,,\n")
    d = {"name": "pkg", "version": "1.0", "site_dir": str(site), "dist_info": str(info)}
    d |= {"n_files": 1, "resized": [], "stat_digest": "now"}
    unmoved = verify_mod.verify([d], str(tmp_path), built={str(info): "now"})
    assert (unmoved.hashed, unmoved.modified, unmoved.baseline) == (0, [], "the image manifest")
    moved = verify_mod.verify([d], str(tmp_path), built={str(info): "at build"})
    assert (moved.hashed, moved.modified) == (1, [])
    (site / "pkg" / "a.py").write_text("x = 2\n")  # same size, other content
    (bad,) = verify_mod.verify([d], str(tmp_path), built={str(info): "at build"}).modified
    assert bad[0].rel == "pkg/a.py" and "RECORD sha256" in bad[1]
    monkeypatch.setattr(verify_mod, "QUICK_MAX_BYTES", 0)
    capped = verify_mod.verify([d], str(tmp_path), built={str(info): "at build"})
    assert (capped.stale, capped.hashed, capped.modified) == (1, 0, [])


def test_egg_link_install_is_an_editable_install(lock_path):
    from dflash.envcheck.checks_startup import check_startup as check

    old = dist("numpy", "2.3.0")
    old["site_dir"] = "/home/u/src/numpy"  # its .egg-info lies in the checkout
    old["dist_info"] = "/home/u/src/numpy/numpy.egg-info"
    ctx = build_ctx(lock_path, torch_dist())
    ctx.static["distributions"] = [d for d in ctx.static["distributions"] if d["name"] != "numpy"]
    ctx.static["distributions"].append(old)
    ctx.__dict__.pop("by_name", None)  # the cached index of distributions
    ctx.probe.startup = {"path": [], "hooks": [], "distributions": []}
    (found,) = [f for f in check(ctx) if f.code == "EDITABLE_INSTALL"]
    assert found.details["source"] == "/home/u/src/numpy" and found.severity == "warning"
