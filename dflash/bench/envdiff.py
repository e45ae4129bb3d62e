"""What changed between the baseline's run and this one, as short human lines.

Four sources, most specific first:
  settings     thread counts and the speed-relevant variables the workers saw (the
               doctor's fingerprint leaves OMP_NUM_THREADS and friends out, because
               they do not change the installation; they do change throughput)
  environment  the doctor's manifest diff: distributions added/removed/changed,
               native libraries, torch build, variables
  doctor       findings (e.g. a CUDA 13 wheel in a cu128 environment) new in this run
  identity     image id/labels, hardware details outside the key (driver), git revision
"""

from __future__ import annotations

from typing import Any

from dflash.envcheck.manifest_diff import diff_manifests, summarize_diff
from dflash.envcheck.settings import describe


def _cost(k: str, value: str) -> str:
    """The doctor's known-bad-settings catalogue on what this value costs, if it knows."""
    effect = describe(k, value)
    return f" ({effect})" if effect else ""


def _map_diff(name: str, a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    lines = []
    for k in sorted(set(a) | set(b)):
        if k not in a:
            lines.append(f"{name}: + {k}={b[k]}{_cost(k, str(b[k]))}")
        elif k not in b:
            lines.append(f"{name}: - {k}={a[k]}")
        elif a[k] != b[k]:
            lines.append(f"{name}: ~ {k} {a[k]} -> {b[k]}{_cost(k, str(b[k]))}")
    return lines


def settings_diff(base: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    bs, cs = base.get("settings", {}), cur.get("settings", {})
    lines = _map_diff("variable", bs.get("variables", {}), cs.get("variables", {}))
    for k in ("threads", "interop_threads", "torch", "torch_cuda", "devices"):
        if bs.get(k) != cs.get(k):
            lines.append(f"setting: ~ {k} {bs.get(k)} -> {cs.get(k)}")
    return lines


def doctor_diff(base: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    def codes(r: dict[str, Any]) -> dict[str, str]:
        found = r["environment"].get("doctor", {}).get("findings", [])
        return {
            f"{f['code']}: {f['message'][:160]}": f["severity"]
            for f in found
            if f.get("severity") in ("error", "warning")
        }

    b, c = codes(base), codes(cur)
    lines = [f"doctor: + {c[k]} {k}" for k in sorted(set(c) - set(b))]
    lines += [f"doctor: - {b[k]} {k}" for k in sorted(set(b) - set(c))]
    return lines


def identity_diff(base: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    lines = []
    be, ce = base["environment"], cur["environment"]
    for k in ("kind", "runner", "key"):
        if be.get(k) != ce.get(k):
            lines.append(f"environment: ~ {k} {be.get(k)} -> {ce.get(k)}")
    bi, ci = be.get("image") or {}, ce.get("image") or {}
    for k in ("id", "digest"):
        if bi.get(k) != ci.get(k):
            lines.append(f"image: ~ {k} {bi.get(k)} -> {ci.get(k)}")
    lines += _map_diff("image label", bi.get("labels") or {}, ci.get("labels") or {})
    for k in ("driver", "memory_gib", "hostname"):
        bv, cv = base["hardware"].get(k), cur["hardware"].get(k)
        if bv != cv:
            lines.append(f"hardware: ~ {k} {bv} -> {cv}")
    bg, cg = base.get("git", {}), cur.get("git", {})
    if bg.get("revision") != cg.get("revision"):
        lines.append(f"git: ~ revision {bg.get('revision')} -> {cg.get('revision')}")
    return lines


def environment_diff(base: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    """Every difference that could explain a speed change; empty when none is known."""
    lines = settings_diff(base, cur)
    bm, cm = base["environment"].get("manifest"), cur["environment"].get("manifest")
    if bm and cm:
        diff = diff_manifests(bm, cm)
        if not diff["same"] or diff["changed_components"]:
            lines += summarize_diff(diff)
    lines += doctor_diff(base, cur)
    lines += identity_diff(base, cur)
    return lines
