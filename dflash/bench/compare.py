"""Compare a run with a baseline: like with like only, then a verdict with evidence.

Refusal comes first: a different workload hash, topology, hardware key, CUDA variant
or metric means the numbers measure different things, and the answer is the reason,
not a ratio. Otherwise (asv's rule) a change is real when a one-sided test is
significant AND the ratio is beyond the minimum effect. Either alone is not enough:
with many samples tiny drifts become significant, and with few samples large ratios
can be noise.

Two verdicts, the stronger one decides:
- paired (paired.py), when the run measured the baseline's environment beside the
  candidate: Wilcoxon signed-rank on the within-pair log ratios. Same hour, same load.
- stored: the run's samples against the numbers stored in the baseline record
  (Mann-Whitney U, Hodges-Lehmann ratio). Another hour's load is in that difference,
  so it is the weaker verdict: used only when no baseline environment could be run,
  and always reported beside the paired one (it also sees code changes, which the
  paired verdict by construction does not: both sides run this checkout).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dflash.bench import stats
from dflash.bench.workloads import POLICY_FIELDS, describe_difference

ALPHA = 0.05
MIN_EFFECT = 0.05  # default when a record's workload names none


@dataclass
class Comparison:
    verdict: str  # "pass" | "regression" | "improvement" | "refused"
    reasons: list[str] = field(default_factory=list)  # why refused
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    confidence: float | None = None
    p_slower: float | None = None
    p_faster: float | None = None
    machine_speed: float | None = None  # reference time baseline / now (>1: host faster)
    uncorrected_ratio: float | None = None  # the same ratio without the correction
    stages: list[dict[str, Any]] = field(default_factory=list)
    method: str = "stored"  # "paired" | "stored": which verdict decided
    paired: dict[str, Any] | None = None  # PairedResult.to_dict()
    stored_verdict: str | None = None  # the stored-number verdict, for comparison
    stored_ratio: float | None = None
    baseline_id: str | None = None
    current_id: str | None = None
    alpha: float = ALPHA
    min_effect: float = MIN_EFFECT

    @property
    def exit_code(self) -> int:
        return {"pass": 0, "improvement": 0, "regression": 1}.get(self.verdict, 3)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reasons": self.reasons,
            "ratio": self.ratio,
            "ci": list(self.ci) if self.ci else None,
            "confidence": self.confidence,
            "p_slower": self.p_slower,
            "p_faster": self.p_faster,
            "machine_speed": self.machine_speed,
            "uncorrected_ratio": self.uncorrected_ratio,
            "stages": self.stages,
            "method": self.method,
            "paired": self.paired,
            "stored_verdict": self.stored_verdict,
            "stored_ratio": self.stored_ratio,
            "baseline_id": self.baseline_id,
            "alpha": self.alpha,
            "min_effect": self.min_effect,
        }


def refusal_reasons(base: dict[str, Any], cur: dict[str, Any]) -> list[str]:
    reasons = []
    bw, cw = base["workload"], cur["workload"]
    if bw["name"] != cw["name"]:
        reasons.append(f"different workloads: baseline {bw['name']!r}, this run {cw['name']!r}")
    if bw["topology"] != cw["topology"]:
        reasons.append(f"different topology: baseline {bw['topology']}, this run {cw['topology']}")
    if bw["hash"] != cw["hash"]:
        changed = describe_difference(
            {k: v for k, v in bw["definition"].items() if k not in POLICY_FIELDS},
            {k: v for k, v in cw["definition"].items() if k not in POLICY_FIELDS},
        )
        reasons.append(
            f"different workload definition (hash {bw['hash'][:12]} vs {cw['hash'][:12]}): "
            + "; ".join(changed[:6])
        )
    bh, ch = base["hardware"], cur["hardware"]
    if bh["key"] != ch["key"]:
        diffs = [
            f"{k}: {bh.get(k)} -> {ch.get(k)}"
            for k in ("cpu_model", "cpu_count", "gpu_models", "gpu_count")
            if bh.get(k) != ch.get(k)
        ]
        reasons.append("different hardware: " + "; ".join(diffs))
    bv, cv = base["environment"].get("variant"), cur["environment"].get("variant")
    if bv != cv:
        reasons.append(f"different CUDA variant: baseline {bv}, this run {cv}")
    if base["summary"]["metric"] != cur["summary"]["metric"]:
        reasons.append(
            f"different metric: {base['summary']['metric']} vs {cur['summary']['metric']}"
        )
    return reasons


def machine_speed(base: dict[str, Any], cur: dict[str, Any]) -> float | None:
    """How much faster the host ran the machine-speed reference now than for the
    baseline (>1: faster now); None without a reference in both records."""
    b, c = base["summary"].get("reference_s"), cur["summary"].get("reference_s")
    if not b or not c:
        return None
    return stats.median(b) / stats.median(c)


def stage_changes(base: dict[str, Any], cur: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-stage median time per step, baseline vs now, largest added time first.
    With a machine-speed reference, today's times are scaled to the baseline's host
    speed, so the stages' changes add up to the corrected ratio, not to the host's."""
    speed = machine_speed(base, cur) or 1.0
    b = base["summary"]["stages_s"]
    c = {k: v * speed for k, v in cur["summary"]["stages_s"].items()}
    b_step, c_step = base["summary"]["step_s"], cur["summary"]["step_s"] * speed
    rows = []
    for name in sorted(set(b) | set(c)):
        tb, tc = b.get(name, 0.0), c.get(name, 0.0)
        rows.append(
            {
                "stage": name,
                "baseline_ms": tb * 1e3,
                "current_ms": tc * 1e3,
                "ratio": tc / tb if tb > 0 else None,
                "delta_ms": (tc - tb) * 1e3,
                # Share of the step-time change: which stage explains the slowdown.
                "share": (tc - tb) / (c_step - b_step) if abs(c_step - b_step) > 1e-12 else None,
            }
        )
    return sorted(rows, key=lambda r: -r["delta_ms"])


