"""bench/peer_step.py (`just bench-peer`): our drafter step against speculators' DFlash.

The slow test runs the real thing at its smallest setting (2 pairs of fresh processes, one
timed step each), including the build of speculators' own venv (tests/isolated_env.py:
from uv's cache when it holds the wheels, from PyPI otherwise), so the recipe cannot rot.
It checks what the numbers rest on, not their values: both sides trained the same number
of parameters with finite losses, every pair gave a positive ratio, and the last line
printed is the ratio.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "peer_step.py"


def _load():
    return load_script(SCRIPT, "dflash_peer_step")


def test_shapes_refuse_blocks_as_long_as_the_row(capsys):
    peer = _load()
    with pytest.raises(SystemExit) as e:
        peer.main(["--seq-len", "256", "--max-anchors", "32", "--block-size", "8"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--max-anchors x --block-size (256) must be below --seq-len (256)" in err


def test_peer_pins_keep_our_torch():
    """Both sides must run the same torch, or the ratio measures two torch builds."""
    import torch

    pins = dict(p.split("==") for p in _load().PEER_PINS)
    assert pins["torch"] == torch.__version__.split("+")[0]
    assert pins["speculators"] == "0.9.0"


@pytest.mark.slow
def test_peer_step_runs_end_to_end(tmp_path):
    out = tmp_path / "peer.json"
    cmd = [sys.executable, str(SCRIPT), "--repeats", "2", "--steps", "1", "--warmup", "1"]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=1800
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("step time ratio ours/speculators (CPU s, 2 pairs): "), last
    rep = json.loads(out.read_text())
    assert rep["torch"]["ours"] == rep["torch"]["speculators"]
    assert len(rep["pairs"]) == 2 and len(rep["cpu"]["ratios"]) == 2
    assert all(r > 0 and math.isfinite(r) for r in rep["cpu"]["ratios"])
    assert f"{rep['cpu']['ratio']:.3f}" in last
    for pair in rep["pairs"]:
        o, t = pair["ours"], pair["speculators"]
        assert o["trainable_params"] == t["trainable_params"] == rep["trainable_params"] > 0
        for side in (o, t):
            assert all(math.isfinite(s["loss"]) for s in side["warmup"] + side["steps"])
            assert side["peak_rss_mib"] >= side["rss_after_build_mib"] > 0
