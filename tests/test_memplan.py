"""dflash/memplan.py: its byte count against torch.profiler's record of real CPU
allocations, FakeTensors against real tensors, the chunked loss, the Qwen3-8B weights
against their closed form, and `dflash train --plan`."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from dflash import memplan, train_cli
from dflash.config import TrainConfig

# Big enough that activations, not fixed overheads, make the peak; a few seconds on CPU.
SMALL = dict(seq_len=1024, max_anchors=64, loss_chunk=64, wandb="off")


def small(**kw) -> TrainConfig:
    return TrainConfig(out="unused", preset="tiny", **{**SMALL, **kw})


def profiler_peak(fn) -> int:
    """Peak of the bytes the CPU allocator handed out while `fn` ran (every allocation,
    not only tensors that ops return): the independent measurement."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()  # negative for a free
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(
    "gpu, attn",
    [(False, "sdpa"), (True, "sdpa")],
    ids=["fp32", "bf16-autocast"],
)
def test_count_matches_real_allocations(gpu, attn):
    """On real tensors the count's peak is the allocator's within 5% in fp32 (measured 0.1%)
    and 15% under bf16 autocast, whose CPU kernels' own scratch varies with the process's
    state (measured 3% alone, 9.6% late in a full suite run: 12.33 MB counted against
    11.24 MB allocated), and FakeTensors give byte for byte what real tensors do."""
    cfg = small(attn=attn)
    tcfg = memplan.target_config(cfg)
    real = {}
    peak = profiler_peak(lambda: real.update(memplan.measure(cfg, tcfg, gpu=gpu, fake=False)))
    counted = max(real["step_peak"], real["opt_peak"])
    assert abs(peak - counted) / peak < (0.15 if gpu else 0.05), (peak, counted)
    assert memplan.measure(cfg, tcfg, gpu=gpu, fake=True) == real


def test_chunked_loss_lowers_the_peak():
    cfg = small()  # 64 anchors x block 8 = 512 logits rows, in chunks of 64
    p = memplan.plan(cfg)
    assert p.block_tokens == 512
    assert p.step_peak < p.step_peak_one_chunk
    assert p.total(chunked=True) < p.total(chunked=False)
    assert p.total(single=False) == p.total() - p.trunk
    assert "step peak, --loss-chunk 64" in p.table()


def test_qwen3_8b_plan_at_real_shapes():
    """The published Qwen3-8B shapes: weights and AdamW state in closed form; one logits
    chunk of 8192 rows costs at least the fp32 logits of the 4096 rows chunking spares."""
    cfg = TrainConfig(out="unused", preset="qwen3-8b", target="Qwen/Qwen3-8B")
    p = memplan.plan(cfg)
    h, inter, heads, kv, hd, vocab = 4096, 12288, 32, 8, 128, 151936
    layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * inter + 2 * h + 2 * hd
    params = 5 * h * h + 5 * layer + 2 * h  # fc, layers, hidden_norm + final norm
    assert p.weights == 4 * params  # fp32 master weights
    assert p.frozen == 2 * (2 * vocab * h)  # bf16 embedding + LM head, untied
    assert p.trunk == 2 * 34 * layer  # bf16 target layers 0..33 (features up to 33)
    assert 0 < p.target_peak < p.step_peak
    assert 2 * p.weights <= p.optimizer < 2 * p.weights + 4096  # + per-param step counters
    assert p.step_peak_one_chunk - p.step_peak >= (8192 - 4096) * vocab * 4
    assert p.total(single=False) < 80 * memplan.GIB


def test_train_plan_cli(capsys):
    ok = subprocess.run(
        [sys.executable, "-m", "dflash", "train", "--plan", "--preset", "tiny"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    assert "step peak, --loss-chunk 512" in ok.stdout and "total, pipeline drafter" in ok.stdout
    args = train_cli.parser().parse_args(
        ["--plan", "--preset", "qwen3-8b", "--target", "/nonexistent"]
    )
    assert train_cli.run(args) == 2
    err = capsys.readouterr().err
    assert "/nonexistent/config.json" in err and "Qwen/Qwen3-8B" in err


def test_live_bytes_counts_views_once_and_frees():
    live = memplan.LiveBytes()
    with live:
        a = torch.ones(1000)
        b = a.view(10, 100)  # same storage
        assert live.live == 4000
        del a, b
    assert live.live == 0 and live.peak == 4000
