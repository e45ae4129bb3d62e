"""The catalogue of settings known to slow down or break training.

One table for the doctor (findings) and the bench (its settings diff names what
a variable costs, e.g. "TRITON_INTERPRET=1 (runs Triton kernels in the
interpreter)"). Each entry names the value that hurts, what it costs, and the
public document or issue that says so. Severity "error" is kept for values that
stop a training run from working; everything that only costs speed or
hermeticity is a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .findings import SEVERITY_ORDER, Severity

Device = str  # "auto" | "cpu" | "cuda": what the run is meant to use
DEVICES = ("auto", "cpu", "cuda")

CUDA_ENV_DOC = "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars"
NCCL_ENV_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
TRITON_DEBUG_DOC = "https://triton-lang.org/main/programming-guide/chapter-3/debugging.html"
INDUCTOR_CACHE_DOC = (
    "https://docs.pytorch.org/tutorials/recipes/torch_compile_caching_configuration_tutorial.html"
)
TORCH_CUDA_DOC = "https://pytorch.org/docs/stable/notes/cuda.html"


def _is(*values: str) -> Callable[[str, Device], bool]:
    wanted = {v.lower() for v in values}
    return lambda value, device: value.strip().lower() in wanted


def _any_value(value: str, device: Device) -> bool:
    return value.strip() not in ("", "0")


def _hides_all_gpus(value: str, device: Device) -> bool:
    # An empty list or a negative index ends the list: CUDA then sees no device.
    first = value.split(",")[0].strip()
    return first == "" or first.startswith("-")


def _one_thread_on_cpu(value: str, device: Device) -> bool:
    # On GPU runs one OpenMP thread per rank is what torchrun sets on purpose;
    # on a CPU run it leaves every core but one idle.
    return device == "cpu" and value.strip() == "1"


@dataclass(frozen=True)
class BadSetting:
    name: str
    matches: Callable[[str, Device], bool]
    effect: str  # what it costs, shown in the finding and the bench diff
    source: str  # a public document or issue that says so
    severity: Severity = "warning"
    # severity by the device the run is meant for (--device), where it differs:
    # hiding every GPU breaks a CUDA run and is what a CPU run wants
    by_device: tuple[tuple[str, Severity], ...] = ()

    def __post_init__(self) -> None:
        for device, sev in (("auto", self.severity), *self.by_device):
            if device not in DEVICES or sev not in SEVERITY_ORDER:
                raise ValueError(f"{self.name}: bad severity {sev!r} for device {device!r}")

    def severity_for(self, device: Device) -> Severity:
        return dict(self.by_device).get(device, self.severity)


CATALOGUE: tuple[BadSetting, ...] = (
    # --- CUDA runtime and driver
    BadSetting(
        "CUDA_VISIBLE_DEVICES",
        _hides_all_gpus,
        "hides every GPU from CUDA: torch.cuda.is_available() is False and training "
        "falls back to (or fails without) the CPU",
        CUDA_ENV_DOC,
        by_device=(("cuda", "error"), ("cpu", "info")),
    ),
    BadSetting(
        "CUDA_LAUNCH_BLOCKING",
        _is("1"),
        "makes every kernel launch synchronous: the CPU waits for each kernel (debugging only)",
        TORCH_CUDA_DOC + "#asynchronous-execution",
    ),
    BadSetting(
        "CUDA_FORCE_PTX_JIT",
        _is("1"),
        "ignores the compiled GPU code in every library and JIT-compiles PTX instead: "
        "minutes at start-up, and kernels shipped without PTX fail to load",
        "https://developer.nvidia.com/blog/cuda-pro-tip-understand-fat-binaries-jit-caching",
    ),
    BadSetting(
        "CUDA_CACHE_DISABLE",
        _is("1"),
        "disables the driver's JIT cache: PTX is recompiled in every process",
        CUDA_ENV_DOC,
    ),
    BadSetting(
        "CUDA_MODULE_LOADING",
        _is("EAGER"),
        "loads every kernel of every CUDA library at start-up instead of on first use "
        "(slower start, hundreds of MB more GPU memory per process)",
        "https://docs.nvidia.com/cuda/cuda-programming-guide/04-special-topics/lazy-loading.html",
    ),
    BadSetting(
        "NVIDIA_TF32_OVERRIDE",
        _is("0"),
        "forbids TF32 in cuBLAS and cuDNN whatever torch asks for: float32 matmuls and "
        "convolutions run without tensor cores on Ampere and newer",
        "https://docs.nvidia.com/cuda/cublas/index.html",
    ),
    BadSetting(
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        _is("1"),
        "disables torch's caching allocator: a cudaMalloc/cudaFree per tensor",
        TORCH_CUDA_DOC + "#memory-management",
    ),
    BadSetting(
        "CUDNN_LOGINFO_DBG",
        _is("1"),
        "logs every cuDNN API call",
        "https://docs.nvidia.com/deeplearning/cudnn/latest/reference/troubleshooting.html",
    ),
    BadSetting(
        "CUBLAS_LOGINFO_DBG",
        _is("1"),
        "logs every cuBLAS API call",
        "https://docs.nvidia.com/cuda/cublas/index.html",
    ),
    # --- CPU kernels and threading
    BadSetting(
        "ATEN_CPU_CAPABILITY",
        _is("default"),
        "forces ATen's scalar CPU kernels: no AVX2/AVX-512 vectorisation",
        "https://github.com/pytorch/pytorch/pull/56992",
    ),
    BadSetting(
        "OMP_NUM_THREADS",
        _one_thread_on_cpu,
        "one OpenMP thread: CPU kernels use a single core",
        "https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html",
    ),
    BadSetting(
        "MKL_NUM_THREADS",
        _one_thread_on_cpu,
        "one MKL thread: CPU matmuls use a single core",
        "https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html",
    ),
    BadSetting(
        "DNNL_VERBOSE",
        _is("1", "2", "all"),
        "oneDNN prints every primitive it runs",
        "https://uxlfoundation.github.io/oneDNN/dev_guide_verbose.html",
    ),
    BadSetting(
        "ONEDNN_VERBOSE",
        _is("1", "2", "all"),
        "oneDNN prints every primitive it runs",
        "https://uxlfoundation.github.io/oneDNN/dev_guide_verbose.html",
    ),
    BadSetting(
        "PYTHONMALLOC",
        _is("debug", "malloc_debug", "pymalloc_debug"),
        "CPython's debug allocator checks every allocation",
        "https://docs.python.org/3/using/cmdline.html#envvar-PYTHONMALLOC",
    ),
    BadSetting(
        "MALLOC_CHECK_",
        _any_value,
        "glibc's checking allocator verifies every malloc/free",
        "https://www.gnu.org/software/libc/manual/html_node/Heap-Consistency-Checking.html",
    ),
    BadSetting(
        "MALLOC_PERTURB_",
        _any_value,
        "glibc fills every allocated and freed block with a byte pattern",
        "https://www.gnu.org/software/libc/manual/html_node/Memory-Allocation-Tunables.html",
    ),
    BadSetting(
        "LD_PRELOAD",
        _any_value,
        "forces libraries into every process ahead of the locked wheels",
        "https://man7.org/linux/man-pages/man8/ld.so.8.html",
    ),
    # --- torch.compile, inductor and Triton
    BadSetting(
        "TORCHDYNAMO_DISABLE",
        _is("1"),
        "turns every torch.compile into eager mode",
        "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    ),
    BadSetting(
        "TORCH_COMPILE_DISABLE",
        _is("1"),
        "turns every torch.compile into eager mode",
        "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    ),
    BadSetting(
        "TORCH_COMPILE_DEBUG",
        _is("1"),
        "writes debug traces and generated code of every compiled graph (slow compiles, "
        "disk churn)",
        "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    ),
    BadSetting(
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES",
        _is("1"),
        "disables every inductor cache: every kernel is recompiled in every run",
        INDUCTOR_CACHE_DOC,
    ),
    BadSetting(
        "TORCHINDUCTOR_FX_GRAPH_CACHE",
        _is("0"),
        "disables the FX graph cache: compiled graphs are rebuilt in every process",
        INDUCTOR_CACHE_DOC,
    ),
    BadSetting(
        "TORCHINDUCTOR_AUTOGRAD_CACHE",
        _is("0"),
        "disables the AOTAutograd cache: backward graphs are recompiled in every process",
        INDUCTOR_CACHE_DOC,
    ),
    BadSetting(
        "TORCHINDUCTOR_COMPILE_THREADS",
        _is("1"),
        "compiles inductor's kernels one at a time",
        "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html",
    ),
    BadSetting(
        "TRITON_INTERPRET",
        _is("1"),
        "runs Triton kernels in the interpreter (numpy on the CPU), one program at a time",
        TRITON_DEBUG_DOC,
    ),
    BadSetting(
        "TRITON_DEBUG",
        _is("1"),
        "compiles Triton kernels with device-side assertions",
        TRITON_DEBUG_DOC,
    ),
    BadSetting(
        "TRITON_ALWAYS_COMPILE",
        _is("1"),
        "ignores Triton's kernel cache: every kernel is recompiled",
        TRITON_DEBUG_DOC,
    ),
    # --- NCCL and torch.distributed
    BadSetting(
        "NCCL_P2P_DISABLE",
        _is("1"),
        "routes GPU-to-GPU traffic through host memory instead of NVLink/PCIe peer access",
        NCCL_ENV_DOC,
    ),
    BadSetting(
        "NCCL_SHM_DISABLE",
        _is("1"),
        "disables shared-memory transport between local ranks",
        NCCL_ENV_DOC,
    ),
    BadSetting(
        "NCCL_IB_DISABLE",
        _is("1"),
        "disables InfiniBand/RoCE: inter-node traffic over TCP sockets",
        NCCL_ENV_DOC,
    ),
    BadSetting(
        "NCCL_DEBUG",
        _is("TRACE"),
        "traces every NCCL call",
        NCCL_ENV_DOC,
    ),
    BadSetting(
        "TORCH_NCCL_BLOCKING_WAIT",
        _is("1"),
        "blocks the host on every collective",
        "https://pytorch.org/docs/stable/distributed.html",
    ),
    BadSetting(
        "TORCH_DISTRIBUTED_DEBUG",
        _is("DETAIL"),
        "checks every collective across ranks before it runs",
        "https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications",
    ),
)
BY_NAME: dict[str, BadSetting] = {s.name: s for s in CATALOGUE}


@dataclass(frozen=True)
class Match:
    setting: BadSetting
    value: str
    severity: Severity


def match_settings(variables: Mapping[str, str], device: Device = "auto") -> list[Match]:
    """Every variable in `variables` whose value the catalogue marks as harmful."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not one of {DEVICES}")
    found = []
    for name, value in sorted(variables.items()):
        setting = BY_NAME.get(name)
        if setting is not None and setting.matches(value, device):
            found.append(Match(setting, value, setting.severity_for(device)))
    return found


def describe(name: str, value: str, device: Device = "auto") -> str | None:
    """What a setting costs, for a diff line: None when the catalogue has nothing on it."""
    setting = BY_NAME.get(name)
    if setting is None or not setting.matches(value, device):
        return None
    return setting.effect
