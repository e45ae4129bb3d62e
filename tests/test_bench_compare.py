"""Comparison rules: refusal of unlike records, verdicts, stage attribution, env diff."""

from __future__ import annotations

import pytest
from bench_fakes import make_record, scaled

from dflash.bench.compare import compare
from dflash.bench.envdiff import environment_diff
from dflash.bench.report import comparison_lines

BASE = [10000.0, 10400.0, 9800.0, 10150.0, 9950.0]


def test_same_distribution_passes():
    base = make_record(BASE)
    cur = make_record([10100.0, 9900.0, 10300.0, 10000.0, 9850.0])
    c = compare(base, cur)
    assert c.verdict == "pass" and c.exit_code == 0
    assert c.ci[0] < 1.0 < c.ci[1]


def test_twenty_percent_drop_is_a_regression_with_exit_1():
    base = make_record(BASE)
    cur = scaled(base, 0.8)
    c = compare(base, cur)
    assert c.verdict == "regression" and c.exit_code == 1
    assert c.ratio == pytest.approx(0.8)
    assert c.ci[1] < 1.0


def test_significant_but_tiny_change_is_not_a_regression():
    # Complete separation (p = 1/252) but only 2% slower: below the minimum effect.
    base = make_record([10000.0, 10010.0, 10020.0, 10030.0, 10040.0])
    c = compare(base, scaled(base, 0.98))
    assert c.p_slower == 1 / 252
    assert c.verdict == "pass"


def test_large_but_noisy_change_is_not_a_regression():
    base = make_record([10000.0, 5000.0, 15000.0, 7000.0, 13000.0])
    cur = make_record([9000.0, 4600.0, 14000.0, 6000.0, 12500.0])
    c = compare(base, cur)
    assert c.ratio < 0.95 and c.p_slower > 0.05
    assert c.verdict == "pass"


def test_improvement_is_reported_and_passes():
    base = make_record(BASE)
    c = compare(base, scaled(base, 1.3))
    assert c.verdict == "improvement" and c.exit_code == 0


def test_different_workload_is_refused_with_the_reason():
    c = compare(make_record(BASE), make_record(BASE, workload="qwen3-8b-1gpu"))
    assert c.verdict == "refused" and c.exit_code == 3
    assert any("different workloads" in r for r in c.reasons)
    assert c.ratio is None


def test_different_topology_is_refused_with_the_reason():
    c = compare(make_record(BASE), make_record(BASE, targets=2, drafters=1))
    assert c.verdict == "refused"
    assert any(
        "topology: baseline 1T+1D/colocated, this run 2T+1D/colocated" in r for r in c.reasons
    )


def test_edited_workload_definition_is_refused_and_the_field_named():
    c = compare(make_record(BASE), make_record(BASE, max_anchors=64))
    assert c.verdict == "refused"
    assert any("max_anchors: 32 -> 64" in r for r in c.reasons)


def test_more_repeats_stay_comparable():
    base = make_record(BASE)
    cur = make_record(BASE + [10050.0, 9990.0], repeats=7)
    assert compare(base, cur).verdict == "pass"


def test_different_hardware_and_variant_are_refused():
    c = compare(make_record(BASE), make_record(BASE, cpu_count=4, variant="cu130"))
    assert any("different hardware: cpu_count: 2 -> 4" in r for r in c.reasons)
    assert any("different CUDA variant" in r for r in c.reasons)


def test_stage_attribution_names_the_stage_that_slowed():
    base = make_record(BASE, stages_ms={"target": 50.0, "drafter_fwd": 30.0, "optimizer": 2.0})
    cur = make_record(
        [v * 0.7 for v in BASE],
        stages_ms={"target": 90.0, "drafter_fwd": 31.0, "optimizer": 2.0},
    )
    c = compare(base, cur)
    assert c.verdict == "regression"
    assert c.stages[0]["stage"] == "target"
    assert 0.9 < c.stages[0]["share"] <= 1.0


