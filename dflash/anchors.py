"""Document-safe anchor sampling with a static [max_anchors] shape.

The shape never depends on the data: compiled drafter code sees the same shapes every
step, and a validity flag marks the slots that hold no anchor.
"""

from __future__ import annotations

import torch
from torch import Tensor


def eligible_anchors(loss_mask: Tensor, doc_ids: Tensor, block_size: int) -> Tensor:
    """[B, S] bool: p may anchor a block iff loss_mask[p] and p..p+bs-1 is one document.

    Documents are contiguous in a packed row, so "same document at both ends" is
    "same document throughout".
    """
    bsz, s = doc_ids.shape
    ok = torch.zeros_like(loss_mask, dtype=torch.bool)
    span = s - block_size + 1  # anchors past this would run off the row
    if span <= 0:
        return ok
    start = doc_ids[:, :span]
    end = doc_ids[:, block_size - 1 :]
    ok[:, :span] = (start == end) & (start >= 0) & loss_mask[:, :span].bool()
    return ok


def sample_anchors(
    loss_mask: Tensor,
    doc_ids: Tensor,
    block_size: int,
    max_anchors: int,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample up to `max_anchors` anchors per row without replacement, sorted ascending.

    Returns (anchors [B, max_anchors] long, valid [B, max_anchors] bool). Invalid slots
    sit at the end with anchor 0. Random scores + topk keeps this free of host syncs.
    """
    bsz, s = doc_ids.shape
    dev = doc_ids.device
    elig = eligible_anchors(loss_mask, doc_ids, block_size)
    scores = torch.rand(bsz, s, device=dev, generator=generator)
    scores = scores.masked_fill(~elig, -1.0)
    k = min(max_anchors, s)
    vals, idx = scores.topk(k, dim=1)
    valid = vals >= 0
    # Sort valid anchors ascending and push invalid ones to the end.
    key = torch.where(valid, idx, idx + 2 * s)
    order = key.argsort(dim=1)
    idx = idx.gather(1, order)
    valid = valid.gather(1, order)
    anchors = torch.where(valid, idx, torch.zeros_like(idx))
    if k < max_anchors:  # row shorter than max_anchors: pad to the static shape
        pad = max_anchors - k
        anchors = torch.cat([anchors, anchors.new_zeros(bsz, pad)], dim=1)
        valid = torch.cat([valid, valid.new_zeros(bsz, pad)], dim=1)
    return anchors, valid


def block_token_index(anchors: Tensor, block_size: int) -> Tensor:
    """[B, A, bs] context indices anchor + k of every block slot."""
    offs = torch.arange(block_size, device=anchors.device)
    return anchors.unsqueeze(-1) + offs
