"""One drafter forward + loss on a packed batch with its target features.

Shared by the single-process trainer and the drafter ranks of the pipeline: given a
packed row, the target's features for it and sampled anchors, build the block inputs,
the visibility mask, run the drafter and return the loss and accuracy counters.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dflash.data.packing import PackedBatch
from dflash.export_dflash2 import DEFAULT_ALPHA
from dflash.loss import block_targets, chunked_loss
from dflash.loss_dflash2 import dflash2_loss
from dflash.model import DFlashDraftModel
from dflash.visibility import dense_mask, flex_block_mask


class DraftStep(nn.Module):
    def __init__(
        self,
        drafter: DFlashDraftModel,
        embed_tokens: nn.Embedding,  # target's, frozen
        lm_head: nn.Linear,  # target's, frozen
        *,
        gamma: float,
        loss_chunk: int,
        attn: str,  # "sdpa" (dense bool mask) or "flex" (BlockMask)
        create_block_mask_fn=None,  # compiled create_block_mask on GPU / --compile
        selector_alpha: float = DEFAULT_ALPHA,  # DFlash2: weight of the selector loss
    ):
        super().__init__()
        self.drafter = drafter
        self.embed_tokens = embed_tokens
        self.lm_head = lm_head
        self.block_size = drafter.block_size
        self.mask_id = drafter.mask_token_id
        self.gamma = gamma
        self.loss_chunk = loss_chunk
        self.attn = attn
        self.create_fn = create_block_mask_fn
        self.selector_alpha = selector_alpha
        cfg = drafter.config
        self.window = cfg.sliding_window if "sliding_attention" in cfg.layer_types else None

    def masks(self, anchors: Tensor, valid: Tensor, doc_ids: Tensor):
        build = flex_block_mask if self.attn == "flex" else dense_mask
        kw = {"create_fn": self.create_fn} if self.attn == "flex" else {}
        full = build(anchors, valid, doc_ids, self.block_size, **kw)
        if self.window is None:
            return full
        return {
            "full_attention": full,
            "sliding_attention": build(anchors, valid, doc_ids, self.block_size, self.window, **kw),
        }

    def block_inputs(self, input_ids: Tensor, positions: Tensor, anchors: Tensor):
        """Block token ids [anchor, MASK x (bs-1)] and their positions (anchor's + k)."""
        bsz, n_anchors = anchors.shape
        bs = self.block_size
        ids = torch.full(
            (bsz, n_anchors, bs), self.mask_id, dtype=input_ids.dtype, device=input_ids.device
        )
        ids[:, :, 0] = input_ids.gather(1, anchors)
        pos = positions.gather(1, anchors).unsqueeze(-1) + torch.arange(bs, device=anchors.device)
        return ids.view(bsz, -1), pos.view(bsz, -1)

    def forward(
        self,
        batch: PackedBatch,  # [B, S] input_ids, loss_mask, doc_ids, positions
        target_feats: Tensor,  # [B, S, k*H]
        anchors: Tensor,  # [B, A]
        anchor_valid: Tensor,  # [B, A]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        block_ids, block_pos = self.block_inputs(batch.input_ids, batch.positions, anchors)
        with torch.no_grad():
            block_embeds = self.embed_tokens(block_ids)
        ctx = self.drafter.project_context(target_feats)
        mask = self.masks(anchors, anchor_valid, batch.doc_ids)
        hidden = self.drafter(block_embeds, ctx, batch.positions, block_pos, mask)
        targets = block_targets(
            batch.input_ids, batch.loss_mask, anchors, anchor_valid, self.block_size, self.gamma
        )
        selector = getattr(self.drafter, "candidate_selector", None)  # DFlash2 only
        if selector is not None:
            return dflash2_loss(
                hidden, self.lm_head, selector, targets, self.block_size,
                alpha=self.selector_alpha, chunk_size=self.loss_chunk,
            )  # fmt: skip
        return chunked_loss(hidden, self.lm_head, targets, self.block_size, self.loss_chunk)
