"""Build the pieces of a run from its config: device, tokenizer, target, drafter, data."""

from __future__ import annotations

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
        model = AutoModelForCausalLM.from_pretrained(
            cfg.target, local_files_only=True, dtype=dtype, attn_implementation=impl
        )
    layer_ids = target_layer_ids(model.config.num_hidden_layers, cfg.num_target_features)
    return TargetFeatures(model, layer_ids).to(device=device, dtype=dtype)


def build_drafter(cfg: TrainConfig, target: TargetFeatures, tokenizer) -> DFlashDraftModel:
    mask_id = choose_mask_token_id(len(tokenizer), target.vocab_size, cfg.mask_token_id)
    dcfg = make_draft_config(
        target.config,
        num_layers=cfg.draft_layers,
        block_size=cfg.block_size,
        mask_token_id=mask_id,
        target_layer_ids=target.layer_ids,
    )
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
        min_loss_tokens=2 * cfg.block_size,  # DFLASH.md: drop samples with < 2*bs
        rank=rank,
        world_size=world_size,
    )
