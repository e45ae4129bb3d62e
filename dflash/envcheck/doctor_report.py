"""Rendering of a doctor report: a human one by default, JSON for machines."""

from __future__ import annotations

import json
import textwrap

from .doctor import Report

LABEL = {"error": "ERROR", "warning": "WARNING", "info": "info"}


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False, default=str)


def render_human(report: Report, show_info: bool = True) -> str:
    lines = [f"dflash doctor: {report.python}"]
    if report.lock:
        lines.append(
            f"  lock: {report.lock} ({report.notes.get('lock', '')}); extra: {report.extra} "
            f"({report.notes.get('extra', '')})"
        )
    if report.fingerprint:
        lines.append(f"  fingerprint: {report.fingerprint}")
    lines.append("")
    # Most fixes repeat (recreate the env): list each once and refer to it by number.
    fixes: list[str] = []
    for f in report.findings:
        if f.severity == "info" and not show_info:
            continue
        ref = ""
        if f.fix:
            if f.fix not in fixes:
                fixes.append(f.fix)
            ref = f" [fix {fixes.index(f.fix) + 1}]"
        body = textwrap.fill(
            f.message + ref, width=100, initial_indent=" " * 4, subsequent_indent=" " * 4
        )
        lines.append(f"{LABEL[f.severity]:<8} {f.code}")
        lines.append(body)
    if fixes:
        lines.append("")
        lines.append("Fixes:")
        for i, fix in enumerate(fixes, 1):
            lines.append(
                textwrap.fill(fix, width=100, initial_indent=f"  [{i}] ", subsequent_indent=" " * 6)
            )
    c = report.counts()
    verdict = "clean" if report.ok else "NOT CLEAN"
    lines.append("")
    lines.append(
        f"{c['error']} error(s), {c['warning']} warning(s), {c['info']} info; {verdict} "
        f"(exit {report.exit_code}, {report.duration_s:.1f} s)"
    )
    return "\n".join(lines)
