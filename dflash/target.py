"""Frozen target LLM: which layers feed the drafter, the mask token, and the feature pass.

The feature pass runs the target's own decoder layers up to the deepest selected one
and stops: later layers and the LM head are never run. On packed rows it is
document-causal, or features would leak across documents.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from dflash.visibility import document_causal_block_mask, document_causal_dense


class TargetMismatch(ValueError):
    """The target cannot serve the requested drafter (depth, mask row, ...)."""


def target_layer_ids(num_target_layers: int, num_features: int = 5) -> list[int]:
    """k layers spread evenly from layer 1 to layer L-3 (0-based): round(1 + i*(L-4)/(k-1)).

    Qwen3-8B (L=36, k=5) -> [1, 9, 17, 25, 33].
    """
    need = num_features + 3
    if num_features < 1:
        raise TargetMismatch(f"--num-target-features must be >= 1, got {num_features}")
    if num_target_layers < need:
        raise TargetMismatch(
            f"target has {num_target_layers} layers; {num_features} target features spread "
            f"from layer 1 to L-3 need at least {need} layers. Use a deeper target or lower "
            "--num-target-features"
        )
    if num_features == 1:
        return [1]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_features - 1)) for i in range(num_features)]


def choose_mask_token_id(tokenizer_len: int, vocab_size: int, requested: int | None = None) -> int:
    """The mask token: an existing embedding row that the tokenizer never produces.

    By default the first padded row (Qwen3: tokenizer 151669 tokens, 151936 rows -> 151669).
    A row added by resizing would be frozen with the embedding and never learn.
    """
    if requested is not None:
        if not 0 <= requested < vocab_size:
            raise TargetMismatch(
                f"--mask-token-id {requested} is outside the target embedding (0..{vocab_size - 1})"
            )
        return requested
    if tokenizer_len < vocab_size:
        return tokenizer_len
    raise TargetMismatch(
        f"the target has no usable mask row: its embedding has {vocab_size} rows and the "
        f"tokenizer uses all {tokenizer_len}. The mask token must be an existing row that "
        "is otherwise unused (resizing adds a frozen row that never learns). Pass "
        "--mask-token-id with a row the data never uses, or use a target with padded rows."
    )


class TargetFeatures(nn.Module):
    """Wraps a HF causal LM (Qwen3 family) and returns concatenated features of the
    selected layers, [B, S, k*H], frozen, without running later layers or the LM head."""

    def __init__(self, causal_lm: nn.Module, layer_ids: list[int]):
        super().__init__()
        base: Any = getattr(causal_lm, str(causal_lm.base_model_prefix))
        n_layers = len(base.layers)
        if max(layer_ids) >= n_layers:
            raise TargetMismatch(
                f"target layer ids {layer_ids} exceed the target's {n_layers} layers"
            )
        types = getattr(causal_lm.config, "layer_types", None) or []
        if any(t != "full_attention" for t in types[: max(layer_ids) + 1]):
            raise TargetMismatch("targets with sliding-window layers are not supported")
        self.config: Any = causal_lm.config
        self.layer_ids = list(layer_ids)
        self.embed_tokens = base.embed_tokens
        self.rotary_emb: Any = base.rotary_emb
        self.layers: Any = base.layers[: max(layer_ids) + 1]  # stop after the last needed layer
        self.lm_head: Any = causal_lm.get_output_embeddings()  # type: ignore[operator]
        self.requires_grad_(False)
        self.eval()

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.embed_tokens.weight.shape[0])

    def attention_mask(self, doc_ids: Tensor, create_fn=None):
        if self.config._attn_implementation == "flex_attention":
            return document_causal_block_mask(doc_ids, create_fn)
        return document_causal_dense(doc_ids)

    @torch.no_grad()
    def forward(
        self, input_ids: Tensor, positions: Tensor, doc_ids: Tensor, mask=None, out=None
    ) -> Tensor:
        """Features [B, S, k*H]; `out`: written in place (a pipeline target writes them
        straight into the message it sends, dflash/distributed/p2p.py)."""
        mask = self.attention_mask(doc_ids) if mask is None else mask
        h = self.embed_tokens(input_ids)
        rope = self.rotary_emb(h, positions)  # positions restart at 0 per document
        feats = []
        for i, layer in enumerate(self.layers):
            h = layer(h, attention_mask=mask, position_ids=positions, position_embeddings=rope)
            if i in self.layer_ids:
                feats.append(h)
        return torch.cat(feats, dim=-1, out=out)


def eos_ids_of(tok, model) -> set[int]:
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tok.unk_token_id:
        ids.add(im_end)  # ChatML end of turn: where a chat response stops
    gen = getattr(model.generation_config, "eos_token_id", None)
    ids |= set(gen if isinstance(gen, list) else [gen] if gen is not None else [])
    return ids
