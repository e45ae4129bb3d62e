"""`dflash demo` end to end with the reduced recipe; the second run reuses the cache."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from dflash.demo.corpus import SPLITS, build_samples, split_of, stdlib_files
from dflash.demo.recipe import QUICK, Recipe


def test_corpus_splits_are_disjoint_and_stable():
    files = stdlib_files()
    by_split = {s: {f.name for f in files if split_of(f, (80, 12, 8)) == s} for s in SPLITS}
    assert all(by_split.values())
    assert not (by_split["eval"] & (by_split["target"] | by_split["drafter"]))
    samples = build_samples((80, 12, 8), 240, 240)
    eval_files = {s["id"].split(":")[0] for s in samples["eval"]}
    train_files = {s["id"].split(":")[0] for s in samples["target"] + samples["drafter"]}
    assert not eval_files & train_files  # held-out prompts come from unseen files
    assert all(len(s["response"]) <= 240 for s in samples["eval"])


def test_cache_key_depends_on_target_fields_only():
    assert Recipe(draft_steps=1).cache_key() == Recipe().cache_key()
    assert Recipe(target_steps=1).cache_key() != Recipe().cache_key()


def _demo(*args: str) -> tuple[int, str]:
    from dflash.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["demo", "--recipe", "quick", *args])
    return rc, out.getvalue()


@pytest.mark.slow
def test_demo_end_to_end_quick(tmp_path):
    cache = tmp_path / "cache"
    rc, stdout = _demo("--out", str(tmp_path / "run1"), "--cache-dir", str(cache))
    assert rc == 0, stdout
    s = json.loads(stdout.strip().splitlines()[-1])
    assert s["lossless"] is True and s["mismatches"] == []
    assert 1.0 <= s["tau"] <= QUICK.block_size and s["speedup"] > 0
    assert len(s["tau_curve"]) == QUICK.checkpoints
    assert (tmp_path / "run1" / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (tmp_path / "run1" / "eval.jsonl").read_text().splitlines()
    assert len(rows) == QUICK.eval_prompts
    # the target is an ordinary HF directory with a chat template
    target = cache / QUICK.cache_key() / "target"
    assert (
        json.loads((target / "tokenizer_config.json").read_text()).get("chat_template")
        or (target / "chat_template.jinja").exists()
    )

    # The second run also trains a DFlash2 drafter on the same data and budget.
    rc, stdout = _demo(
        "--out", str(tmp_path / "run2"), "--cache-dir", str(cache), "--arch", "dflash2"
    )
    assert rc == 0, stdout
    assert "reusing cached target" in stdout
    assert f'"skipped": {QUICK.regen_prompts}, "written": 0' in stdout
    s2 = json.loads(stdout.strip().splitlines()[-1])
    two = s2["dflash2"]
    assert two["lossless"] is True and 1.0 <= two["tau"] <= QUICK.block_size
    assert f"tau {two['tau']:.2f} vs {s2['tau']:.2f}" in stdout  # side by side
    cfg = json.loads((tmp_path / "run2" / "train-dflash2" / "drafter" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"]
