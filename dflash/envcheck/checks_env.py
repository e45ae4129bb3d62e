"""Check 7 (performance-relevant variables) and the image-manifest comparison."""

from __future__ import annotations

from .context import Context
from .findings import Finding
from .fingerprint import diff_manifests, digests, summarize_diff

# Variables that cost throughput or hermeticity when set as shown, and why.
DANGEROUS: dict[str, tuple[str | None, str]] = {
    "LD_PRELOAD": (None, "forces libraries into every process ahead of the locked wheels"),
    "CUDA_LAUNCH_BLOCKING": ("1", "makes every kernel launch synchronous (debugging only)"),
    "CUDA_CACHE_DISABLE": ("1", "disables the driver's JIT cache: PTX is recompiled every run"),
    "PYTORCH_NO_CUDA_MEMORY_CACHING": (
        "1",
        "disables the caching allocator: cudaMalloc per tensor",
    ),
    "TORCH_USE_CUDA_DSA": ("1", "device-side assertions slow every kernel"),
    "TORCHDYNAMO_DISABLE": ("1", "turns torch.compile into eager mode"),
    "TORCH_COMPILE_DISABLE": ("1", "turns torch.compile into eager mode"),
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES": ("1", "recompiles every kernel on every run"),
    "TORCH_NCCL_BLOCKING_WAIT": ("1", "blocks the host on every collective"),
    "NCCL_P2P_DISABLE": ("1", "routes GPU-to-GPU traffic through host memory"),
    "NCCL_SHM_DISABLE": ("1", "disables shared-memory transport between local ranks"),
    "NCCL_IB_DISABLE": ("1", "disables InfiniBand: inter-node traffic over TCP"),
}


def check_variables(ctx: Context) -> list[Finding]:
    variables = ctx.static.get("variables", {})
    findings = []
    if variables:
        findings.append(
            Finding(
                "info",
                "ENV_VARS",
                "performance-relevant variables: "
                + ", ".join(f"{k}={v}" for k, v in sorted(variables.items())),
                details={"variables": dict(sorted(variables.items()))},
            )
        )
    for name, (bad, why) in DANGEROUS.items():
        value = variables.get(name)
        if value and (bad is None or value.strip() == bad):
            findings.append(
                Finding(
                    "warning",
                    "ENV_VAR_DANGEROUS",
                    f"{name}={value}: {why}",
                    f"unset {name} for training runs",
                    {"variable": name, "value": value},
                )
            )
    return findings


def check_manifest(ctx: Context) -> list[Finding]:
    if ctx.manifest_error:
        return [
            Finding(
                "error",
                "MANIFEST_INVALID",
                ctx.manifest_error,
                "rebuild the image (the build writes the manifest with `dflash env manifest`)",
            )
        ]
    baked = ctx.manifest
    if baked is None:
        return []
    current = {"fingerprint": ctx.fingerprint, **ctx.components}
    diff = diff_manifests(baked, current)
    now = digests(ctx.components)
    then = baked.get("digests", {})
    if then.get("installation") != now["installation"]:
        lines = summarize_diff(
            {
                **diff,
                "changed_components": [c for c in diff["changed_components"] if c != "variables"],
            }
        )
        return [
            Finding(
                "error",
                "ENV_MUTATED",
                "environment mutated in place since the image was built "
                f"(fingerprint {str(baked.get('fingerprint'))[:12]}… -> {ctx.fingerprint[:12]}…): "
                + "; ".join(lines[:12]),
                ctx.fix.recreate(),
                {"diff": diff},
            )
        ]
    findings = [
        Finding(
            "info",
            "MANIFEST_MATCH",
            f"installation matches the image manifest ({str(baked.get('created'))})",
        )
    ]
    if "variables" in diff["changed_components"]:
        findings.append(
            Finding(
                "warning",
                "ENV_VARS_CHANGED",
                "variables differ from the image build: "
                + "; ".join(summarize_diff({**diff, "changed_components": ["variables"]})),
                "check that the differences are intended (the container runtime may set some)",
                {"diff": diff["variables"]},
            )
        )
    return findings
