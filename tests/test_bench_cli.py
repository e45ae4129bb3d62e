"""`dflash bench` flows: first run, pass, regression, refusal, accept, history.

The measurement itself is replaced by synthetic records (measuring speed in a unit
test would make it flaky); test_bench_worker.py runs the real worker.
"""

from __future__ import annotations

import argparse

import pytest
from bench_fakes import make_record, scaled

from dflash.bench import bench_cli as cli
from dflash.bench.store import Store

BASE = [10000.0, 10400.0, 9800.0, 10150.0, 9950.0]


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture
def bench(tmp_path, monkeypatch, capsys):
    queue: list[dict] = []
    monkeypatch.setattr(cli, "measure", lambda args: queue.pop(0))

    def run(rec: dict, *extra: str) -> tuple[int, str]:
        queue.append(rec)
        code = cli.run(parse("run", "--store", str(tmp_path), *extra))
        return code, capsys.readouterr().out

    return run, Store(tmp_path)


def test_first_run_auto_accepts_then_same_environment_passes(bench):
    run, store = bench
    first = make_record(BASE)
    code, out = run(first)
    assert code == 0 and "auto-accepted" in out
    code, out = run(make_record([10100.0, 9900.0, 10300.0, 10000.0, 9850.0]))
    assert code == 0 and "PASS" in out
    assert len(store.records("tiny-cpu")) == 2
    assert store.records("tiny-cpu")[1]["comparison"]["baseline_id"] == first["id"]


def test_slower_environment_exits_1_and_names_the_change(bench):
    run, _ = bench
    base = make_record(BASE)
    run(base)
    slow = scaled(base, 0.7)
    slow["settings"]["variables"]["ATEN_CPU_CAPABILITY"] = "default"
    code, out = run(slow)
    assert code == 1
    assert "REGRESSION" in out and "ATEN_CPU_CAPABILITY=default" in out


def test_dirty_first_run_is_recorded_but_not_accepted(bench):
    run, store = bench
    code, out = run(make_record(BASE, dirty=True))
    assert code == 0 and "recorded only" in out
    assert not store.promotions()


def test_no_auto_accept_flag(bench):
    run, store = bench
    code, out = run(make_record(BASE), "--no-auto-accept")
    assert code == 0 and "recorded only" in out and not store.promotions()


def test_accept_promotes_latest_of_this_machine_and_refuses_dirty(bench, capsys, monkeypatch):
    from dflash.bench import hardware

    run, store = bench
    here = make_record(BASE)["hardware"]
    monkeypatch.setattr(hardware, "hardware_fingerprint", lambda: here)
    run(make_record(BASE))
    run(scaled(make_record(BASE), 0.7))  # a regression, recorded
    mine = store.records("tiny-cpu")[-1]
    run(make_record(BASE, cpu_count=64))  # another machine sharing the store, later
    assert cli.run(parse("accept", "--store", str(store.root), "--reason", "intended")) == 0
    assert store.promotions()[-1]["record"] == mine["id"]
    assert store.promotions()[-1]["reason"] == "intended"
    run(make_record(BASE, dirty=True))
    assert cli.run(parse("accept", "--store", str(store.root))) == 2
    assert "dirty" in capsys.readouterr().out


def test_compare_refuses_different_topology(bench, capsys):
    _, store = bench
    a, b = make_record(BASE), make_record(BASE, targets=2, drafters=1)
    store.add(a)
    store.add(b)
    code = cli.run(parse("compare", a["id"], b["id"], "--store", str(store.root)))
    out = capsys.readouterr().out
    assert code == 3
    assert "REFUSED" in out and "different topology" in out


def test_history_writes_markdown_and_png(bench, tmp_path):
    run, store = bench
    base = make_record(BASE, t=1.7e9)
    run(base)
    run(scaled(base, 0.98, time_unix=1.7e9 + 86400))
    run(scaled(base, 0.6, time_unix=1.7e9 + 2 * 86400))
    out = tmp_path / "report"
    assert cli.run(parse("history", "--store", str(store.root), "--out", str(out))) == 0
    md = (out / "tiny-cpu.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| 20")]
    assert len(rows) == 3 and "1 regressions" in md and "(baseline)" in md
    png = (out / "tiny-cpu.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_bench_is_a_dflash_command():
    from dflash.cli import COMMANDS

    assert COMMANDS["bench"][0] == "dflash.bench.bench_cli"
