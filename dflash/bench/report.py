"""Human report of one run and of its comparison with the baseline."""

from __future__ import annotations

from typing import Any

from dflash.bench.compare import Comparison
from dflash.bench.envdiff import environment_diff
from dflash.bench.hardware import describe


def run_summary(rec: dict[str, Any]) -> list[str]:
    s, w = rec["summary"], rec["workload"]
    samples = ", ".join(f"{v:,.0f}" for v in s["samples"])
    env = rec["environment"]
    lines = [
        f"workload {w['name']} ({w['topology']}, hash {w['hash'][:12]}) on {describe(rec['hardware'])}",
        f"environment {env['kind']} {str(env['key'])[:16]} variant {env['variant']} "
        f"runner {env['runner']}{' DIRTY' if env.get('dirty') else ''}",
        f"throughput: median {s['median']:,.0f} {s['unit']} over {len(s['samples'])} repeats "
        f"[{samples}]",
        f"wall-clock tok/s per repeat: {', '.join(f'{v:,.0f}' for v in s['wall_tok_per_s'])}",
        f"per repeat: start-up {s.get('startup_s', 0.0):.1f} s, import {s['import_s']:.1f} s, build {s['build_s']:.1f} s, first step "
        f"{s['first_step_s']:.2f} s (compile/lazy init ~{s['compile_s']:.2f} s), warm-up "
        f"{s['warmup_s']:.2f} s, steady step {s['step_s'] * 1e3:.1f} ms",
        "stages (median ms/step): "
        + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in s["stages_s"].items()),
    ]
    if s.get("reference_s"):
        raw = ", ".join(f"{v:,.0f}" for v in s["uncorrected_samples"])
        ref = ", ".join(f"{v * 1e3:.2f}" for v in s["reference_s"])
        lines.insert(3, f"uncorrected tok/cpu-s per repeat: {raw}")
        lines.insert(4, f"reference kernel ms per repeat (host speed): {ref}")
    paired = rec.get("paired") or {}
    if paired.get("available"):
        ps = paired["summary"]
        lines.append(
            f"baseline environment beside it ({paired['env']['origin']}): median "
            f"{ps['median']:,.0f} {ps['unit']} [{', '.join(f'{v:,.0f}' for v in ps['samples'])}]"
        )
    if s.get("pipeline_efficiency") is not None:
        lines.append(f"pipeline efficiency: {s['pipeline_efficiency']:.1%}")
    return lines


def comparison_lines(base: dict[str, Any], cur: dict[str, Any], c: Comparison) -> list[str]:
    head = f"baseline {base.get('id')} ({base.get('time')}, git {str(base['git'].get('revision'))[:10]})"
    if c.verdict == "refused":
        return [
            f"REFUSED: this run is not comparable with {head}:",
            *[f"  - {r}" for r in c.reasons],
            "Accept a baseline for it with `just bench-accept` if the change is intended.",
        ]
    assert c.ratio is not None and c.ci is not None
    pct = (c.ratio - 1.0) * 100
    if c.method == "paired" and c.paired:
        pairs = ", ".join(f"{r:.3f}" for r in c.paired["ratios"])
        lines = [
            f"{c.verdict.upper()}: {c.ratio:.3f}x the baseline's environment measured beside "
            f"this one ({pct:+.1f}%, {c.paired['pairs']} pairs), {c.confidence:.0%} CI "
            f"[{c.ci[0]:.3f}, {c.ci[1]:.3f}], Wilcoxon p(slower)={c.p_slower:.4f} "
            f"p(faster)={c.p_faster:.4f} (alpha {c.alpha}, minimum effect {c.min_effect:.0%})",
            f"per-pair ratios (candidate/baseline): {pairs}",
            f"stored numbers of {head} (weaker verdict, another hour's load): "
            f"{c.stored_ratio:.3f}x, {c.stored_verdict}",
        ]
        if c.stored_verdict == "regression" and c.verdict != "regression":
            lines.append(
                "  the stored numbers are slower but the baseline's environment is not: the "
                "host (load) or the code changed since, not the environment"
            )
    else:
        lines = [
            f"{c.verdict.upper()}: {c.ratio:.3f}x the {head} ({pct:+.1f}%), "
            f"{c.confidence:.0%} CI [{c.ci[0]:.3f}, {c.ci[1]:.3f}], "
            f"Mann-Whitney p(slower)={c.p_slower:.4f} p(faster)={c.p_faster:.4f} "
            f"(alpha {c.alpha}, minimum effect {c.min_effect:.0%})",
            "  (stored-number verdict: the weaker one, another hour's load is in it; "
            + (cur.get("paired") or {}).get("reason", "no baseline environment was run")
            + ")",
        ]
    if c.method == "paired" and c.paired and c.paired.get("corrected_ratio") is not None:
        lines.append(
            f"paired samples: uncorrected tok/cpu-s (the host's speed cancels within a pair); "
            f"host speed {c.machine_speed:.3f}x the paired baseline's, host-corrected ratio "
            f"{c.paired['corrected_ratio']:.3f}x"
        )
    elif c.machine_speed is not None and c.uncorrected_ratio is not None:
        lines.append(
            f"host speed (reference kernel) {c.machine_speed:.3f}x the baseline's; "
            f"uncorrected tok/cpu-s ratio {c.uncorrected_ratio:.3f}x"
        )
    scaled = ", now at the baseline's host speed" if c.machine_speed is not None else ""
    lines.append(f"stage times (median ms/step, baseline -> now{scaled}):")
    for r in c.stages:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "new"
        share = f", {r['share']:.0%} of the step change" if r["share"] is not None else ""
        lines.append(
            f"  {r['stage']:<12} {r['baseline_ms']:9.2f} -> {r['current_ms']:9.2f} ({ratio}{share})"
        )
    if c.verdict == "regression" and c.stages and c.stages[0]["delta_ms"] > 0:
        worst = c.stages[0]
        lines.append(f"stage that slowed most: {worst['stage']} (+{worst['delta_ms']:.2f} ms/step)")
    diff = environment_diff(base, cur)
    lines.append(
        "environment changes since the baseline:" if diff else "no environment change found"
    )
    lines += [f"  {d}" for d in diff[:40]]
    if len(diff) > 40:
        lines.append(f"  ... {len(diff) - 40} more (dflash bench compare --json)")
    return lines
