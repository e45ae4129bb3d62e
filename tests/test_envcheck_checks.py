"""The doctor's checks on synthetic probe data: codes, severities, fixes."""

import pytest
from test_envcheck_fakes import SITE, SYNTHETIC, context, dist, static

from dflash.envcheck.checks_cuda import check_cuda, check_gpu
from dflash.envcheck.checks_env import check_manifest, check_variables
from dflash.envcheck.checks_files import check_files
from dflash.envcheck.checks_libs import check_libs
from dflash.envcheck.checks_lock import check_lock
from dflash.envcheck.fingerprint import build_manifest

CUDNN = "nvidia/cudnn/lib/libcudnn.so.9"


@pytest.fixture
def lock_path(tmp_path):
    path = tmp_path / "uv.lock"
    path.write_text(SYNTHETIC)
    return path


def clean_dists():
    return [
        dist("numpy", "2.3.0"),
        dist("torch", "2.10.0", libs=["torch/lib/libtorch_cuda.so"]),
        dist("nvidia-cudnn-cu12", "9.10.2.21", libs=[CUDNN]),
    ]


def codes(findings, severity=None):
    return sorted(f.code for f in findings if severity is None or f.severity == severity)


def by_code(findings, code):
    return [f for f in findings if f.code == code]


def test_clean_synthetic_env_has_no_errors(lock_path):
    ctx = context(static(clean_dists()), lock_path)
    assert ctx.extra == "cu128"
    for check in (check_cuda, check_lock, check_files, check_libs, check_variables):
        assert codes(check(ctx), "error") == [], check.__name__


def test_cuda_major_of_unsuffixed_and_relocated_wheels(lock_path):
    dists = clean_dists() + [
        dist("nvidia-cublas", "13.4.1.3", libs=["nvidia/cu13/lib/libcublas.so.13"]),
        dist("nvidia-cufft", "12.2.0.57", nvidia_dirs=["nvidia/cu13"]),  # CUDA 13 despite 12.x
        dist("cuda-pathfinder", "1.9.1"),  # CUDA-neutral
    ]
    findings = by_code(check_cuda(context(static(dists), lock_path)), "CUDA_MAJOR_MISMATCH")
    assert sorted(f.details["package"] for f in findings) == ["nvidia-cublas", "nvidia-cufft"]
    assert all(f.severity == "error" and "never uninstall" in f.fix for f in findings)
    assert "libcudnn.so.9" in findings[0].fix


def test_torch_missing_and_cpu_build(lock_path):
    no_torch = [d for d in clean_dists() if d["name"] != "torch"]
    assert codes(check_cuda(context(static(no_torch), lock_path))) == ["TORCH_MISSING"]
    cpu = context(static(clean_dists(), torch_cuda=None), lock_path)
    assert by_code(check_cuda(cpu), "TORCH_NOT_CUDA")[0].severity == "error"


def test_lock_drift_codes(lock_path):
    dists = [
        dist("numpy", "2.2.0"),  # downgraded
        dist("torch", "2.10.0"),
        dist("pytest", "8.0.0"),  # dev group, other version
        dist("pip", "25.0"),
        dist("nvidia-cudnn-cu13", "9.26.0.51"),  # locked for the other extra only
        dist("sglang", "0.5.0"),  # not in the lock at all
        dist("dflash-trainer", "0.0.1"),  # the project itself: always fine
    ]
    findings = check_lock(context(static(dists), lock_path))
    got = {(f.code, f.details.get("package")): f.severity for f in findings}
    assert got[("VERSION_MISMATCH", "numpy")] == "error"
    assert got[("MISSING_PACKAGE", "nvidia-cudnn-cu12")] == "error"
    assert got[("DEV_VERSION_MISMATCH", "pytest")] == "warning"
    assert got[("SEED_PACKAGE", "pip")] == "info"
    assert got[("UNLOCKED_PACKAGE", "sglang")] == "error"
    cu13 = by_code(findings, "UNLOCKED_PACKAGE")
    assert [f.details["locked_for_extras"] for f in cu13 if "cu13" in f.message] == [["cu130"]]
    assert not [f for f in findings if f.details.get("package") == "dflash-trainer"]
    fix = by_code(findings, "VERSION_MISMATCH")[0].fix
    assert "uv sync --frozen --extra cu128" in fix and "rm -rf /env" in fix


