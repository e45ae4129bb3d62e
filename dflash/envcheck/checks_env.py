"""Check 7 (performance-relevant variables) and the image-manifest comparison."""

from __future__ import annotations

from .context import Context
from .findings import Finding
from .fingerprint import digests
from .manifest_diff import diff_manifests, summarize_diff
from .settings import match_settings


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
    # The catalogue (settings.py) says what each harmful value costs and where that is
    # documented; the finding repeats both so a report reader need not look it up.
    for m in match_settings(variables, ctx.device):
        s = m.setting
        findings.append(
            Finding(
                m.severity,
                "ENV_VAR_DANGEROUS",
                f"{s.name}={m.value}: {s.effect} (source: {s.source})",
                f"unset {s.name} for training runs (`env -u {s.name} ...`), or remove it "
                "from the shell profile, job script or container environment that sets it",
                {"variable": s.name, "value": m.value, "effect": s.effect, "source": s.source},
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
