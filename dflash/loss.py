"""DFlash loss: position-decayed cross-entropy over block slots, chunked.

Slot k (1..bs-1) of the block anchored at a predicts token[a + k] at the same index
(no shift); slot 0 holds the given anchor token and is excluded. Weight
w_k = exp(-(k-1)/gamma), times loss_mask[a + k] and the anchor's validity, and the
loss is normalised by the sum of weights.

Logits are [n_anchors * bs, vocab] per row (151936 wide for Qwen3), so the LM head
and cross-entropy run chunk by chunk, and each chunk's gradient with respect to the
hidden states is computed right there in the forward (the LM head is frozen, so that is
the only gradient the backward needs): only one chunk of fp32 logits ever exists, and
the backward never recomputes them. Activation checkpointing did recompute them, and
bench/peer_step.py measured our backward at 1.46x speculators' at vocabulary 8192.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from dflash.anchors import block_token_index

# Defaults (docs/algorithm.md#loss): gamma 7 at block size 16 as in SpecForge's Qwen3-8B
# example; 5 and 4 at block sizes 10 and 8 are our choice. Others pass gamma explicitly.
DEFAULT_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


def default_gamma(block_size: int) -> float:
    if block_size not in DEFAULT_GAMMA:
        known = ", ".join(f"bs {k}: {v:g}" for k, v in sorted(DEFAULT_GAMMA.items()))
        raise ValueError(
            f"no default loss decay gamma for --block-size {block_size} (known: {known}); "
            "pass --loss-gamma"
        )
    return DEFAULT_GAMMA[block_size]


def slot_weights(block_size: int, gamma: float, device=None) -> Tensor:
    """[bs] weights: 0 for slot 0, exp(-(k-1)/gamma) for k >= 1."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


@dataclass
class BlockTargets:
    labels: Tensor  # [B, A*bs] token[a + k]
    weights: Tensor  # [B, A*bs] loss weights (0 where excluded)
    counted: Tensor  # [B, A*bs] bool: slot k>=1, valid anchor, loss_mask set (accuracy)


def block_targets(
    input_ids: Tensor,
    loss_mask: Tensor,
    anchors: Tensor,
    anchor_valid: Tensor,
    block_size: int,
    gamma: float,
) -> BlockTargets:
    bsz = anchors.shape[0]
    idx = block_token_index(anchors, block_size).clamp(max=input_ids.shape[1] - 1)
    flat = idx.view(bsz, -1)
    labels = input_ids.gather(1, flat)
    lm = loss_mask.bool().gather(1, flat).view_as(idx)
    slot = torch.arange(block_size, device=anchors.device)
    counted = lm & anchor_valid.unsqueeze(-1) & (slot > 0)
    w = slot_weights(block_size, gamma, device=anchors.device) * counted
    return BlockTargets(labels, w.view(bsz, -1), counted.view(bsz, -1))


def _chunk_ce(h: Tensor, weight: Tensor, labels: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    logits = F.linear(h, weight).float()  # the only fp32 logits alive: one chunk
    ce = F.cross_entropy(logits, labels, reduction="none")
    return (ce * w).sum(), logits.argmax(dim=-1)


class _ChunkCE(torch.autograd.Function):
    """sum(w * CE(h @ W^T, labels)) over one chunk, and its gradient with respect to h,
    computed in the forward: d/dlogits = w * (softmax - onehot), then @ W. The chunk's
    logits are freed before the next chunk; the backward only scales the saved [n, H]."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, labels: Tensor, w: Tensor):
        logits = F.linear(h, weight).float()  # autocast applies here as in _chunk_ce
        pred = logits.argmax(dim=-1)
        lse = torch.logsumexp(logits, dim=-1)
        rows = torch.arange(labels.shape[0], device=labels.device)
        part = ((lse - logits[rows, labels]) * w).sum()
        probs = logits.sub_(lse[:, None]).exp_()  # softmax, in the logits' own buffer
        probs[rows, labels] -= 1.0
        probs.mul_(w[:, None])
        ctx.save_for_backward((probs.to(weight.dtype) @ weight).to(h.dtype))
        return part, pred

    @staticmethod
    def backward(ctx, grad_part: Tensor, grad_pred: Tensor | None):
        (grad_h,) = ctx.saved_tensors
        return grad_h * grad_part.to(grad_h.dtype), None, None, None


def chunked_loss(
    hidden: Tensor,  # [B, Q, H] drafter output (after its final norm)
    lm_head: nn.Linear,  # the target's, frozen
    targets: BlockTargets,
    block_size: int,
    chunk_size: int = 4096,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted mean CE and per-slot accuracy counters (device tensors: no host sync).

    Returns (loss, stats) with stats["correct"], stats["count"] of shape [bs] and
    stats["weight_sum"] scalar, to be summed over steps and read on logging steps.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    labels = targets.labels.reshape(-1)
    w = targets.weights.reshape(-1)
    total = h.new_zeros((), dtype=torch.float32)
    preds = []
    for start in range(0, h.shape[0], chunk_size):
        sl = slice(start, start + chunk_size)
        if torch.is_grad_enabled() and lm_head.weight.requires_grad:
            # A trainable head (not the trainer's: it trains against the frozen target's)
            # needs its own gradient too: recompute the chunk in the backward instead.
            part, pred = checkpoint(
                _chunk_ce, h[sl], lm_head.weight, labels[sl], w[sl], use_reentrant=False
            )
        elif torch.is_grad_enabled() and h.requires_grad:
            part, pred = _ChunkCE.apply(h[sl], lm_head.weight, labels[sl], w[sl])
        else:
            part, pred = _chunk_ce(h[sl], lm_head.weight, labels[sl], w[sl])
        total = total + part
        preds.append(pred)
    wsum = w.sum()
    loss = total / wsum.clamp(min=1e-6)
    correct = (torch.cat(preds) == labels) & targets.counted.reshape(-1)
    per_slot = lambda x: x.view(-1, block_size).sum(0)  # noqa: E731
    stats = {
        "correct": per_slot(correct.float()),
        "count": per_slot(targets.counted.reshape(-1).float()),
        "weight_sum": wsum.detach(),
    }
    return loss, stats


def accuracy_per_slot(correct: Tensor, count: Tensor) -> list[float]:
    """Unweighted accuracy for slots 1..bs-1 (host values; call on logging steps)."""
    c, n = correct.tolist(), count.tolist()
    return [c[k] / n[k] if n[k] else math.nan for k in range(1, len(c))]
