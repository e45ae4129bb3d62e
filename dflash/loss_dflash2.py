"""The DFlash2 candidate selector's training loss, as the public trainers define it.

Total loss = DFlash's block CE (dflash.loss.chunked_loss, which trains the unary logits
and, through them, the candidate lists) + alpha * selector CE:

* candidates: the top-k (selector_top_k) of the unary logits at each slot, the set the
  selector chooses from when decoding;
* teacher forcing: slot k is scored after its true predecessor token[a + k - 1] (slot 1
  after the anchor itself), the token the decode-time walk would have committed had
  every earlier slot been right;
* label: the index of the true token token[a + k] among the k candidates. When the true
  token is not among them, `missing="inject"` puts it in place of the weakest candidate
  (SpecForge PR #772, "insert the gold token during training when it is missing from the
  top-k candidates"; speculators PR #1006, `selector_training_candidates`), and
  `missing="exclude"` drops the slot from the selector term (NeMo Automodel PR #3605);
* weights: DFlash's per-slot decay weights (dflash.loss.block_targets), normalised by
  their sum over the slots that count;
* gradients reach the selector and, through the unary scores and the drafter output,
  the backbone (SpecForge #772's default; its PR #793 made a stop-gradient opt-in).

Like chunked_loss, logits exist one chunk at a time.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from dflash.export_dflash2 import DEFAULT_ALPHA
from dflash.loss import BlockTargets, chunked_loss
from dflash.model_dflash2 import CandidateSelector


def predecessors(labels: Tensor, block_size: int) -> Tensor:
    """[B, A*bs] token[a + k - 1] for slot k >= 1 (the anchor for slot 1); slot 0 gets
    its own token, which carries no weight."""
    blocks = labels.view(labels.shape[0], -1, block_size)
    return torch.cat([blocks[..., :1], blocks[..., :-1]], dim=-1).view_as(labels)


def training_candidates(ids: Tensor, labels: Tensor, missing: str) -> tuple[Tensor, Tensor, Tensor]:
    """(candidate ids [N, k], label index [N], labelled [N] bool) for unary top-k `ids`."""
    hit = ids == labels.unsqueeze(-1)
    covered = hit.any(-1)
    index = hit.long().argmax(-1)
    if missing == "exclude":
        return ids, index, covered
    last = ids.shape[-1] - 1
    ids = ids.clone()
    ids[:, last] = torch.where(covered, ids[:, last], labels)
    return ids, torch.where(covered, index, torch.full_like(index, last)), torch.ones_like(covered)


def _chunk(h, weight, selector, prev, labels, w, missing):
    logits = F.linear(h, weight).float()
    with torch.no_grad():
        top = selector.candidates(logits)[1]
    ids, index, labelled = training_candidates(top, labels, missing)
    scores = selector.scores(h, prev, logits.gather(-1, ids), ids)
    w = w * labelled
    ce = F.cross_entropy(scores, index, reduction="none")
    correct = ids.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1) == labels
    return (ce * w).sum(), w.sum(), correct, (top == labels.unsqueeze(-1)).any(-1)


def selector_loss(
    hidden: Tensor,  # [B, Q, H] drafter output
    lm_head: nn.Linear,  # the target's, frozen
    selector: CandidateSelector,
    targets: BlockTargets,
    block_size: int,
    *,
    missing: Literal["inject", "exclude"] = "inject",
    chunk_size: int = 4096,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted mean selector CE, and per-slot counters: "selector_correct" (teacher-forced
    pick == true token) and "covered" (true token in the unary top-k), both [bs]."""
    if missing not in ("inject", "exclude"):
        raise ValueError(f"selector_loss: missing={missing!r}; use 'inject' or 'exclude'")
    h = hidden.reshape(-1, hidden.shape[-1])
    labels = targets.labels.reshape(-1)
    prev = predecessors(targets.labels, block_size).reshape(-1)
    w = targets.weights.reshape(-1)
    total = h.new_zeros((), dtype=torch.float32)
    wsum = h.new_zeros((), dtype=torch.float32)
    correct, covered = [], []
    for start in range(0, h.shape[0], chunk_size):
        sl = slice(start, start + chunk_size)
        args = (h[sl], lm_head.weight, selector, prev[sl], labels[sl], w[sl], missing)
        if torch.is_grad_enabled():
            part, part_w, c, cov = checkpoint(_chunk, *args, use_reentrant=False)
        else:
            part, part_w, c, cov = _chunk(*args)
        total, wsum = total + part, wsum + part_w
        correct.append(c)
        covered.append(cov)
    counted = targets.counted.reshape(-1)
    per_slot = lambda x: (x & counted).float().view(-1, block_size).sum(0)  # noqa: E731
    stats = {
        "selector_correct": per_slot(torch.cat(correct)),
        "covered": per_slot(torch.cat(covered)),
    }
    return total / wsum.clamp(min=1e-6), stats


def dflash2_loss(
    hidden: Tensor,
    lm_head: nn.Linear,
    selector: CandidateSelector,
    targets: BlockTargets,
    block_size: int,
    *,
    alpha: float = DEFAULT_ALPHA,
    missing: Literal["inject", "exclude"] = "inject",
    chunk_size: int = 4096,
) -> tuple[Tensor, dict[str, Tensor]]:
    """chunked_loss + alpha * selector_loss, with both sets of counters (and the two
    terms, detached, as "unary_loss" and "selector_loss")."""
    if alpha < 0:
        raise ValueError(f"dflash2_loss: alpha {alpha} < 0; the selector weight is >= 0")
    unary, stats = chunked_loss(hidden, lm_head, targets, block_size, chunk_size)
    sel, sel_stats = selector_loss(
        hidden, lm_head, selector, targets, block_size, missing=missing, chunk_size=chunk_size
    )
    stats.update(sel_stats, unary_loss=unary.detach(), selector_loss=sel.detach())
    return unary + alpha * sel, stats
