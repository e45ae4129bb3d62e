"""The one diff between two environment manifests.

`dflash env diff`, `dflash image diff`, the doctor's ENV_MUTATED check and the
bench's report all read `diff_manifests`; only how they print it differs.

It compares the fingerprinted components (fingerprint.COMPONENTS) and, where BOTH
manifests carry them, the descriptive extras that site_files.py adds to a manifest:
each native library's soname and owning distribution (`library_info`), and the
site-packages files that no RECORD lists or whose size differs from their RECORD
entry (`site_files`). Manifests written before the extras existed still diff; they
just say less.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .fingerprint import COMPONENTS

# Sections outside the fingerprint, diffed only when both manifests have them.
EXTRAS = ("library_info", "site_files")


def diff_maps(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict[str, Any]:
    """{"added", "removed", "changed"} between two flat maps ("changed": {"from", "to"})."""
    a, b = a or {}, b or {}
    return {
        "added": {k: b[k] for k in sorted(set(b) - set(a))},
        "removed": {k: a[k] for k in sorted(set(a) - set(b))},
        "changed": {k: {"from": a[k], "to": b[k]} for k in sorted(set(a) & set(b)) if a[k] != b[k]},
    }


def _library(m: Mapping[str, Any], rel: str) -> dict[str, Any] | None:
    """One library as the report shows it: size, sampled sha256, soname, owner, version."""
    base = (m.get("libraries") or {}).get(rel)
    info = (m.get("library_info") or {}).get(rel)
    if base is None and info is None:
        return None
    return {**(base or {}), **(info or {})}


def _native_libraries(a: Mapping, b: Mapping, diff: Mapping) -> dict[str, Any]:
    rels: set[str] = set()
    for name in ("libraries", "library_info"):
        for kind in ("added", "removed", "changed"):
            rels |= set(diff.get(name, {}).get(kind, {}))
    return {rel: {"from": _library(a, rel), "to": _library(b, rel)} for rel in sorted(rels)}


def _unexplained(a: Mapping, b: Mapping, diff: Mapping) -> list[dict[str, Any]]:
    """Changed site-packages files that no RECORD explains: files in no RECORD, files
    whose size differs from their RECORD entry, and libraries whose content changed
    while their owning distribution kept its version (that RECORD names one content)."""
    out: list[dict[str, Any]] = []
    files = diff.get("site_files") or {}
    for section, why in (("unrecorded", "in no RECORD"), ("size_mismatch", "differs from RECORD")):
        part = files.get(section) or {}
        for kind in ("added", "removed", "changed"):
            for rel, val in part.get(kind, {}).items():
                now = val["to"] if kind == "changed" else val
                out.append({"path": rel, "change": kind, "why": why, **_owner(now)})
    for rel, change in diff.get("native_libraries", {}).items():
        fa, fb = change["from"], change["to"]
        if not (fa and fb) or fa.get("sha256_sampled") == fb.get("sha256_sampled"):
            continue
        owner = fa.get("owner")
        if owner and owner == fb.get("owner"):
            va = (a.get("distributions") or {}).get(owner)
            if va is not None and va == (b.get("distributions") or {}).get(owner):
                why = f"content changed, {owner} {va} unchanged"
                out.append({"path": rel, "change": "changed", "why": why, "owner": owner})
    return sorted(out, key=lambda e: e["path"])


def _owner(val: Any) -> dict[str, Any]:
    return {"owner": val["owner"]} if isinstance(val, dict) and val.get("owner") else {}


def diff_manifests(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """What changed from manifest `a` to manifest `b`.

    Returns {"same": fingerprints equal, "fingerprint": {"from", "to"},
    "changed_components": [...], per component {"added", "removed", "changed"}
    ("changed" maps a key to {"from", "to"}), "native_libraries" (every library that
    differs, both sides in full) and "unexplained" (site-packages changes no RECORD
    explains)}. The extras appear in "changed_components" only when both manifests
    carry them, so an older manifest never looks changed for lacking them.
    """
    out: dict[str, Any] = {
        "same": a.get("fingerprint") == b.get("fingerprint"),
        "fingerprint": {"from": a.get("fingerprint"), "to": b.get("fingerprint")},
    }
    changed = []
    for name in COMPONENTS:
        ca, cb = a.get(name), b.get(name)
        if name == "torch":
            ca, cb = ca or {}, cb or {}
        out[name] = diff_maps(ca, cb)
        if any(out[name].values()):
            changed.append(name)
    if "library_info" in a and "library_info" in b:
        out["library_info"] = diff_maps(a["library_info"], b["library_info"])
        if any(out["library_info"].values()):
            changed.append("library_info")
    if "site_files" in a and "site_files" in b:
        sa, sb = a["site_files"], b["site_files"]
        out["site_files"] = {k: diff_maps(sa.get(k), sb.get(k)) for k in sa.keys() | sb.keys()}
    out["native_libraries"] = _native_libraries(a, b, out)
    out["unexplained"] = _unexplained(a, b, out)
    if out["unexplained"]:
        changed.append("site_files")
    out["changed_components"] = changed
    return out


def differs(diff: Mapping[str, Any]) -> bool:
    return not diff["same"] or bool(diff["changed_components"])


def _short(digest: Any) -> str:
    return f"{digest[:12]}…" if isinstance(digest, str) else str(digest)


def _describe_library(lib: Mapping[str, Any]) -> str:
    parts = []
    if lib.get("soname"):
        parts.append(f"soname {lib['soname']}")
    if lib.get("owner"):
        parts.append(f"{lib['owner']} {lib.get('version') or '?'}")
    parts.append(f"sha256 {_short(lib.get('sha256_sampled'))} sampled")
    if lib.get("size") is not None:
        parts.append(f"{lib['size']} B")
    return ", ".join(parts)


def _library_lines(diff: Mapping[str, Any], limit: int) -> list[str]:
    lines = []
    for rel, change in list(diff.get("native_libraries", {}).items())[:limit]:
        fa, fb = change["from"], change["to"]
        if fa is None:
            lines.append(f"libraries: + {rel} ({_describe_library(fb)})")
        elif fb is None:
            lines.append(f"libraries: - {rel} ({_describe_library(fa)})")
        else:
            what = []
            for key, label, show in (
                ("sha256_sampled", "sha256 (sampled)", _short),
                ("size", "size", str),
                ("soname", "soname", str),
            ):
                if fa.get(key) != fb.get(key):
                    what.append(f"{label} {show(fa.get(key))} -> {show(fb.get(key))}")
            if fa.get("soname") and fa.get("soname") == fb.get("soname"):
                what.append(f"soname {fa['soname']}")
            owner_a = f"{fa.get('owner')} {fa.get('version')}"
            owner_b = f"{fb.get('owner')} {fb.get('version')}"
            what.append(f"owner {owner_a} -> {owner_b}" if owner_a != owner_b else owner_a)
            lines.append(f"libraries: ~ {rel} " + ", ".join(what))
    total = len(diff.get("native_libraries", {}))
    if total > limit:
        lines.append(f"libraries: ... {total} differences in all")
    return lines


def summarize_diff(diff: Mapping[str, Any], limit: int = 8) -> list[str]:
    """Short human lines for a diff_manifests() result, one per difference
    (`limit` per kind and section)."""
    lines = []
    for name in diff.get("changed_components", []):
        if name in ("libraries", "library_info"):
            if name == "library_info" and "libraries" in diff["changed_components"]:
                continue  # one set of library lines covers both
            lines += _library_lines(diff, limit)
            continue
        if name == "site_files":
            for e in diff["unexplained"][: 3 * limit]:
                owner = f", owner {e['owner']}" if e.get("owner") else ""
                sign = {"added": "+", "removed": "-"}.get(e["change"], "~")
                lines.append(f"site-packages: {sign} {e['path']} ({e['why']}{owner})")
            continue
        part = diff[name]
        for kind, sign in (("added", "+"), ("removed", "-")):
            for key, val in list(part[kind].items())[:limit]:
                shown = val if isinstance(val, str) else ""
                lines.append(f"{name}: {sign} {key} {shown}".rstrip())
        for key, change in list(part["changed"].items())[:limit]:
            fa, fb = change["from"], change["to"]
            if isinstance(fa, dict) or isinstance(fb, dict):
                lines.append(f"{name}: ~ {key} (content changed)")
            else:
                lines.append(f"{name}: ~ {key} {fa} -> {fb}")
        total = sum(len(part[k]) for k in ("added", "removed", "changed"))
        if total > 3 * limit:
            lines.append(f"{name}: ... {total} differences in all")
    return lines
