"""Check 1 (CUDA major consistency) and check 6 (driver and GPU)."""

from __future__ import annotations

import glob

from .context import Context
from .cuda import (
    THROTTLING,
    cuda_major_of,
    decode_reasons,
    driver_verdict,
    is_cuda_distribution,
)
from .findings import Finding

SHARED_FILES_WHY = (
    "a CUDA 13 wheel such as nvidia-cudnn-cu13 writes the same files as its CUDA 12 twin "
    "(nvidia/cudnn/lib/libcudnn.so.9), so uninstalling it deletes the only copy torch needs"
)


def check_cuda(ctx: Context) -> list[Finding]:
    torch = ctx.by_name.get("torch")
    if not torch:
        return [
            Finding(
                "error",
                "TORCH_MISSING",
                "torch is not installed in this environment",
                ctx.fix.recreate(),
            )
        ]
    info = ctx.torch_info or {}
    if "error" in info:
        return [
            Finding(
                "error",
                "TORCH_MISSING",
                f"torch is installed but {info['path']} is unreadable ({info['error']})",
                ctx.fix.recreate(),
            )
        ]
    version, cuda = info.get("__version__"), ctx.torch_cuda
    findings = [
        Finding(
            "info",
            "TORCH_INFO",
            f"torch {version}, CUDA {cuda}, git {str(info.get('git_version'))[:12]}",
            details={k: v for k, v in info.items() if k != "__all__"},
        )
    ]
    major = ctx.torch_major
    if major is None:
        wants_cuda = any(n.startswith("nvidia-") for n in ctx.torch_needs)
        findings.append(
            Finding(
                "error" if wants_cuda else "info",
                "TORCH_NOT_CUDA",
                f"torch {version} is built without CUDA"
                + (f" but extra {ctx.extra} locks a CUDA build" if wants_cuda else ""),
                ctx.fix.recreate() if wants_cuda else "",
            )
        )
        return findings
    for d in ctx.dists:
        name = d["canonical"]
        if not is_cuda_distribution(name):
            continue
        dist_major = cuda_major_of(name, d["version"], d.get("nvidia_dirs", ()))
        if dist_major is None or dist_major == major:
            continue
        findings.append(
            Finding(
                "error",
                "CUDA_MAJOR_MISMATCH",
                f"{d['name']} {d['version']} is a CUDA {dist_major} distribution, "
                f"but torch {version} is built for CUDA {cuda}",
                ctx.fix.recreate(SHARED_FILES_WHY),
                {
                    "package": name,
                    "version": d["version"],
                    "cuda_major": dist_major,
                    "torch_cuda": cuda,
                },
            )
        )
    return findings


def check_gpu(ctx: Context) -> list[Finding]:
    gpu = ctx.probe.gpu
    source = gpu.get("source")
    if source is None:
        return [
            Finding(
                "info",
                "NO_GPU",
                "no GPU tooling: pynvml is not importable in the audited environment and "
                "nvidia-smi is not on PATH; driver and clock checks skipped",
            )
        ]
    if gpu.get("error"):
        # On a machine without an NVIDIA driver (CPU runs, CI, image builds) NVML
        # failing is expected: a warning there teaches users to skim past warnings.
        expected = ctx.device == "cuda" or bool(glob.glob("/dev/nvidia[0-9]*"))
        return [
            Finding(
                "warning" if expected else "info",
                "GPU_QUERY_FAILED",
                f"{source} is present but the query failed: {gpu['error']}",
                "check that the NVIDIA driver is loaded (and, in a container, that the "
                "GPUs are passed through, e.g. `--gpus all`)",
            )
        ]
    gpus, driver = gpu.get("gpus", []), gpu.get("driver")
    if not gpus:
        return [Finding("info", "NO_GPU", f"{source} reports no GPU")]
    findings = []
    for i, g in enumerate(gpus):
        reasons = g.get("reasons")
        findings.append(
            Finding(
                "info",
                "GPU_INFO",
                f"GPU {i}: {g['name']}, driver {driver}, SM clock "
                f"{g.get('sm_clock_mhz')}/{g.get('max_sm_clock_mhz')} MHz, "
                f"{g.get('temperature_c')} C, {g.get('power_w')} W",
                details={**g, "driver": driver, "source": source},
            )
        )
        if reasons is not None and reasons & THROTTLING:
            findings.append(
                Finding(
                    "warning",
                    "GPU_THROTTLED",
                    f"GPU {i} ({g['name']}) clocks are limited: "
                    + ", ".join(decode_reasons(reasons & THROTTLING)),
                    "check cooling and power limits (`nvidia-smi -q -d PERFORMANCE,POWER`); "
                    "benchmark numbers from this GPU are not comparable",
                    {"gpu": i, "reasons": decode_reasons(reasons)},
                )
            )
    verdict = driver_verdict(driver, ctx.torch_cuda) if driver and ctx.torch_cuda else None
    if verdict:
        severity, minimum = verdict
        code = "DRIVER_TOO_OLD" if severity == "error" else "DRIVER_COMPAT_MODE"
        what = (
            "CUDA cannot run"
            if severity == "error"
            else "CUDA runs in minor-version compatibility mode (no JIT of newer PTX)"
        )
        findings.append(
            Finding(
                severity,
                code,
                f"driver {driver} is older than {minimum}, the minimum for torch's "
                f"CUDA {ctx.torch_cuda}: {what}",
                f"upgrade the NVIDIA driver to {minimum} or newer",
                {"driver": driver, "minimum": minimum, "torch_cuda": ctx.torch_cuda},
            )
        )
    runtime = ctx.probe.torch
    if runtime and runtime.get("imported") and not runtime.get("cuda_available"):
        findings.append(
            Finding(
                "error",
                "CUDA_UNAVAILABLE",
                f"{len(gpus)} GPU(s) present but torch.cuda.is_available() is False",
                "check the driver version above and CUDA_VISIBLE_DEVICES; " + ctx.fix.recreate(),
            )
        )
    return findings
