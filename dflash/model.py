"""DFlash drafter architecture (architecture only: no parallelism, compile or loss here).

N Qwen3-style decoder layers of the target's hidden size. Fused target features
ctx = hidden_norm(fc(cat(h_l1..h_lk))) enter every layer ONLY as extra keys/values:
    Q = q_norm(q_proj(x))                 from the block alone
    K = k_norm(k_proj([ctx ; x]))         context first, then the block
    V = v_proj([ctx ; x])
RoPE positions are [context positions ; block positions]. The embedding and LM head
are the target's (frozen) and are not part of this module or its checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    rotate_half,
)

from dflash.export import config_from_dict, load_config, write_config

ARCHITECTURE = "DFlashDraftModel"


def make_draft_config(
    target_config: Qwen3Config,
    *,
    num_layers: int,
    block_size: int,
    mask_token_id: int,
    target_layer_ids: list[int],
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
) -> Qwen3Config:
    """Drafter config in the loader format: the target's dimensions and RoPE, drafter depth,
    plus block_size, num_target_layers and dflash_config (see dflash.export).

    `layer_types` defaults to full attention everywhere; sliding_attention layers (with
    `sliding_window`) must follow the full ones."""
    fields = target_config.to_dict()
    for drop in ("architectures", "model_type", "transformers_version", "_name_or_path"):
        fields.pop(drop, None)
    # The target's legacy layer statement describes the target, not the drafter.
    for drop in ("max_window_layers", "use_sliding_window"):
        fields.pop(drop, None)
    fields.update(
        num_hidden_layers=num_layers,
        layer_types=list(layer_types) if layer_types else ["full_attention"] * num_layers,
        sliding_window=sliding_window,
        block_size=block_size,
        num_target_layers=target_config.num_hidden_layers,
        dflash_config={
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(target_layer_ids),
            "block_size": block_size,
        },
        architectures=[ARCHITECTURE],
        tie_word_embeddings=False,
        use_cache=False,
    )
    if sliding_window is not None:
        fields["use_sliding_window"] = True
        fields["dflash_config"]["causal_in_block"] = [
            t == "sliding_attention" for t in fields["layer_types"]
        ]
    return config_from_dict(fields, "make_draft_config")


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x: [B, heads, L, D]; cos/sin: [B, L, D]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


def attend(q: Tensor, k: Tensor, v: Tensor, mask, scale: float) -> Tensor:
    """Attention over [ctx ; block] keys with either a flex BlockMask or a dense bool mask.

    Both return 0 for queries that see nothing (invalid blocks). For the dense path we
    give such rows a harmless full row and zero them afterwards, so no backend ever
    softmaxes an empty row (NaN forward or NaN gradient, depending on the kernel).
    """
    if isinstance(mask, Tensor):
        any_key = mask.any(dim=-1, keepdim=True)  # [B, 1, Q, 1]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask | ~any_key, scale=scale, enable_gqa=True
        )
        return out * any_key.to(out.dtype)
    from torch.nn.attention.flex_attention import flex_attention

    # Under bf16 autocast q and k leave the fp32-weight RMSNorm (and RoPE) in fp32 while
    # v leaves its Linear in bf16; flex_attention refuses mixed dtypes (autocast casts
    # SDPA's inputs, not flex's). Found by `dflash train --plan` (dflash/memplan.py).
    q, k = q.to(v.dtype), k.to(v.dtype)
    res: Any = flex_attention(q, k, v, block_mask=mask, scale=scale, enable_gqa=True)
    return res  # return_lse/return_aux are off: the output alone


class DFlashAttention(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.head_dim: int = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        self.n_heads: int = config.num_attention_heads
        self.n_kv: int = config.num_key_value_heads or self.n_heads  # None in HF means MHA
        self.scale = self.head_dim**-0.5
        h, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(h, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, h, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, x: Tensor, ctx: Tensor, rope: tuple[Tensor, Tensor], mask) -> Tensor:
        bsz, q_len, _ = x.shape
        kv_in = torch.cat([ctx, x], dim=1)  # [B, S + Q, H]
        kv_len = kv_in.shape[1]
        q = self.q_norm(self.q_proj(x).view(bsz, q_len, self.n_heads, self.head_dim))
        k = self.k_norm(self.k_proj(kv_in).view(bsz, kv_len, self.n_kv, self.head_dim))
        v = self.v_proj(kv_in).view(bsz, kv_len, self.n_kv, self.head_dim)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = rope  # over [ctx ; block]; queries take the block part
        q = _rope(q, cos[:, -q_len:], sin[:, -q_len:])
        k = _rope(k, cos, sin)
        out = attend(q, k, v, mask, self.scale)  # [B, heads, Q, D]
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x: Tensor, ctx: Tensor, rope, mask) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraftModel(PreTrainedModel):
    config_class = Qwen3Config
    base_model_prefix = ""
    _no_split_modules = ["DFlashDecoderLayer"]

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        dcfg = getattr(config, "dflash_config", None) or {}
        n_feats = len(dcfg.get("target_layer_ids", ()))
        if n_feats == 0:
            raise ValueError(
                "drafter config has no dflash_config.target_layer_ids; build it with "
                "dflash.model.make_draft_config"
            )
        h = config.hidden_size
        self.block_size = int(config.block_size)
        self.fc = nn.Linear(n_feats * h, h, bias=False)
        self.hidden_norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(
            DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = Qwen3RMSNorm(h, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, config=None, **kwargs):
        """Load with the config normalised by dflash.export (either transformers
        generation, or another trainer's export); a conflicting config is refused."""
        if config is None:
            config = load_config(pretrained_model_name_or_path)
        return super().from_pretrained(
            pretrained_model_name_or_path, *args, config=config, **kwargs
        )

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save, then config.json in the export format (legacy keys too)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            write_config(self.config, save_directory)

    @property
    def mask_token_id(self) -> int:
        return int(self.config.dflash_config["mask_token_id"])

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.config.dflash_config["target_layer_ids"])

    def project_context(self, target_feats: Tensor) -> Tensor:
        """[B, S, k*H] concatenated target features -> [B, S, H] fused context."""
        return self.hidden_norm(self.fc(target_feats))

    def forward(
        self,
        block_embeds: Tensor,  # [B, Q, H] target embedding of [anchor, MASK...] per block
        ctx: Tensor,  # [B, S, H] from project_context
        ctx_positions: Tensor,  # [B, S]
        block_positions: Tensor,  # [B, Q]
        mask,  # dense bool [B, 1, Q, S+Q] or flex BlockMask, from dflash.visibility;
        # or a dict keyed by layer type ("full_attention", "sliding_attention")
    ) -> Tensor:
        positions = torch.cat([ctx_positions, block_positions], dim=1)
        rope = self.rotary_emb(block_embeds, positions)
        x = block_embeds
        for layer, kind in zip(self.layers, self.config.layer_types, strict=True):
            x = layer(x, ctx, rope, mask[kind] if isinstance(mask, dict) else mask)
        return self.norm(x)  # [B, Q, H]; the target's LM head turns this into logits
