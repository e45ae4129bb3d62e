"""A workload's run, built by the trainer's own setup (dflash/run.py), without any download.

The target is a random-weight Qwen3ForCausalLM built from the workload's config and
the tokenizer is the tiny local one: data is random, so only the embedding size
matters, and it is padded up to the target's vocabulary (the first padded row is the
mask token, as for Qwen3). Everything else is the trainer's own `build_run` (drafter,
DraftStep, optimizer, data stream), so the bench times what `dflash train` runs.
"""

from __future__ import annotations

import torch

from dflash.bench.workloads import Workload
from dflash.config import TrainConfig
from dflash.target import TargetFeatures, target_layer_ids

TARGET_SEED = 1234  # the same random target in every repeat, like the tiny preset's


def train_config(w: Workload, out: str) -> TrainConfig:
    return TrainConfig(
        out=out,
        preset="tiny",  # the tiny preset needs no --target; every shape is set below
        seq_len=w.seq_len,
        rows=w.rows,
        block_size=w.block_size,
        max_anchors=w.max_anchors,
        draft_layers=w.draft_layers,
        max_steps=w.warmup_steps + w.steps + 1,
        min_doc_len=w.min_doc_len,
        max_doc_len=w.max_doc_len,
        compile=w.compile,
        attn=w.attn,
        device=w.device,
        wandb="off",
        seed=w.seed,
    )


def target_config(w: Workload, tokenizer_len: int):
    from transformers import Qwen3Config

    fields = dict(w.target)
    if fields.get("vocab_size") is None:
        fields["vocab_size"] = (tokenizer_len // 64 + 1) * 64  # as the tiny preset pads
    if fields["vocab_size"] <= tokenizer_len:
        raise ValueError("the target vocabulary must exceed the tokenizer's (mask row)")
    return Qwen3Config(tie_word_embeddings=False, **fields)


def build_target(w: Workload, tokenizer_len: int, device, dtype, attn: str) -> TargetFeatures:
    from transformers import Qwen3ForCausalLM

    config = target_config(w, tokenizer_len)
    config._attn_implementation = "flex_attention" if attn == "flex" else "sdpa"
    # Built directly on the device in its dtype: an 8B model initialised on the host in
    # fp32 would take 32 GB and minutes before the first step.
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(TARGET_SEED)
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    ids = target_layer_ids(config.num_hidden_layers, 5)
    return TargetFeatures(model, ids).to(device=device, dtype=dtype)


def build(w: Workload, out: str):
    """The workload's dflash.run.Run (single role) with its own random target."""
    from dflash.run import build_run

    def make_target(tokenizer, device, dtype, attn: str) -> TargetFeatures:
        return build_target(w, len(tokenizer), device, dtype, attn)

    return build_run(train_config(w, out), "single", make_target=make_target)
