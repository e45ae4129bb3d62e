"""Cached DFlash2 drafting for speculative decoding: dflash.spec_decode.CachedDrafter's
context K/V cache and visibility rule, with the DFlash2 layers and the candidate
selector in place of the per-slot argmax.

The context K/V are DFlash's (the convolutions act on the block only, never on the
context), so `extend` and `block_mask` are inherited unchanged; only the block pass
differs. `speculative_generate(target, CachedDFlash2Drafter(...), ...)` decodes greedily.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from dflash.model import _rope, attend
from dflash.model_dflash2 import DFlash2DecoderLayer, DFlash2DraftModel
from dflash.spec_decode import CachedDrafter


class CachedDFlash2Drafter(CachedDrafter):
    def __init__(self, drafter: DFlash2DraftModel, embed_tokens, lm_head):
        if not isinstance(drafter, DFlash2DraftModel):
            raise TypeError(f"CachedDFlash2Drafter needs a DFlash2DraftModel, got {type(drafter)}")
        super().__init__(drafter, embed_tokens, lm_head)
        self.d2 = drafter
        self.layers2: list[DFlash2DecoderLayer] = list(drafter.layers)  # type: ignore[arg-type]

    def _attention(self, i: int, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        """Layer i's attention of the block h [1, bs, H] over [cached context ; block]."""
        a, n = self.layers2[i].self_attn, h.shape[1]
        q = a.q_norm(a.q_proj(h).view(1, n, a.n_heads, a.head_dim)).transpose(1, 2)
        k = a.k_norm(a.k_proj(h).view(1, n, a.n_kv, a.head_dim)).transpose(1, 2)
        v = a.v_proj(h).view(1, n, a.n_kv, a.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        ck, cv = self.k[i], self.v[i]
        if ck is not None and cv is not None:
            k, v = torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2)
        return a.o_proj(attend(q, k, v, mask, a.scale).transpose(1, 2).reshape(1, n, -1))

    @torch.no_grad()
    def draft(
        self,
        anchor: int,
        anchor_pos: int,
        block_size: int,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(block tokens [bs], candidate ids [bs-1, k], proposal q [bs-1, k] or None):
        slot 0 is the anchor, slots 1.. the selector's walk from it."""
        d = self.d2
        dev = d.fc.weight.device
        ids = torch.full((1, block_size), d.mask_token_id, dtype=torch.long, device=dev)
        ids[0, 0] = anchor
        pos = (anchor_pos + torch.arange(block_size, device=dev)).unsqueeze(0)
        x = self.embed_tokens(ids)
        cos, sin = d.rotary_emb(x, pos)
        mask = self.block_mask(block_size)
        for i, layer in enumerate(self.layers2):
            attention = partial(self._attention, i, cos=cos, sin=sin, mask=mask)
            x = layer.run(x, attention, block_size)
        hidden = d.norm(x)[:, 1:]
        tokens, cand, q = d.propose(hidden, ids[:, 0], self.lm_head, temperature, generator)
        ids[0, 1:] = tokens[0]
        return ids[0], cand[0], None if q is None else q[0]

    def propose(self, anchor: int, anchor_pos: int, block_size: int) -> Tensor:
        """Greedy block tokens [bs], the CachedDrafter interface speculative_generate uses."""
        return self.draft(anchor, anchor_pos, block_size)[0]

    def logits(self, anchor: int, anchor_pos: int, block_size: int) -> Tensor:
        raise TypeError(
            "a DFlash2 drafter's drafts come from its selector walk, not from per-slot "
            "logits: use propose (greedy) or sample"
        )

    def sample(self, anchor: int, anchor_pos: int, block_size: int, s, gen: torch.Generator):
        """(block tokens [bs], q [bs-1, V]) at temperature s.temperature: the selector's
        walk, sampled, and its proposal q spread over the vocabulary (zero outside each
        slot's candidates), the q that rejection sampling divides by. As in z-lab's
        decoder, the proposal applies the temperature to the selector scores only (no
        top-p/top-k); rejection sampling is lossless for any q the drafts are drawn from."""
        if not s.temperature > 0:
            raise ValueError(f"sample: temperature {s.temperature}; greedy drafting is propose")
        block, cand, q = self.draft(anchor, anchor_pos, block_size, s.temperature, gen)
        assert q is not None  # temperature > 0: the walk sampled
        full = q.new_zeros(q.shape[0], self.lm_head.weight.shape[0])
        return block, full.scatter_(-1, cand, q)
