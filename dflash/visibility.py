"""The DFlash visibility rule, in ONE function, and the two masks built from it.

Layout of one drafter attention call for a packed row of S context tokens and A
anchors of block size bs (Q = A * bs queries):

    queries : [block 0 slots 0..bs-1 | block 1 ... | block A-1]            (Q)
    keys    : [context 0..S-1 | block 0 | block 1 | ... | block A-1]       (S + Q)

A query in block j (anchor a_j) sees
  * context key kv  iff doc(kv) == doc(a_j) and kv < a_j  (STRICT: at inference the
    anchor is the bonus token whose target hidden state does not exist yet),
  * every key of its own block (bidirectional),
and nothing else. Blocks whose anchor slot is invalid (padding) see nothing.
With a sliding window W, a key is visible only if the query is less than W positions
after it, which also makes the block causal.

`visible` is written with tensor ops only so it serves both paths unchanged:
flex_attention calls it as a mask_mod with scalar index tensors, and `dense_mask`
calls it once with broadcast index grids.
"""

from __future__ import annotations

import torch
from torch import Tensor


def visible(
    b: Tensor,
    q_idx: Tensor,
    kv_idx: Tensor,
    *,
    anchors: Tensor,
    anchor_valid: Tensor,
    doc_ids: Tensor,
    block_size: int,
    window: int | None = None,
) -> Tensor:
    """True where query `q_idx` of row `b` may attend key `kv_idx` (see module doc).

    anchors, anchor_valid: [B, A]; doc_ids: [B, S] (-1 on padding).
    """
    ctx_len = doc_ids.shape[1]
    block = q_idx // block_size
    slot = q_idx % block_size
    anchor = anchors[b, block]

    in_ctx = kv_idx < ctx_len
    kv_ctx = kv_idx.clamp(max=ctx_len - 1)  # keep the gather in range for block keys
    ctx_ok = in_ctx & (doc_ids[b, kv_ctx] == doc_ids[b, anchor]) & (kv_ctx < anchor)

    kv_blk = kv_idx - ctx_len  # negative for context keys: floor-div gives block < 0
    blk_ok = (~in_ctx) & (kv_blk // block_size == block)

    if window is not None:
        # Query position is anchor + slot; same-document keys sit at index distance
        # equal to position distance, so the window is an index comparison.
        ctx_ok = ctx_ok & (anchor + slot - kv_ctx < window)
        kv_slot = kv_blk % block_size
        blk_ok = blk_ok & (kv_slot <= slot) & (slot - kv_slot < window)

    return anchor_valid[b, block] & (ctx_ok | blk_ok)


def dense_mask(
    anchors: Tensor,
    anchor_valid: Tensor,
    doc_ids: Tensor,
    block_size: int,
    window: int | None = None,
) -> Tensor:
    """Boolean SDPA mask [B, 1, Q, S + Q] (True = attend), from `visible`."""
    bsz, n_anchors = anchors.shape
    q_len = n_anchors * block_size
    kv_len = doc_ids.shape[1] + q_len
    dev = anchors.device
    b = torch.arange(bsz, device=dev).view(bsz, 1, 1)
    q = torch.arange(q_len, device=dev).view(1, q_len, 1)
    kv = torch.arange(kv_len, device=dev).view(1, 1, kv_len)
    mask = visible(
        b,
        q,
        kv,
        anchors=anchors,
        anchor_valid=anchor_valid,
        doc_ids=doc_ids,
        block_size=block_size,
        window=window,
    )
    return mask.unsqueeze(1)


def flex_block_mask(
    anchors: Tensor,
    anchor_valid: Tensor,
    doc_ids: Tensor,
    block_size: int,
    window: int | None = None,
    create_fn=None,
):
    """flex_attention BlockMask from `visible`.

    `create_fn` is `create_block_mask` or a torch.compile'd version of it: uncompiled,
    create_block_mask materialises the dense Q x KV grid, which is what we avoid on GPU.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    create_fn = create_fn or create_block_mask
    bsz, n_anchors = anchors.shape
    q_len = n_anchors * block_size
    kv_len = doc_ids.shape[1] + q_len

    def mask_mod(b, h, q_idx, kv_idx):
        return visible(
            b,
            q_idx,
            kv_idx,
            anchors=anchors,
            anchor_valid=anchor_valid,
            doc_ids=doc_ids,
            block_size=block_size,
            window=window,
        )

    return create_fn(mask_mod, bsz, None, q_len, kv_len, device=anchors.device)


def document_causal_dense(doc_ids: Tensor) -> Tensor:
    """[B, 1, S, S] mask for the target: causal and within one document.

    Padding (doc -1) attends to padding only, which keeps every row non-empty.
    """
    s = doc_ids.shape[1]
    idx = torch.arange(s, device=doc_ids.device)
    causal = idx.view(1, s, 1) >= idx.view(1, 1, s)
    same_doc = doc_ids.unsqueeze(2) == doc_ids.unsqueeze(1)
    return (causal & same_doc).unsqueeze(1)


def document_causal_block_mask(doc_ids: Tensor, create_fn=None):
    """Same rule as `document_causal_dense`, as a flex BlockMask."""
    from torch.nn.attention.flex_attention import create_block_mask

    create_fn = create_fn or create_block_mask
    bsz, s = doc_ids.shape

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (doc_ids[b, q_idx] == doc_ids[b, kv_idx])

    return create_fn(mask_mod, bsz, None, s, s, device=doc_ids.device)
