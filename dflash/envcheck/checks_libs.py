"""Check 4: the shared libraries torch loads come from the locked distributions.

Statically: other copies on LD_PRELOAD, LD_LIBRARY_PATH and in the ldconfig
cache. Dynamically (probe_torch.py): the files actually mapped after
`import torch` and, where a GPU works, after CUDA init. torch's libraries carry
a DT_RPATH to the wheel directories, which the loader searches BEFORE
LD_LIBRARY_PATH, so a copy there is usually not what import maps; but the
CUDA libraries themselves use DT_RUNPATH, searched AFTER LD_LIBRARY_PATH, so
whatever they dlopen by name (cuDNN sub-libraries, nvJitLink for cuSPARSE and
cuFFT: pytorch#138460) can come from there. A different copy is an error.
"""

from __future__ import annotations

import os
from typing import Any

from .context import Context
from .cuda import TORCH_CUDA_LIB
from .findings import Finding

UNSET_FIX = "unset LD_LIBRARY_PATH/LD_PRELOAD for training, or remove the directory from it"


def expected_libraries(ctx: Context) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """basename -> [(path, library info)] for the CUDA libraries torch loads."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for path, lib in ctx.static["libraries"].items():
        base = os.path.basename(path)
        if not TORCH_CUDA_LIB.match(base):
            continue
        owners = {o.lower().replace("_", "-") for o in lib["owners"]}
        if ctx.torch_needs and not owners & ctx.torch_needs:
            continue
        out.setdefault(base, []).append((path, lib))
    return out


def check_libs(ctx: Context) -> list[Finding]:
    expected = expected_libraries(ctx)
    return _loader_paths(ctx, expected) + _runtime(ctx) + _versions(ctx)


def _loader_paths(ctx: Context, expected: dict) -> list[Finding]:
    loader, findings = ctx.static["loader"], []
    for item in loader["ld_preload"]:
        if TORCH_CUDA_LIB.match(item["name"]):
            findings.append(
                Finding(
                    "error",
                    "LIB_PRELOADED",
                    f"LD_PRELOAD forces {item['path']} into every process, ahead of the "
                    f"{item['name']} of the locked wheel",
                    UNSET_FIX,
                    {"path": item["path"]},
                )
            )
    for item in loader["ld_library_path"]:
        if item["name"] not in expected:
            continue
        _, lib = expected[item["name"]][0]
        same = (item["size"], item["sha256_sampled"]) == (lib["size"], lib["sha256_sampled"])
        where = os.path.join(item["dir"], item["name"])
        findings.append(
            Finding(
                "warning" if same else "error",
                "LIB_SHADOW_COPY" if same else "LIB_SHADOWED",
                f"LD_LIBRARY_PATH directory {item['dir']} holds "
                + ("an identical" if same else "a DIFFERENT")
                + f" copy of {item['name']} (the environment's is {lib['rel']}); libraries "
                "resolved by RUNPATH or dlopen by name pick it first",
                UNSET_FIX,
                {"path": where, "name": item["name"], "identical": same},
            )
        )
    system = [e for e in loader["ldconfig"] if e["name"] in expected]
    if system:
        findings.append(
            Finding(
                "info",
                "LIB_SYSTEM_COPY",
                "the system loader cache also has "
                + ", ".join(f"{e['name']} ({e['path']})" for e in system)
                + "; the wheel copies take precedence for torch",
                details={"copies": system},
            )
        )
    return findings


def _owner_index(ctx: Context) -> dict[str, dict[str, Any]]:
    return {os.path.realpath(p): lib for p, lib in ctx.static["libraries"].items()}


def _runtime(ctx: Context) -> list[Finding]:
    rt = ctx.probe.torch
    if rt is None:
        return [
            Finding(
                "info",
                "TORCH_IMPORT_SKIPPED",
                "torch was not imported (--no-import): mapped-library checks skipped",
            )
        ]
    if not rt.get("imported"):
        if "torch" not in ctx.by_name:
            return []  # TORCH_MISSING says it already
        err = str(rt.get("error", "")).strip()
        return [
            Finding(
                "error",
                "TORCH_IMPORT_FAILED",
                "import torch fails in the audited interpreter: "
                + (err.splitlines()[-1] if err else "no traceback"),
                ctx.fix.recreate(),
                {"error": err},
            )
        ]
    index, required = _owner_index(ctx), ctx.resolution.required if ctx.resolution else {}
    sites = [os.path.realpath(s) + os.sep for s in ctx.site_dirs]
    mapped = sorted(set(rt.get("maps_after_import", [])) | set(rt.get("maps_after_cuda_init", [])))
    findings = []
    for path in mapped:
        base = os.path.basename(path)
        if not TORCH_CUDA_LIB.match(base):
            continue
        real = os.path.realpath(path)
        if not any(real.startswith(s) for s in sites):
            findings.append(
                Finding(
                    "error",
                    "LIB_OUTSIDE_ENV",
                    f"torch mapped {base} from {path}, outside the environment",
                    UNSET_FIX,
                    {"path": path, "name": base},
                )
            )
            continue
        lib = index.get(real)
        owner = lib["content_owner"] if lib else None
        if lib and owner and (not required or owner.lower().replace("_", "-") in required):
            continue
        claim = ", ".join(lib["owners"]) if lib else "no distribution"
        findings.append(
            Finding(
                "error",
                "LIB_WRONG_OWNER",
                f"torch mapped {ctx.rel(path)}, whose content is from "
                f"{owner or 'no locked distribution'} (claimed by {claim})",
                ctx.fix.recreate(),
                {"path": path, "content_owner": owner, "claimed_by": lib["owners"] if lib else []},
            )
        )
    return findings


def _versions(ctx: Context) -> list[Finding]:
    """Runtime cuDNN/NCCL versions against the locked wheels' versions."""
    rt, findings = ctx.probe.torch or {}, []
    cudnn, nccl = rt.get("cudnn_version"), rt.get("nccl_version")
    checks = []
    if isinstance(cudnn, int) and cudnn >= 90000:  # cuDNN 9+: major*10000+minor*100+patch
        checks.append(("nvidia-cudnn-", f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}"))
    if isinstance(nccl, list) and nccl:
        checks.append(("nvidia-nccl-", ".".join(str(x) for x in nccl[:3])))
    pool = ctx.resolution.required if ctx.resolution else {}
    for prefix, runtime in checks:
        locked = [(n, p.version) for n, p in pool.items() if n.startswith(prefix)]
        for name, version in locked:
            if ".".join(version.split(".")[:3]) != runtime:
                findings.append(
                    Finding(
                        "error",
                        "LIB_VERSION_MISMATCH",
                        f"torch runs {prefix[7:-1]} {runtime}, but the lock pins {name} {version}",
                        ctx.fix.recreate(),
                        {"package": name, "locked": version, "runtime": runtime},
                    )
                )
    return findings
