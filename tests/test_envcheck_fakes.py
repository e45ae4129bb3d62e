"""Synthetic probe data for the envcheck unit tests (helpers only: no tests here)."""

from __future__ import annotations

from typing import Any

from dflash.envcheck.collect import ProbeData
from dflash.envcheck.doctor import prepare

# A miniature of what uv writes for conflicting extras: two torch entries told
# apart by version, a conflict marker in uv's extra encoding, a dependency that
# requests extras of a metapackage, a dev group and a Windows-only dependency.
SYNTHETIC = """
version = 1
[[package]]
name = "dflash-trainer"
version = "0.1.0"
source = { editable = "." }
dependencies = [{ name = "numpy" }, { name = "colorama", marker = "sys_platform == 'win32'" }]
[package.optional-dependencies]
cu128 = [{ name = "torch", version = "2.10.0", source = { registry = "x" } }]
cu130 = [{ name = "torch", version = "2.15.0", source = { registry = "x" } }]
[package.dev-dependencies]
dev = [{ name = "pytest" }]

[[package]]
name = "numpy"
version = "2.3.0"

[[package]]
name = "colorama"
version = "0.4.6"

[[package]]
name = "torch"
version = "2.10.0"
resolution-markers = ["sys_platform == 'linux'"]
dependencies = [{ name = "nvidia-cudnn-cu12", marker = "sys_platform == 'linux'" }, { name = "numpy" }]

[[package]]
name = "torch"
version = "2.15.0"
resolution-markers = ["sys_platform == 'linux'"]
dependencies = [
  { name = "cuda-toolkit", extra = ["cublas"], marker = "(sys_platform == 'linux' or extra == 'extra-14-dflash-trainer-cu128') and extra == 'extra-14-dflash-trainer-cu130'" },
  { name = "nvidia-cudnn-cu13", marker = "sys_platform == 'linux'" },
]

[[package]]
name = "cuda-toolkit"
version = "13.2.2"
[package.optional-dependencies]
cublas = [{ name = "nvidia-cublas", marker = "sys_platform == 'linux'" }]

[[package]]
name = "nvidia-cublas"
version = "13.4.1.3"

[[package]]
name = "nvidia-cudnn-cu12"
version = "9.10.2.21"

[[package]]
name = "nvidia-cudnn-cu13"
version = "9.26.0.51"

[[package]]
name = "pytest"
version = "9.0.0"
dependencies = [{ name = "pluggy" }, { name = "numpy" }]

[[package]]
name = "pluggy"
version = "1.6.0"
"""

SITE = "/env/lib/python3.11/site-packages"
ENV = {
    "implementation_name": "cpython",
    "implementation_version": "3.11.7",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_release": "6.1",
    "platform_system": "Linux",
    "platform_version": "#1",
    "python_full_version": "3.11.7",
    "platform_python_implementation": "CPython",
    "python_version": "3.11",
    "sys_platform": "linux",
}


def dist(name: str, version: str, libs=(), missing=(), nvidia_dirs=(), n_files=None) -> dict:
    return {
        "name": name,
        "canonical": name.lower().replace("_", "-"),
        "version": version,
        "site_dir": SITE,
        "dist_info": f"{SITE}/{name}-{version}.dist-info",
        "installer": "uv",
        "editable": False,
        "n_files": n_files if n_files is not None else len(libs) + len(missing) + 3,
        "missing": list(missing),
        "libs": list(libs),
        "nvidia_dirs": list(nvidia_dirs),
    }


def static(
    dists: list[dict],
    torch_cuda: str | None = "12.8",
    variables: dict[str, str] | None = None,
    collisions: list[dict] | None = None,
    loader: dict[str, list] | None = None,
) -> dict[str, Any]:
    libraries = {}
    for d in dists:
        for rel in d["libs"]:
            libraries[f"{SITE}/{rel}"] = {
                "rel": rel,
                "size": 100,
                "sha256_sampled": "h-" + rel,
                "owners": [d["name"]],
                "content_owner": d["name"],
            }
    torch = next((d for d in dists if d["canonical"] == "torch"), None)
    return {
        "distributions": dists,
        "libraries": libraries,
        "collisions": collisions or [],
        "interpreter": {
            "executable": "/env/bin/python",
            "prefix": "/env",
            "base_prefix": "/usr",
            "version": "3.11.7",
            "implementation": "cpython",
            "machine": "x86_64",
            "platform": "linux",
            "libc": "glibc-2.36",
            "site_dirs": [SITE],
            "marker_environment": ENV,
            "dflash_origin": None,
        },
        "torch": {"__version__": torch["version"] + "+cu128", "cuda": torch_cuda}
        if torch
        else None,
        "variables": variables or {},
        "loader": loader or {"ld_library_path": [], "ld_preload": [], "ldconfig": []},
    }


def context(static_data, lock_path, gpu=None, torch_rt=None, cache_root=None, extra=None):
    probe = ProbeData(
        python="/env/bin/python",
        static=static_data,
        gpu=gpu or {"source": None, "gpus": []},
        torch=torch_rt,
    )
    return prepare(probe, str(lock_path) if lock_path else None, extra, cache_root)
