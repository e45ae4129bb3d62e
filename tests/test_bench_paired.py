"""The paired verdict (candidate and baseline environments measured in one run), its
early stop, and the bench's input validation. Synthetic samples: no timing here."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
from bench_fakes import make_record, scaled
from test_bench_cli import BASE, parse

from dflash.bench import bench_cli as cli
from dflash.bench.compare import compare
from dflash.bench.paired import paired_verdict
from dflash.bench.runner import DECISIVE_PAIRS, decisive
from dflash.bench.stats import median_interval_achieved


def noisy(n: int, level: float, drift: list[float], seed: int) -> list[float]:
    rng = random.Random(seed)
    return [level * d * math.exp(rng.gauss(0, 0.01)) for d in drift[:n]]


def test_host_drift_cancels_within_pairs():
    # The host's speed moves by 30% across the run; both sides see it pair by pair.
    drift = [1.0, 0.8, 1.1, 0.7, 0.9, 1.2, 0.75, 1.05, 0.85, 1.0]
    base = noisy(10, 10000, drift, 1)
    same = noisy(10, 10000, drift, 2)
    slow = noisy(10, 9000, drift, 3)
    assert paired_verdict(same, base, 0.05, 0.07).verdict == "pass"
    r = paired_verdict(slow, base, 0.05, 0.07)
    assert r.verdict == "regression" and r.p_slower < 0.01
    assert r.ci[0] < 0.9 < r.ci[1] and 0.87 < r.ratio < 0.93
    assert r.confidence >= 0.95 and len(r.ratios) == 10


def test_minimum_effect_and_improvement():
    drift = [1.0] * 10
    base = noisy(10, 10000, drift, 4)
    assert paired_verdict(noisy(10, 9700, drift, 5), base, 0.05, 0.07).verdict == "pass"
    assert paired_verdict(noisy(10, 11500, drift, 6), base, 0.05, 0.07).verdict == "improvement"


def test_p_value_is_scipys_exact_wilcoxon():
    # All 6 pairs slower: the exact one-sided p of the signed-rank test is 1/2**6.
    r = paired_verdict([90.0, 91, 92, 93, 94, 95], [100.0] * 6, 0.05, 0.0)
    assert r.p_slower == pytest.approx(1 / 64) and r.verdict == "regression"


def test_median_interval_order_statistics_and_confidence():
    lo, hi, conf = median_interval_achieved(list(range(10)), 0.95)
    # Binomial(10, 1/2): P(B <= 1) = 11/1024, so [x_(2), x_(9)] with 1 - 22/1024.
    assert (lo, hi) == (1, 8) and conf == pytest.approx(1 - 22 / 1024)


def test_identical_pairs_give_no_evidence():
    r = paired_verdict([100.0] * 5, [100.0] * 5, 0.05, 0.0)
    assert r.p_slower == r.p_faster == 1.0 and r.verdict == "pass"


def test_paired_input_errors():
    with pytest.raises(ValueError, match="same number"):
        paired_verdict([1.0, 2.0], [1.0], 0.05, 0.05)
    with pytest.raises(ValueError, match="at least 2"):
        paired_verdict([1.0], [1.0], 0.05, 0.05)


def test_decisive_needs_enough_pairs_all_beyond_two_x():
    assert not decisive([0.1] * (DECISIVE_PAIRS - 1))
    assert decisive([0.1] * DECISIVE_PAIRS)
    assert decisive([3.0] * DECISIVE_PAIRS)
    assert not decisive([0.1] * (DECISIVE_PAIRS - 1) + [0.9])


def with_paired(cur: dict, base_beside: dict) -> dict:
    out = copy.deepcopy(cur)
    out["paired"] = {
        "available": True,
        "env": {"origin": "lock abc (extra cu128), this checkout"},
        "repeats": [],
        "summary": copy.deepcopy(base_beside["summary"]),
    }
    return out


def test_loaded_baseline_hour_does_not_cry_wolf_when_paired():
    # The stored baseline ran on a faster hour: its numbers say 0.85x. Measured beside
    # this run, the baseline's environment is just as slow: no regression.
    stored = make_record(BASE)
    now = scaled(stored, 0.85)
    beside = scaled(stored, 0.85)
    beside["summary"]["samples"] = [
        v * f
        for v, f in zip(beside["summary"]["samples"], [1.01, 0.98, 1.02, 0.99, 1.0], strict=True)
    ]
    c = compare(stored, with_paired(now, beside))
    assert c.method == "paired" and c.verdict == "pass"
    assert c.stored_verdict == "regression"
    lines = "\n".join(cli_report(stored, with_paired(now, beside)))
    assert "PASS" in lines and "the host (load) or the code changed" in lines


def test_paired_regression_exits_1_and_names_the_package(tmp_path, monkeypatch, capsys):
    base = make_record(BASE, distributions={"torch": "2.10.0", "numpy": "2.1.0"})
    slow = scaled(base, 0.8)
    slow["environment"]["manifest"]["distributions"]["busy-telemetry"] = "1.0"
    queue = [base, with_paired(slow, base)]
    monkeypatch.setattr(cli, "measure", lambda args: queue.pop(0))
    assert cli.run(parse("run", "--store", str(tmp_path))) == 0
    capsys.readouterr()
    assert cli.run(parse("run", "--store", str(tmp_path))) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "measured beside this one" in out
    assert "busy-telemetry" in out


def cli_report(base: dict, cur: dict) -> list[str]:
    from dflash.bench.report import comparison_lines

    return comparison_lines(base, cur, compare(base, cur))


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"a": 1}', "not a bench record (missing workload, hardware, environment, summary)"),
        ("[1, 2]", "not a bench record (a JSON object is expected)"),
        ("{oops", "not JSON (line 1"),
    ],
)
def test_compare_names_the_bad_file(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(make_record(BASE)))
    code = cli.run(parse("compare", str(bad), str(good), "--store", str(tmp_path)))
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"dflash bench compare: {bad}: {message}")


def test_bad_flags_and_refs_are_named(tmp_path, capsys):
    assert cli.run(parse("run", "--repeats", "1", "--store", str(tmp_path))) == 2
    assert "--repeats 1: at least 2" in capsys.readouterr().err
    assert cli.run(parse("compare", "nope", "nada", "--store", str(tmp_path))) == 2
    assert "nope: no such file, and no record id starting with it" in capsys.readouterr().err
    f = tmp_path / "file"
    f.write_text("")
    assert cli.run(parse("list", "--store", str(f))) == 2
    assert "not a directory" in capsys.readouterr().err


def test_baseline_runs_with_its_recorded_variables_only(monkeypatch):
    from pathlib import Path

    from dflash.bench.envs import BenchEnv

    base = make_record(BASE, variables={"OMP_NUM_THREADS": "1"})
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")  # only this run has it
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    env = cli.with_baseline_variables(BenchEnv(Path("/venv/bin/python"), "baseline"), base)
    e = env.environ()
    assert "MKL_ENABLE_INSTRUCTIONS" not in e and e["OMP_NUM_THREADS"] == "1"
