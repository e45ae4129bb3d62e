"""DFlash2 drafter: DFlash (dflash.model) plus in-block convolutions and a candidate selector.

Per decoder layer, each sublayer (attention, MLP) is wrapped by a grouped dynamic causal
convolution over the positions of a block, before and after it:

    conv(x)[i, c] = sum_t (base[t, c] + delta[i, t, g(c)]) * x[i - t, c],  t < kernel

x[i - t] is zero when i - t falls before the block's slot 0 (the anchor): the taps never
cross a block, so A packed training blocks compute what A separate decode blocks do.
delta comes from one linear projection of the sublayer's (normed) input, shared by the
`conv_group_size` channels of a group; the projection yields both the input-side and the
output-side taps. Attention itself is DFlash's (bidirectional inside the block).

The candidate selector replaces each slot's independent argmax: it keeps the top-k of
the unary logits (the target's LM head on the drafter output) at every slot and walks the
block from the anchor, scoring candidate b after predecessor a at slot i as

    score(a -> b) = unary_i(b) + < P[a] * W h_i , S[b] >

with low-rank (selector_rank) predecessor/successor codebooks P, S and projection W.
Greedy takes the best successor at each slot; at temperature T > 0 it samples from
softmax(score / T) over the k candidates, which is the proposal q a lossless verifier needs.

Sources (read, not copied): z-lab's published decoder (PyPI dflash 0.1.0,
dflash/model.py: GroupedDynamicCausalConv, CandidateSelector, DFlash2DraftModel), the
trainers in SpecForge PR #772, NeMo Automodel PR #3605 and speculators PR #1006 (identity
initialisation, the block-local taps in packed training). See docs/dflash2.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import Qwen3Config

from dflash.export_dflash2 import ARCHITECTURE, DFlash2Settings, settings_of
from dflash.model import DFlashDecoderLayer, DFlashDraftModel, make_draft_config


def make_dflash2_config(
    target_config: Qwen3Config, *, settings: DFlash2Settings | None = None, **draft_kwargs
) -> Qwen3Config:
    """`make_draft_config` (same arguments) plus the DFlash2 sizes in dflash_config."""
    settings = settings or DFlash2Settings()
    config = make_draft_config(target_config, **draft_kwargs)
    settings.check(
        hidden_size=config.hidden_size,
        block_size=config.block_size,
        vocab_size=config.vocab_size,
    )
    config.architectures = [ARCHITECTURE]
    config.dflash_config = {**config.dflash_config, **settings.as_dict()}
    return config


def block_causal_conv(x: Tensor, delta: Tensor, base: Tensor, block_len: int) -> Tensor:
    """conv(x) of the module doc. x [B, Q, H] (Q = n * block_len), delta [B, Q, K, G],
    base [K, H] -> [B, Q, H]."""
    bsz, q_len, hidden = x.shape
    kernel, groups = base.shape[0], delta.shape[-1]
    n = q_len // block_len
    xb = x.view(bsz, n, block_len, groups, hidden // groups)
    coef = base.to(x.dtype).view(1, 1, 1, kernel, groups, -1) + delta.view(
        bsz, n, block_len, kernel, groups, 1
    )
    # Left-pad every block with kernel-1 zero slots, so tap t of slot i reads slot i - t
    # of its own block, or zero.
    padded = F.pad(xb, (0, 0, 0, 0, kernel - 1, 0))
    out = coef[:, :, :, 0] * xb
    for t in range(1, kernel):
        out = out + coef[:, :, :, t] * padded[:, :, kernel - 1 - t : kernel - 1 - t + block_len]
    return out.view(bsz, q_len, hidden)


class GroupedDynamicConv(nn.Module):
    """The two convolutions around one sublayer: `prepare` convolves its input and
    returns the output-side taps, which `finish` applies to its output."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.groups = hidden_size // group_size
        # [input side, output side] x taps x channels
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Identity (tap 0 = 1, no dynamic part), as the speculators (PR #1006) and NeMo
        Automodel (PR #3605) trainers start it: a fresh DFlash2 backbone computes exactly
        what DFlash does."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def prepare(self, h: Tensor, block_len: int) -> tuple[Tensor, Tensor]:
        taps = self.kernel_projection(h).view(*h.shape[:-1], 2, self.kernel_size, self.groups)
        inner, outer = taps[..., 0, :, :], taps[..., 1, :, :]
        return block_causal_conv(h, inner, self.base_kernel[0], block_len), outer

    def finish(self, y: Tensor, taps: Tensor, block_len: int) -> Tensor:
        return block_causal_conv(y, taps, self.base_kernel[1], block_len)


class CandidateSelector(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int, std: float):
        super().__init__()
        self.top_k = top_k
        self.std = std
        # Plain parameters, not nn.Embedding: the published tensor names have no ".weight".
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A zero successor codebook makes every pair term 0 (NeMo Automodel PR #3605):
        a fresh selector walks the unary argmax, i.e. decodes as DFlash does."""
        with torch.no_grad():
            self.predecessor_codebook.normal_(0.0, self.std)
            self.hidden_projection.weight.normal_(0.0, self.std)
            self.successor_codebook.zero_()

    def candidates(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """(unary scores, token ids) of the top-k per slot, best first: [..., k] each."""
        return torch.topk(logits, self.top_k, dim=-1)

    def scores(self, hidden: Tensor, predecessors: Tensor, unary: Tensor, ids: Tensor) -> Tensor:
        """score(a -> b) for every candidate b: hidden [..., H], predecessors [...],
        unary and ids [..., k] -> [..., k]. Elementwise over the leading dimensions, so
        training scores all slots at once against their true predecessors."""
        gate = self.predecessor_codebook[predecessors] * self.hidden_projection(hidden)
        pair = (self.successor_codebook[ids] * gate.unsqueeze(-2)).sum(-1)
        return unary + pair

    def walk(
        self,
        hidden: Tensor,  # [B, n, H] drafter output at slots 1..n
        logits: Tensor,  # [B, n, V] unary logits there
        anchors: Tensor,  # [B] slot-0 tokens (the last committed token)
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """(tokens [B, n], candidate ids [B, n, k], q [B, n, k] or None when greedy)."""
        unary, ids = self.candidates(logits)
        prev, path, qs = anchors, [], []
        for i in range(hidden.shape[1]):
            s = self.scores(hidden[:, i], prev, unary[:, i], ids[:, i])
            if temperature > 0:
                q = torch.softmax(s.float() / temperature, dim=-1)
                pick = torch.multinomial(q, 1, generator=generator).squeeze(-1)
                qs.append(q)
            else:
                pick = s.argmax(-1)
            prev = ids[:, i].gather(-1, pick.unsqueeze(-1)).squeeze(-1)
            path.append(prev)
        return torch.stack(path, 1), ids, torch.stack(qs, 1) if qs else None


class DFlash2DecoderLayer(DFlashDecoderLayer):
    def __init__(self, config: Qwen3Config, layer_idx: int, settings: DFlash2Settings):
        super().__init__(config, layer_idx)
        sizes = (config.hidden_size, settings.conv_kernel_size, settings.conv_group_size)
        self.attention_conv = GroupedDynamicConv(*sizes)
        self.mlp_conv = GroupedDynamicConv(*sizes)

    def run(self, x: Tensor, attention: Callable[[Tensor], Tensor], block_len: int) -> Tensor:
        """The layer with any attention over the (convolved, normed) block: the training
        forward passes DFlash attention over [ctx ; block], eval a cached-context one."""
        h, taps = self.attention_conv.prepare(self.input_layernorm(x), block_len)
        x = x + self.attention_conv.finish(attention(h), taps, block_len)
        h, taps = self.mlp_conv.prepare(self.post_attention_layernorm(x), block_len)
        return x + self.mlp_conv.finish(self.mlp(h), taps, block_len)

    def forward(self, x: Tensor, ctx: Tensor, rope, mask, block_len: int | None = None) -> Tensor:
        """block_len: x [B, Q, H] is Q / block_len whole blocks (default: one block)."""
        length = x.shape[1] if block_len is None else block_len
        return self.run(x, lambda h: self.self_attn(h, ctx, rope, mask), length)


class DFlash2DraftModel(DFlashDraftModel):
    """Same forward interface as DFlashDraftModel (so DraftStep drives it unchanged);
    `propose` turns its output into draft tokens with the candidate selector."""

    _no_split_modules = ["DFlash2DecoderLayer"]

    def __init__(self, config: Qwen3Config):
        settings = settings_of(config)
        settings.check(
            hidden_size=config.hidden_size,
            block_size=int(config.block_size),
            vocab_size=config.vocab_size,
        )
        super().__init__(config)
        self.settings = settings
        # DFlashDraftModel built DFlash layers; DFlash2 layers have the same attention
        # and MLP, with the convolutions around them.
        self.layers = nn.ModuleList(
            DFlash2DecoderLayer(config, i, settings) for i in range(config.num_hidden_layers)
        )
        self.candidate_selector = CandidateSelector(
            config.vocab_size,
            config.hidden_size,
            settings.selector_rank,
            settings.selector_top_k,
            std=config.initializer_range,
        )
        self.post_init()

    def _init_weights(self, module):
        # transformers' default would give the convolutions' projection and the selector
        # a random normal init; theirs is deliberate (see reset_parameters).
        if isinstance(module, GroupedDynamicConv | CandidateSelector):
            module.reset_parameters()
        else:
            super()._init_weights(module)

    def block_length(self, q_len: int) -> int:
        """Queries are whole blocks of block_size (training, packed), or one block that
        may be shorter (decoding near max_new_tokens)."""
        if q_len <= self.block_size:
            return q_len
        if q_len % self.block_size:
            raise ValueError(
                f"DFlash2 forward: {q_len} block queries are neither one block nor whole "
                f"blocks of block_size {self.block_size}"
            )
        return self.block_size

    def forward(self, block_embeds, ctx, ctx_positions, block_positions, mask) -> Tensor:
        """As DFlashDraftModel.forward; block_embeds are whole blocks (see block_length)."""
        block_len = self.block_length(block_embeds.shape[1])
        positions = torch.cat([ctx_positions, block_positions], dim=1)
        rope = self.rotary_emb(block_embeds, positions)
        x = block_embeds
        for layer, kind in zip(self.layers, self.config.layer_types, strict=True):
            x = layer(x, ctx, rope, mask[kind] if isinstance(mask, dict) else mask, block_len)
        return self.norm(x)

    def propose(
        self,
        hidden: Tensor,  # [B, n, H]: forward's output at slots 1..n of one block
        anchors: Tensor,  # [B]: slot-0 tokens
        lm_head: nn.Module,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Draft tokens [B, n], their candidate ids [B, n, k] and, when sampling, the
        proposal q [B, n, k] over those candidates (CandidateSelector.walk)."""
        return self.candidate_selector.walk(
            hidden, lm_head(hidden), anchors, temperature, generator
        )


def drafter_class(config) -> type[DFlashDraftModel]:
    """The class a drafter config.json asks for (its `architectures`)."""
    return DFlash2DraftModel if ARCHITECTURE in (config.architectures or []) else DFlashDraftModel
