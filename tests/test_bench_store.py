"""Results store: immutable records, baselines, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest
from bench_fakes import make_record

from dflash.bench.store import BenchInputError, Store, baseline_key


def test_records_are_never_overwritten(tmp_path):
    store = Store(tmp_path)
    rec = make_record([1.0, 2.0])
    p1 = store.add(rec)
    p2 = store.add(dict(rec))
    assert p1 != p2 and p1.exists() and p2.exists()
    assert [r["id"] for r in store.records("tiny-cpu")] == sorted([p1.stem, p2.stem])


def test_accept_and_compare_and_set(tmp_path):
    store = Store(tmp_path)
    a, b = make_record([1.0]), make_record([2.0])
    store.add(a)
    store.add(b)
    key = baseline_key(a)
    assert store.baseline(key) is None
    assert store.accept(a, reason="first", only_if_absent=True)
    assert not store.accept(b, reason="second", only_if_absent=True)
    assert store.baseline(key)["id"] == a["id"]
    assert store.accept(b, reason="by hand")
    assert store.baseline(key)["id"] == b["id"]
    assert [p["record"] for p in store.promotions()] == [a["id"], b["id"]]


def test_find_by_prefix_and_missing(tmp_path):
    store = Store(tmp_path)
    rec = make_record([1.0])
    path = store.add(rec)
    assert store.find(rec["id"][:20])["id"] == rec["id"]
    assert store.find(str(path))["id"] == rec["id"]
    with pytest.raises(BenchInputError, match="nope: no such file, and no record id"):
        store.find("nope")


def test_store_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DFLASH_BENCH_STORE", str(tmp_path / "s"))
    assert Store().root == tmp_path / "s"


def _writer(root: str, n: int, i: int) -> None:
    store = Store(root)
    for j in range(n):
        rec = make_record([float(i * 100 + j + 1)])
        store.add(rec)
        store.accept(rec, reason=f"writer {i}", only_if_absent=(j % 2 == 0))


def test_concurrent_writers_cannot_corrupt_the_store(tmp_path):
    procs = [
        mp.get_context("fork").Process(target=_writer, args=(str(tmp_path), 15, i))
        for i in range(6)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store = Store(tmp_path)
    records = store.records("tiny-cpu")
    assert len(records) == 90 and len({r["id"] for r in records}) == 90
    # Every file is complete JSON, no temporary file is left behind, the pointer is valid.
    assert not list(tmp_path.rglob(".tmp-*"))
    key = baseline_key(records[0])
    base = store.baseline(key)
    assert base["id"] in {r["id"] for r in records}
    promos = store.promotions()
    assert len(promos) >= 6 * 7  # every accept without only_if_absent is logged
    assert all(json.dumps(p) for p in promos)
    assert base["id"] == promos[-1]["record"]