def compare(
    base: dict[str, Any],
    cur: dict[str, Any],
    alpha: float = ALPHA,
    min_effect: float | None = None,
) -> Comparison:
    """`min_effect` None: the current workload's own (its definition's `min_effect`)."""
    if min_effect is None:
        min_effect = cur["workload"]["definition"].get("min_effect", MIN_EFFECT)
    out = Comparison(
        verdict="refused",
        baseline_id=base.get("id"),
        current_id=cur.get("id"),
        alpha=alpha,
        min_effect=min_effect,
    )
    out.reasons = refusal_reasons(base, cur)
    if out.reasons:
        return out
    x, y = cur["summary"]["samples"], base["summary"]["samples"]
    out.ratio, lo, hi, out.confidence = stats.log_ratio(x, y, 1.0 - alpha)
    out.ci = (lo, hi)
    out.p_slower = stats.mann_whitney_less(x, y)
    out.p_faster = stats.mann_whitney_less(y, x)
    out.stages = stage_changes(base, cur)
    out.machine_speed = machine_speed(base, cur)
    bu, cu = base["summary"].get("uncorrected_samples"), cur["summary"].get("uncorrected_samples")
    if bu and cu:
        out.uncorrected_ratio = stats.log_ratio(cu, bu, 1.0 - alpha)[0]
    out.verdict = stats.verdict(out.ratio, out.p_slower, out.p_faster, alpha, min_effect)
    out.stored_verdict, out.stored_ratio = out.verdict, out.ratio
    paired = cur.get("paired") or {}
    if paired.get("available"):
        _apply_paired(out, paired, cur, alpha, min_effect)
    return out


def paired_samples(summary: dict[str, Any]) -> list[float]:
    """The paired verdict's samples: uncorrected tok/cpu-s where the workload has a
    machine-speed reference. Within a pair the host's speed already cancels, and the
    correction would only add the reference's own noise (docs/bench.md, paired runs)."""
    return summary.get("uncorrected_samples") or summary["samples"]


def _apply_paired(
    out: Comparison, paired: dict[str, Any], cur: dict[str, Any], alpha: float, min_effect: float
) -> None:
    """The paired verdict decides; stages and host speed against the baseline measured
    in this run, not the stored one."""
    from dflash.bench.paired import paired_verdict

    beside = {"summary": paired["summary"]}
    # Image runs measure the candidate twice: its own in-image run (the record's
    # summary) and its half of each pair; the pairs decide.
    mine = {"summary": paired.get("candidate_summary") or cur["summary"]}
    pr = paired_verdict(
        paired_samples(mine["summary"]), paired_samples(beside["summary"]), alpha, min_effect
    )
    out.method, out.paired, out.verdict = "paired", pr.to_dict(), pr.verdict
    out.ratio, out.ci, out.confidence = pr.ratio, pr.ci, pr.confidence
    out.p_slower, out.p_faster = pr.p_slower, pr.p_faster
    out.stages = stage_changes(beside, mine)
    out.machine_speed = machine_speed(beside, mine)
    if beside["summary"].get("uncorrected_samples"):  # then the verdict's samples are raw:
        out.uncorrected_ratio = pr.ratio  # say what the corrected ones would have given
        out.paired["corrected_ratio"] = paired_verdict(
            mine["summary"]["samples"], beside["summary"]["samples"], alpha, min_effect
        ).ratio
