"""Builders of a run's pieces from its config: device and dtype, tokenizer, target,
drafter, data stream, draft step, optimizer and schedule. dflash/run.py puts them
together per role; nothing else calls them in a different order.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from dflash.config import TINY_TARGET, TrainConfig
from dflash.model import DFlashDraftModel, make_draft_config
from dflash.target import TargetFeatures, choose_mask_token_id, target_layer_ids

# The tiny target is the same network in every run and on every machine: its weights
# come from this seed, not from --seed (which drives the drafter and the data).
TINY_TARGET_SEED = 1234


def resolve_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but torch sees no CUDA device")
    return torch.device(cfg.device)


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 for the frozen target and autocast on GPU; fp32 on CPU (no fast bf16 GEMMs).
    The drafter's master weights stay fp32 either way."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_attn(cfg: TrainConfig, device: torch.device) -> str:
    """flex_attention with a compiled block mask on GPU; the dense SDPA mask on CPU."""
    attn = cfg.attn if cfg.attn != "auto" else ("flex" if device.type == "cuda" else "sdpa")
    if attn == "flex" and cfg.compile and device.type == "cpu":
        # Measured with torch 2.10: inductor compiles flex_attention's forward on CPU but
        # fails lowering its backward ("IndexError: tuple index out of range").
        raise ValueError(
            "--attn flex with --compile cannot train on CPU (inductor has no CPU "
            "flex_attention backward in this torch); use --attn sdpa, the CPU default"
        )
    return attn


def load_tokenizer(cfg: TrainConfig):
    if cfg.preset == "tiny" and not cfg.target:
        from dflash.data.tokenizer import build_tiny_tokenizer

        return build_tiny_tokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg.target, local_files_only=True)


def tiny_target_config(tokenizer_len: int):
    from transformers import Qwen3Config

    # Round the embedding up to a multiple of 64 so padded rows exist, like Qwen3's
    # 151936 rows for 151669 tokens: the first padded row becomes the mask token.
    vocab = (tokenizer_len // 64 + 1) * 64
    return Qwen3Config(vocab_size=vocab, tie_word_embeddings=False, **TINY_TARGET)


def load_target(
    cfg: TrainConfig, tokenizer, device: torch.device, dtype: torch.dtype, attn: str
) -> TargetFeatures:
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    impl = "flex_attention" if attn == "flex" else "sdpa"
    if cfg.preset == "tiny" and not cfg.target:
        config = tiny_target_config(len(tokenizer))
        config._attn_implementation = impl
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TINY_TARGET_SEED)
            model = Qwen3ForCausalLM(config)
    else:
        assert cfg.target  # TrainConfig requires it for every other preset
        model = AutoModelForCausalLM.from_pretrained(  # type: ignore[assignment]
            cfg.target, local_files_only=True, dtype=dtype, attn_implementation=impl
        )
    layer_ids = target_layer_ids(model.config.num_hidden_layers, cfg.num_target_features)
    return TargetFeatures(model, layer_ids).to(device=device, dtype=dtype)


def build_drafter(cfg: TrainConfig, target: TargetFeatures, tokenizer) -> DFlashDraftModel:
    """--arch's drafter over `target`, initialised from --seed."""
    mask_id = choose_mask_token_id(len(tokenizer), target.vocab_size, cfg.mask_token_id)
    shapes: dict[str, Any] = dict(
        num_layers=cfg.draft_layers,
        block_size=cfg.block_size,
        mask_token_id=mask_id,
        target_layer_ids=target.layer_ids,
    )
    if cfg.arch == "dflash2":
        from dflash.model_dflash2 import DFlash2DraftModel, make_dflash2_config

        dcfg = make_dflash2_config(target.config, settings=cfg.dflash2_settings(), **shapes)
        torch.manual_seed(cfg.seed)
        return DFlash2DraftModel(dcfg)
    dcfg = make_draft_config(target.config, **shapes)
    torch.manual_seed(cfg.seed)
    return DFlashDraftModel(dcfg)


def make_stream(cfg: TrainConfig, tokenizer, rank: int = 0, world_size: int = 1):
    from dflash.data.random_stream import RandomStream
    from dflash.data.stream import SampleStream

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if cfg.data == "random":
        return RandomStream(
            vocab_size=len(tokenizer),  # never the mask row or padded rows
            seq_len=cfg.seq_len,
            rows=cfg.rows,
            seed=cfg.seed,
            min_doc_len=cfg.min_doc_len,
            max_doc_len=cfg.max_doc_len,
            rank=rank,
            world_size=world_size,
            pad_id=pad_id,
        )
    from dflash.data.sources import load_records

    records = load_records(cfg.data, skip_bad_rows=cfg.skip_bad_rows)
    return SampleStream(
        records,
        tokenizer,
        seq_len=cfg.seq_len,
        rows=cfg.rows,
        seed=cfg.seed,
        min_loss_tokens=2 * cfg.block_size,  # docs/algorithm.md#data: drop samples with < 2*bs
        rank=rank,
        world_size=world_size,
    )


def build_draft_step(cfg: TrainConfig, drafter, target, device: torch.device, attn: str):
    """DraftStep over the drafter and the target's frozen embedding and LM head."""
    from dflash.draft_step import DraftStep

    create_fn = None
    if attn == "flex" and (cfg.compile or device.type == "cuda"):
        from torch.nn.attention.flex_attention import create_block_mask

        # Uncompiled, create_block_mask materialises the dense Q x KV grid.
        create_fn = torch.compile(create_block_mask)
    step_fn = DraftStep(
        drafter,
        target.embed_tokens,
        target.lm_head,
        gamma=cfg.gamma,
        loss_chunk=cfg.loss_chunk,
        attn=attn,
        create_block_mask_fn=create_fn,
        selector_alpha=cfg.selector_alpha,
    )
    if cfg.compile:
        # Main thread, static shapes (fixed token budget and max_anchors): compiled once.
        drafter.forward = torch.compile(drafter.forward)
    return step_fn


def cosine_lambda(total: int, warmup_ratio: float, min_ratio: float):
    warmup = max(1, math.ceil(total * warmup_ratio)) if warmup_ratio > 0 else 0

    def fn(step: int) -> float:  # step = number of optimizer steps taken so far
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def build_optimizer(cfg: TrainConfig, params):
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, cosine_lambda(cfg.max_steps, cfg.warmup_ratio, cfg.min_lr_ratio)
    )
    return opt, sched