def test_duplicate_distribution_and_unknown_extra(lock_path):
    dup = clean_dists() + [dist("numpy", "1.26.0")]
    assert "DUPLICATE_DISTRIBUTION" in codes(check_lock(context(static(dup), lock_path)))
    odd = [dist("torch", "2.9.0")]
    assert codes(check_lock(context(static(odd), lock_path))) == ["EXTRA_UNKNOWN"]
    assert check_lock(context(static(odd), lock_path, extra="cu128"))[0].code == "LOCK_USED"


def test_file_collisions_holes_and_placeholder_wheels(lock_path):
    claim = [
        {"name": "nvidia-cudnn-cu12", "version": "9.10.2.21", "hash": "a", "size": 1},
        {"name": "nvidia-cudnn-cu13", "version": "9.26.0.51", "hash": "b", "size": 2},
    ]
    collisions = [
        {
            "path": f"{SITE}/{CUDNN}",
            "claimants": claim,
            "size_on_disk": 2,
            "content_owner": "nvidia-cudnn-cu13",
        },
        {
            "path": f"{SITE}/nvidia/cudnn/include/cudnn.h",
            "claimants": claim,
            "size_on_disk": 2,
            "content_owner": "nvidia-cudnn-cu13",
        },
    ]
    dists = [
        dist("numpy", "2.3.0", missing=["numpy/__init__.py"]),
        dist("torch", "2.10.0"),
        dist("nvidia-cudnn-cu12", "9.10.2.21", n_files=4),  # installed, but no library in it
    ]
    findings = check_files(context(static(dists, collisions=collisions), lock_path))
    (coll,) = by_code(findings, "FILE_COLLISION")
    assert coll.details["count"] == 2 and coll.details["files"][0] == CUDNN  # libraries first
    assert coll.details["libraries"] == {CUDNN: "nvidia-cudnn-cu13"}
    assert "deletes the only copy" in coll.fix
    assert by_code(findings, "FILE_MISSING")[0].details["package"] == "numpy"
    assert by_code(findings, "NO_LIBRARY")[0].details["package"] == "nvidia-cudnn-cu12"


def test_runtime_library_checks(lock_path):
    st = static(
        clean_dists(),
        loader={
            "ld_library_path": [],
            "ldconfig": [],
            "ld_preload": [{"path": "/opt/cudnn/libcudnn.so.9", "name": "libcudnn.so.9"}],
        },
    )
    st["libraries"][f"{SITE}/{CUDNN}"]["content_owner"] = "nvidia-cudnn-cu13"
    rt = {
        "imported": True,
        "maps_after_import": [f"{SITE}/{CUDNN}", "/usr/lib/libnccl.so.2", "/usr/lib/libc.so.6"],
        "cudnn_version": 92600,
        "cuda_available": False,
    }
    findings = check_libs(context(st, lock_path, torch_rt=rt))
    assert by_code(findings, "LIB_PRELOADED")[0].severity == "error"
    assert by_code(findings, "LIB_OUTSIDE_ENV")[0].details["name"] == "libnccl.so.2"
    assert by_code(findings, "LIB_WRONG_OWNER")[0].details["content_owner"] == "nvidia-cudnn-cu13"
    (ver,) = by_code(findings, "LIB_VERSION_MISMATCH")
    assert (ver.details["runtime"], ver.details["locked"]) == ("9.26.0", "9.10.2.21")
    failed = check_libs(
        context(
            static(clean_dists()),
            lock_path,
            torch_rt={"imported": False, "error": "ImportError: libcudnn.so.9: cannot open"},
        )
    )
    assert by_code(failed, "TORCH_IMPORT_FAILED")[0].message.endswith("libcudnn.so.9: cannot open")
    skipped = check_libs(context(static(clean_dists()), lock_path, torch_rt=None))
    assert codes(skipped) == ["TORCH_IMPORT_SKIPPED"]


