"""Files changed in place inside installed distributions (RECORD sha256 mismatches)."""

from __future__ import annotations

from .context import Context
from .findings import Finding
from .verify import verify

SAMPLE = 10  # files listed per finding; the count says how many in all


def check_integrity(ctx: Context) -> list[Finding]:
    built = (ctx.manifest or {}).get("record_stats")
    res = verify(ctx.dists, ctx.fix.prefix, full=ctx.verify, built=built)
    how = (
        "every file hashed"
        if res.mode == "full"
        else f"sizes of every file, hashes of files changed since {res.baseline}"
        if res.baseline == "the image manifest"
        else "sizes of every file, hashes of files changed since the last --verify"
        if res.baseline
        else "sizes of every file; no baseline yet, so an edit that keeps a file's size "
        "is not seen until `dflash doctor --verify` runs once"
    )
    findings = [
        Finding(
            "info",
            "RECORD_VERIFIED",
            f"{res.files} installed files checked against RECORD ({how}): hashed "
            f"{res.hashed} files, {res.hashed_bytes / 1e6:.0f} MB, in {res.seconds:.2f} s",
            details={
                "mode": res.mode,
                "files": res.files,
                "hashed": res.hashed,
                "hashed_bytes": res.hashed_bytes,
                "seconds": round(res.seconds, 3),
                "baseline": res.baseline,
            },
        )
    ]
    if res.stale:
        findings.append(
            Finding(
                "warning",
                "RECORD_BASELINE_STALE",
                f"the files of {res.stale} distributions changed size or mtime since the "
                f"baseline ({res.baseline}): more than a default run hashes, so they went "
                "unchecked",
                "run `dflash doctor --verify` once: it hashes every file and renews the baseline",
                {"distributions": res.stale, "baseline": res.baseline},
            )
        )
    by_dist: dict[tuple[str, str], list] = {}
    for entry, why in res.modified:
        by_dist.setdefault((entry.dist, entry.version), []).append((entry, why))
    for (dist, version), items in sorted(by_dist.items()):
        items.sort(key=lambda x: x[0].rel)
        first, why = items[0]
        findings.append(
            Finding(
                "error",
                "FILE_MODIFIED",
                f"{len(items)} file(s) of {dist} {version} changed after installation, e.g. "
                f"{first.rel} ({why})",
                ctx.fix.recreate(
                    "an installed file was edited or replaced in place; patch the source and "
                    "rebuild instead of editing site-packages"
                ),
                {
                    "package": dist,
                    "version": version,
                    "count": len(items),
                    "files": [e.rel for e, _ in items[:SAMPLE]],
                    "why": {e.rel: w for e, w in items[:SAMPLE]},
                },
            )
        )
    return findings
