"""Speculative decoding with a DFlash drafter: greedy, or sampling (docs/eval.md).

Per greedy step: block = [last committed token (the anchor), MASK x (bs-1)]; the drafter
proposes slots 1..bs-1; the target scores the whole block in one pass; we accept the
longest prefix where draft[i] == target_argmax[i-1] and append the target's own next
token (the bonus). Both sides keep caches of committed positions only:

* target: a HF DynamicCache, cropped back to the committed length after a rejection;
* drafter: per layer, the K/V of the fused context features of committed positions,
  with their RoPE already applied. Context features of a position are the target's
  hidden states there, which exist only once the target has run that token, so the
  anchor (the bonus just appended) is never in the context: the strict rule.

The block itself is recomputed every step (its tokens change). At temperature > 0 the
drafts are drawn from the drafter's warped distributions and accepted by rejection
sampling (dflash.sampling.rejection_step); caches, crop and commit are the same.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dflash.model import DFlashDraftModel, _rope, attend
from dflash.sampling import Sampling, draw, rejection_step
from dflash.visibility import dense_mask


def accept_length(draft: Tensor, target_next: Tensor) -> int:
    """Accepted draft tokens of one step.

    draft: [bs] block tokens (slot 0 = anchor, slots 1.. = proposals);
    target_next: [bs] target argmax after each block prefix (target_next[i] is the
    target's choice for the position of slot i+1). Accept the longest k with
    draft[i] == target_next[i-1] for all i in 1..k.
    """
    match = (draft[1:] == target_next[:-1]).long()
    return int(match.cumprod(0).sum())


class CachedTarget:
    """The target LM with a KV cache; each call returns argmax ids and layer features."""

    def __init__(self, model, layer_ids: list[int]):
        from transformers import DynamicCache

        self.model = model
        self.layer_ids = list(layer_ids)
        self._cache_cls = DynamicCache
        self.cache = DynamicCache(config=model.config)

    def reset(self) -> None:
        self.cache = self._cache_cls(config=self.model.config)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.no_grad()
    def __call__(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """ids [1, n] at positions length..length+n-1 -> (argmax [n], feats [1, n, k*H])."""
        logits, feats = self.forward(ids)
        return logits.argmax(-1), feats

    @torch.no_grad()
    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """ids [1, n] -> (logits [n, V], feats [1, n, k*H])."""
        out = self.model(input_ids=ids, cache=self.cache, use_cache=True, output_hidden_states=True)
        # hidden_states[0] is the embedding output, so layer i's output is index i + 1.
        feats = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return out.logits[0], feats

    def crop(self, n: int) -> None:
        """Keep the first n positions (transformers 5 crops by a negative count to remove)."""
        extra = self.length - n
        if extra > 0:
            self.cache.crop(-extra)


class CachedDrafter:
    """DFlashDraftModel inference with a per-layer K/V cache of the committed context."""

    def __init__(self, drafter: DFlashDraftModel, embed_tokens, lm_head):
        if "sliding_attention" in drafter.config.layer_types:
            raise ValueError("eval does not support drafters with sliding-window layers")
        self.d: Any = drafter  # DFlashDraftModel; its layers are read directly
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.reset()

    def reset(self) -> None:
        # Per layer, [1, kv heads, S, D] once something is committed (None before).
        self.k: list[Any] = [None] * len(self.d.layers)
        self.v: list[Any] = [None] * len(self.d.layers)

    @property
    def length(self) -> int:
        return 0 if self.k[0] is None else int(self.k[0].shape[2])

    @torch.no_grad()
    def extend(self, target_feats: Tensor, positions: Tensor) -> None:
        """Append committed positions: feats [1, n, k*H], positions [1, n]."""
        ctx = self.d.project_context(target_feats)
        cos, sin = self.d.rotary_emb(ctx, positions)
        bsz, n, _ = ctx.shape
        for i, layer in enumerate(self.d.layers):
            a = layer.self_attn
            k = a.k_norm(a.k_proj(ctx).view(bsz, n, a.n_kv, a.head_dim)).transpose(1, 2)
            v = a.v_proj(ctx).view(bsz, n, a.n_kv, a.head_dim).transpose(1, 2)
            k = _rope(k, cos, sin)
            self.k[i] = k if self.k[i] is None else torch.cat([self.k[i], k], dim=2)
            self.v[i] = v if self.v[i] is None else torch.cat([self.v[i], v], dim=2)

    def block_mask(self, block_size: int) -> Tensor:
        """Mask [1, 1, bs, S + bs] from THE visibility rule (dflash.visibility.visible).

        The rule indexes the anchor inside the context, so we lay out S + 1 context
        slots with the anchor at index S and drop that column afterwards: the rule
        never lets a block see its own anchor's features (kv < anchor, strict).
        """
        s, dev = self.length, self.d.fc.weight.device
        anchors = torch.tensor([[s]], device=dev)
        valid = torch.ones(1, 1, dtype=torch.bool, device=dev)
        full = dense_mask(
            anchors, valid, torch.zeros(1, s + 1, dtype=torch.long, device=dev), block_size
        )
        assert not full[..., s].any(), "visibility rule let a block see its anchor's features"
        return torch.cat([full[..., :s], full[..., s + 1 :]], dim=-1)

    @torch.no_grad()
    def propose(self, anchor: int, anchor_pos: int, block_size: int) -> Tensor:
        """Block tokens [bs]: the anchor, then the drafter's argmax for slots 1..bs-1."""
        logits = self.logits(anchor, anchor_pos, block_size)
        ids = logits.argmax(-1)
        ids[0] = anchor
        return ids

    @torch.no_grad()
    def sample(
        self, anchor: int, anchor_pos: int, block_size: int, s: Sampling, gen: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """(block tokens [bs], q [bs-1, V]): slots 1.. drawn from the warped drafter logits.

        One forward pass gives every slot's distribution at once (slots see the anchor and
        mask tokens, not each other's drafts), so the drafts are drawn independently."""
        q = s.probs(self.logits(anchor, anchor_pos, block_size)[1:])
        block = torch.empty(block_size, dtype=torch.long, device=q.device)
        block[0] = anchor
        block[1:] = draw(q, gen)
        return block, q

    @torch.no_grad()
    def logits(self, anchor: int, anchor_pos: int, block_size: int) -> Tensor:
        """Drafter logits [bs, V] for the block [anchor, MASK x (bs-1)] (row 0: the anchor's)."""
        dev = self.d.fc.weight.device
        ids = torch.full((1, block_size), self.d.mask_token_id, dtype=torch.long, device=dev)
        ids[0, 0] = anchor
        pos = (anchor_pos + torch.arange(block_size, device=dev)).unsqueeze(0)
        x = self.embed_tokens(ids)
        cos, sin = self.d.rotary_emb(x, pos)
        mask = self.block_mask(block_size)
        for i, layer in enumerate(self.d.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_norm(a.q_proj(h).view(1, block_size, a.n_heads, a.head_dim)).transpose(1, 2)
            k = a.k_norm(a.k_proj(h).view(1, block_size, a.n_kv, a.head_dim)).transpose(1, 2)
            v = a.v_proj(h).view(1, block_size, a.n_kv, a.head_dim).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            if self.k[i] is not None:
                k, v = torch.cat([self.k[i], k], dim=2), torch.cat([self.v[i], v], dim=2)
            out = attend(q, k, v, mask, a.scale).transpose(1, 2).reshape(1, block_size, -1)
            x = x + a.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.d.norm(x))[0]


@dataclass
class DecodeResult:
    output_ids: list[int]
    accept_lengths: list[int] = field(default_factory=list)  # accepted drafts per step
    seconds: float = 0.0


def _finish(out: list[int], max_new_tokens: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Cut at max_new_tokens and after the first end-of-sequence token."""
    out = out[:max_new_tokens]
    for i, t in enumerate(out):
        if t in eos_ids:
            return out[: i + 1], True
    return out, len(out) >= max_new_tokens


@torch.no_grad()
def speculative_generate(
    target: CachedTarget,
    drafter: CachedDrafter | None,
    prompt_ids: list[int],
    *,
    block_size: int,
    max_new_tokens: int,
    eos_ids: set[int],
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
) -> DecodeResult:
    """Decode one prompt; block_size 1 is plain decoding through the same loop.

    Greedy unless `sampling` has temperature > 0; then every random draw comes from
    `generator` (default: a fresh one seeded with sampling.seed)."""
    if block_size > 1 and drafter is None:
        raise ValueError("block_size > 1 needs a drafter")
    dev = target.model.device
    rule = sampling if sampling is not None and not sampling.greedy else None
    if rule is not None and generator is None:
        generator = rule.generator(dev)
    t0 = time.perf_counter()
    target.reset()
    if drafter is not None:
        drafter.reset()
    if rule is not None:
        assert generator is not None
        logits, feats = target.forward(torch.tensor([prompt_ids], device=dev))
        out = [int(draw(rule.probs(logits[-1:]), generator)[0])]
    else:
        nxt, feats = target(torch.tensor([prompt_ids], device=dev))
        out = [int(nxt[-1])]
    steps = []
    if drafter is not None and block_size > 1:
        drafter.extend(feats, torch.arange(len(prompt_ids), device=dev).unsqueeze(0))
    while not _finish(out, max_new_tokens, eos_ids)[1]:
        pos = len(prompt_ids) + len(out) - 1  # position of the anchor (last committed)
        if rule is not None:
            assert generator is not None
            q: Tensor | None = None
            if drafter is not None and block_size > 1:
                block, q = drafter.sample(out[-1], pos, block_size, rule, generator)
            else:
                block = torch.tensor([out[-1]], device=dev)
            logits, feats = target.forward(block.unsqueeze(0))
            # Looked up at call time: the distribution test swaps in a wrong rule here.
            n_acc, nxt_tok = rejection_step(block[1:], q, rule.probs(logits), generator)
        else:
            if drafter is not None and block_size > 1:
                block = drafter.propose(out[-1], pos, block_size)
            else:
                block = torch.tensor([out[-1]], device=dev)
            nxt, feats = target(block.unsqueeze(0))
            n_acc = accept_length(block, nxt)
            nxt_tok = int(nxt[n_acc])
        out += block[1 : 1 + n_acc].tolist() + [nxt_tok]
        steps.append(n_acc)
        target.crop(pos + n_acc + 1)  # keep the anchor and the accepted drafts
        if drafter is not None and block_size > 1:
            committed = torch.arange(pos, pos + n_acc + 1, device=dev).unsqueeze(0)
            drafter.extend(feats[:, : n_acc + 1], committed)
    return DecodeResult(_finish(out, max_new_tokens, eos_ids)[0], steps, time.perf_counter() - t0)


@torch.no_grad()
def greedy_reference(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int]):
    """The target's own plain greedy `generate`: what speculative decoding must equal."""
    ids = torch.tensor([prompt_ids], device=model.device)
    gen = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=sorted(eos_ids),
        pad_token_id=sorted(eos_ids)[0],
    )
    return gen[0, len(prompt_ids) :].tolist()


def first_mismatch(a: list[int], b: list[int]) -> int | None:
    """First position where two token lists differ (length counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
