"""History: a markdown table and a PNG of throughput per environment key over time.

One line per environment key (image hash inside images, environment fingerprint
outside), so a new image shows up as a new series; each point is a run's median with
its repeat range as an error bar; regressions are red crosses and accepted baselines
are circled. Workloads with the machine-speed reference get a second panel with the
reference kernel's time per run: the host's own speed, which the throughput above is
already corrected for.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from dflash.bench.stats import median
from dflash.bench.store import Store


def _label(rec: dict[str, Any]) -> str:
    env = rec["environment"]
    img = env.get("image") or {}
    tag = (img.get("tags") or [None])[0]
    key = str(env.get("key"))[:12]
    return f"{env['kind']} {key}" + (f" ({tag})" if tag else "")


def markdown(records: list[dict[str, Any]], accepted: set[str], workload: str) -> str:
    lines = [
        f"# dflash bench history: {workload}",
        "",
        "| time (UTC) | record | environment | median | repeats | vs baseline | verdict |",
        "|---|---|---|---:|---|---|---|",
    ]
    for r in records:
        s, c = r["summary"], r.get("comparison") or {}
        ratio = f"{c['ratio']:.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}]" if c.get("ratio") else "-"
        verdict = c.get("verdict", "no baseline")
        if r["id"] in accepted:
            verdict += " (baseline)"
        reps = ", ".join(f"{v:,.0f}" for v in s["samples"])
        lines.append(
            f"| {r['time']} | {r['id']} | {_label(r)} | {s['median']:,.0f} {s['unit']} "
            f"| {reps} | {ratio} | {verdict} |"
        )
    regressions = [r for r in records if (r.get("comparison") or {}).get("verdict") == "regression"]
    lines += ["", f"{len(records)} runs, {len(regressions)} regressions."]
    return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], accepted: set[str], workload: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on CI runners
    import matplotlib.pyplot as plt

    hosts = [r for r in records if r["summary"].get("reference_s")]
    if hosts:  # a second panel: how fast the shared host itself ran each time
        fig, (ax, ax_host) = plt.subplots(
            2, 1, figsize=(10, 6.5), dpi=110, sharex=True, height_ratios=[3, 1]
        )
    else:
        fig, ax = plt.subplots(figsize=(10, 5), dpi=110)
    series: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        series.setdefault(_label(r), []).append(r)
    for label, recs in series.items():
        t = [dt.datetime.fromtimestamp(r["time_unix"], dt.UTC) for r in recs]
        med = [r["summary"]["median"] for r in recs]
        lo = [m - min(r["summary"]["samples"]) for m, r in zip(med, recs, strict=True)]
        hi = [max(r["summary"]["samples"]) - m for m, r in zip(med, recs, strict=True)]
        ax.errorbar(t, med, yerr=[lo, hi], marker="o", ms=4, capsize=3, label=label)
    marks = [
        (r, (r.get("comparison") or {}).get("verdict"))
        for r in records
        if r["id"] in accepted or (r.get("comparison") or {}).get("verdict") == "regression"
    ]
    for r, verdict in marks:
        when = dt.datetime.fromtimestamp(r["time_unix"], dt.UTC)
        m = r["summary"]["median"]
        if verdict == "regression":
            ax.plot(when, m, "x", color="red", ms=12, mew=3, zorder=5)
        if r["id"] in accepted:
            ax.plot(when, m, "o", mfc="none", mec="black", ms=13, mew=1.5, zorder=5)
    ax.plot([], [], "x", color="red", ms=10, mew=3, label="regression")
    ax.plot([], [], "o", mfc="none", mec="black", ms=10, label="accepted baseline")
    unit = records[-1]["summary"]["unit"] if records else "tok/s"
    ax.set_title(f"dflash bench: {workload} throughput per environment (median, repeat range)")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    if hosts:
        t = [dt.datetime.fromtimestamp(r["time_unix"], dt.UTC) for r in hosts]
        ms = [1e3 * median(r["summary"]["reference_s"]) for r in hosts]
        ax_host.plot(t, ms, marker=".", color="gray")
        ax_host.set_ylabel("reference ms\n(lower = faster host)", fontsize=8)
        ax_host.grid(alpha=0.3)
        ax = ax_host
    ax.set_xlabel("run time (UTC)")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_history(store: Store, workload: str, out: str | Path) -> tuple[Path, Path]:
    records = store.records(workload)
    if not records:
        raise KeyError(f"no records of {workload} in {store.root}")
    accepted = {p["record"] for p in store.promotions()}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md, png = out / f"{workload}.md", out / f"{workload}.png"
    md.write_text(markdown(records, accepted, workload) + f"\n![throughput]({png.name})\n")
    plot(records, accepted, workload, png)
    return md, png
