"""CUDA facts: which CUDA major a distribution belongs to, driver minimums,
NVML clock-event reasons. Pure functions and data, unit-tested."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

_SUFFIX = re.compile(r"-cu(\d+)$")
_CU_DIR = re.compile(r"^nvidia/cu(\d+)$")

# Distributions whose own version's major IS the CUDA major: the unsuffixed
# CUDA 13 component wheels (nvidia-cublas 13.x, nvidia-cuda-runtime 13.x, ...)
# and the cuda-* metapackages/bindings. Others (nvidia-cufft 12.x is a CUDA 13
# wheel; cuda-pathfinder 1.x is CUDA-neutral) are classified by their files.
VERSION_IS_CUDA_MAJOR = frozenset(
    {
        "cuda-toolkit",
        "cuda-bindings",
        "cuda-python",
        "nvidia-cublas",
        "nvidia-cuda-cccl",
        "nvidia-cuda-cupti",
        "nvidia-cuda-nvcc",
        "nvidia-cuda-nvrtc",
        "nvidia-cuda-runtime",
        "nvidia-nvjitlink",
        "nvidia-nvtx",
    }
)

# Header-only CUDA wheels: shipping no shared library is expected of them.
HEADER_ONLY = frozenset({"nvidia-cuda-cccl"})

# CUDA toolkit libraries torch loads at import or lazily after CUDA init (kept
# in step with torch/__init__.py::_preload_cuda_deps, plus cuDNN's dlopen'd
# sub-libraries). The driver's own libcuda.so / libnvidia-* are not among them:
# they always come from the system.
TORCH_CUDA_LIB = re.compile(
    r"^lib(cublas|cublasLt|cudnn(_[a-z_]+)?|nvrtc|nvrtc-builtins|cudart|cupti|cufft|curand"
    r"|nvJitLink|cusparse|cusparseLt|cusolver|nccl|nvshmem_host|cufile|nvToolsExt)\.so(\.|$)"
)


def cuda_major_of(name: str, version: str, nvidia_dirs: Iterable[str] = ()) -> int | None:
    """CUDA major of an installed distribution, or None if it is CUDA-neutral.

    Order: the `-cuNN` name suffix; files under `nvidia/cuNN/` (the CUDA 13
    wheel layout); the version of components versioned like the toolkit.
    """
    m = _SUFFIX.search(name)
    if m:
        return int(m.group(1))
    for d in nvidia_dirs:
        m = _CU_DIR.match(d)
        if m:
            return int(m.group(1))
    if name in VERSION_IS_CUDA_MAJOR:
        head = version.split(".", 1)[0]
        return int(head) if head.isdigit() else None
    return None


def is_cuda_distribution(name: str) -> bool:
    return name.startswith(("nvidia-", "cuda-"))


def torch_cuda_major(cuda: str | None) -> int | None:
    """'12.8' -> 12; None for CPU/ROCm builds."""
    if not cuda:
        return None
    head = str(cuda).split(".", 1)[0]
    return int(head) if head.isdigit() else None


# --- driver versions ----------------------------------------------------------
# NVIDIA CUDA Toolkit Release Notes (13.2 Update 2 edition), Table 2 "Minimum
# Required Driver Version for CUDA Minor Version Compatibility" (Linux): below
# these a CUDA major does not run at all.
MINOR_COMPAT_MIN_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# Same notes, Table 3 "CUDA Toolkit and Corresponding Driver Versions", Linux
# x86_64, GA releases: below these the toolkit runs in minor-version
# compatibility mode (no PTX JIT of newer PTX, some features unavailable).
TOOLKIT_DRIVER: dict[str, str] = {
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
    "13.1": "590.44.01",
    "13.2": "595.45.04",
}


def driver_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def driver_verdict(driver: str, cuda: str) -> tuple[Literal["error", "warning"], str] | None:
    """('error'|'warning', minimum) if `driver` is too old for torch's CUDA `cuda`."""
    major = torch_cuda_major(cuda)
    floor = MINOR_COMPAT_MIN_DRIVER.get(major) if major is not None else None
    if floor and driver_tuple(driver) < driver_tuple(floor):
        return ("error", floor)
    minor = ".".join(str(cuda).split(".")[:2])
    toolkit = TOOLKIT_DRIVER.get(minor)
    if toolkit and driver_tuple(driver) < driver_tuple(toolkit):
        return ("warning", toolkit)
    return None


# NVML nvmlClocksEventReason* bits (pynvml constants, same as nvml.h).
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean lost throughput, as opposed to idling or a clock setting.
THROTTLING = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def decode_reasons(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