def test_ld_library_path_copies(lock_path):
    lib = static(clean_dists())["libraries"][f"{SITE}/{CUDNN}"]
    loader = {
        "ld_preload": [],
        "ldconfig": [],
        "ld_library_path": [
            {
                "dir": "/a",
                "name": "libcudnn.so.9",
                "size": lib["size"],
                "sha256_sampled": lib["sha256_sampled"],
            },
            {"dir": "/b", "name": "libcudnn.so.9", "size": 7, "sha256_sampled": "other"},
            {"dir": "/c", "name": "libunrelated.so.1", "size": 7, "sha256_sampled": "x"},
        ],
    }
    findings = check_libs(context(static(clean_dists(), loader=loader), lock_path, torch_rt=None))
    assert [(f.code, f.severity, f.details["path"]) for f in findings if "path" in f.details] == [
        ("LIB_SHADOW_COPY", "warning", "/a/libcudnn.so.9"),
        ("LIB_SHADOWED", "error", "/b/libcudnn.so.9"),
    ]


@pytest.mark.parametrize(
    ("driver", "code"),
    [("520.61.05", "DRIVER_TOO_OLD"), ("560.35.03", "DRIVER_COMPAT_MODE"), ("570.124.06", None)],
)
def test_driver_against_torch_cuda(lock_path, driver, code):
    gpu = {"source": "nvidia-smi", "driver": driver, "gpus": [{"name": "H100", "reasons": 0x1}]}
    findings = check_gpu(context(static(clean_dists()), lock_path, gpu=gpu))
    assert [f.code for f in findings if f.code.startswith("DRIVER")] == ([code] if code else [])
    assert "GPU_THROTTLED" not in codes(findings)  # idle is not throttling


def test_throttling_no_gpu_and_cuda_unavailable(lock_path):
    gpu = {"source": "nvml", "driver": "580.65.06", "gpus": [{"name": "H100", "reasons": 0x41}]}
    rt = {"imported": True, "cuda_available": False, "maps_after_import": []}
    findings = check_gpu(context(static(clean_dists()), lock_path, gpu=gpu, torch_rt=rt))
    assert by_code(findings, "GPU_THROTTLED")[0].details["reasons"] == [
        "gpu_idle",
        "hw_thermal_slowdown",
    ]
    assert by_code(findings, "CUDA_UNAVAILABLE")[0].severity == "error"
    assert codes(check_gpu(context(static(clean_dists()), lock_path))) == ["NO_GPU"]
    broken = {"source": "nvidia-smi", "error": "couldn't communicate with the driver", "gpus": []}
    assert codes(check_gpu(context(static(clean_dists()), lock_path, gpu=broken))) == [
        "GPU_QUERY_FAILED"
    ]


def test_dangerous_variables(lock_path):
    variables = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_P2P_DISABLE": "0", "OMP_NUM_THREADS": "8"}
    findings = check_variables(context(static(clean_dists(), variables=variables), lock_path))
    assert [f.details["variable"] for f in by_code(findings, "ENV_VAR_DANGEROUS")] == [
        "CUDA_LAUNCH_BLOCKING"
    ]
    assert by_code(findings, "ENV_VARS")[0].details["variables"] == variables


def test_manifest_mutation_and_variable_drift(lock_path):
    baked = build_manifest(static(clean_dists(), variables={"NCCL_IB_HCA": "mlx5"}), "cu128")
    ctx = context(static(clean_dists(), variables={"NCCL_IB_HCA": "mlx5"}), lock_path)
    ctx.manifest = baked
    assert codes(check_manifest(ctx)) == ["MANIFEST_MATCH"]
    ctx = context(static(clean_dists(), variables={"NCCL_IB_HCA": "mlx4"}), lock_path)
    ctx.manifest = baked
    assert codes(check_manifest(ctx)) == ["ENV_VARS_CHANGED", "MANIFEST_MATCH"]
    ctx = context(static(clean_dists() + [dist("six", "1.17.0")]), lock_path)
    ctx.manifest, ctx.fix.in_image = baked, True
    (mutated,) = check_manifest(ctx)
    assert mutated.code == "ENV_MUTATED" and "six" in mutated.message
    assert mutated.details["diff"]["distributions"]["added"] == {"six": "1.17.0"}
    assert mutated.fix.startswith("rebuild the image")