def test_environment_diff_names_variable_package_and_doctor_finding():
    base = make_record(BASE)
    cur = make_record(
        [v * 0.6 for v in BASE],
        variables={"ATEN_CPU_CAPABILITY": "default"},
        distributions={"torch": "2.10.0", "numpy": "2.1.0", "nvidia-cublas": "13.0.0"},
    )
    cur["environment"]["doctor"]["findings"] = [
        {"severity": "error", "code": "CUDA_MIXED", "message": "cu13 wheel in a cu128 env"}
    ]
    diff = environment_diff(base, cur)
    assert (
        "variable: + ATEN_CPU_CAPABILITY=default (forces ATen's scalar CPU kernels: no "
        "AVX2/AVX-512 vectorisation)" in diff
    )
    assert any("nvidia-cublas" in line and "+" in line for line in diff)
    assert any("CUDA_MIXED" in line for line in diff)
    text = "\n".join(comparison_lines(base, cur, compare(base, cur)))
    assert text.startswith("REGRESSION")
    assert "ATEN_CPU_CAPABILITY" in text and "nvidia-cublas" in text


def test_unchanged_environment_reports_no_change():
    base = make_record(BASE)
    cur = make_record(BASE)
    assert environment_diff(base, cur) == []


def test_colocated_and_pipeline_runs_are_refused():
    c = compare(make_record(BASE), make_record(BASE, workload="tiny-cpu-pipe"))
    assert c.verdict == "refused"
    assert any("1T+1D/colocated, this run 1T+1D/pipeline" in r for r in c.reasons)


def test_slower_host_alone_is_not_a_regression():
    # Another tenant makes everything 20% slower: raw tok/cpu-s drops, the reference
    # kernel slows by as much, and the corrected comparison passes, saying why.
    base = make_record(BASE, reference_ms=14.0)
    cur = scaled(base, 1.0, host=0.8)
    c = compare(base, cur)
    assert c.verdict == "pass"
    assert c.machine_speed == pytest.approx(0.8)
    assert c.uncorrected_ratio == pytest.approx(0.8)
    text = "\n".join(comparison_lines(base, cur, c))
    assert "host speed (reference kernel) 0.800x" in text
    assert "uncorrected tok/cpu-s ratio 0.800x" in text


def test_regression_hidden_by_a_faster_host_is_still_found():
    # 15% slower code on a host that happens to run 15% faster: raw numbers barely
    # move, the corrected ratio shows the regression and the stages are put back at
    # the baseline's host speed, so the one that grew is named.
    base = make_record(BASE, reference_ms=14.0, stages_ms={"target": 50.0, "drafter_fwd": 30.0})
    cur = scaled(base, 0.85, host=1.15)
    cur["summary"]["stages_s"] = {"target": 0.0641 / 1.15, "drafter_fwd": 0.030 / 1.15}
    cur["summary"]["step_s"] = sum(cur["summary"]["stages_s"].values())
    c = compare(base, cur)
    assert c.uncorrected_ratio == pytest.approx(0.85 * 1.15)
    assert c.verdict == "regression" and c.ratio == pytest.approx(0.85)
    assert c.stages[0]["stage"] == "target"
    assert c.stages[0]["current_ms"] == pytest.approx(64.1)
    assert c.stages[1]["current_ms"] == pytest.approx(30.0)
    assert 0.99 < c.stages[0]["share"] <= 1.0


def test_records_without_a_reference_report_no_host_speed():
    base = make_record(BASE)
    c = compare(base, scaled(base, 0.8))
    assert c.machine_speed is None and c.uncorrected_ratio is None
    assert "host speed" not in "\n".join(comparison_lines(base, scaled(base, 0.8), c))


def test_environment_diff_says_what_a_known_bad_setting_costs():
    base = make_record([100.0] * 5)
    cur = scaled(base, 0.5)
    cur["settings"]["variables"]["ATEN_CPU_CAPABILITY"] = "default"
    lines = environment_diff(base, cur)
    assert "variable: + ATEN_CPU_CAPABILITY=default (forces ATen's scalar CPU kernels" in "\n".join(
        lines
    )
