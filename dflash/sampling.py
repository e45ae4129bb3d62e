"""Sampling settings and the speculative rejection-sampling step (docs/eval.md).

The warping of logits into probabilities is transformers' own (the same warper classes,
in the same order, that `generate(do_sample=True)` builds), so "the target's own
sampling" means exactly what HF generate samples. The drafter's proposals are warped
the same way: rejection sampling is lossless for any proposal distribution q as long
as the drafts are drawn from the very q used in the acceptance ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """--temperature/--top-p/--top-k/--seed; temperature 0 is greedy (the other two off)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k (HF generate's own default is 50; ours is off)
    seed: int = 0

    def __post_init__(self):
        t, p, k = self.temperature, self.top_p, self.top_k
        if not (math.isfinite(t) and t >= 0):
            raise ValueError(f"--temperature {t}: must be a finite number >= 0 (0 = greedy)")
        if not 0 < p <= 1:
            raise ValueError(f"--top-p {p}: must be in (0, 1] (1 = off)")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"--top-k {k}: must be an integer >= 0 (0 = off)")
        if t == 0 and (p < 1 or k > 0):
            raise ValueError(
                f"--top-p {p} / --top-k {k} only apply when sampling: greedy decoding "
                "(--temperature 0) always takes the argmax; pass --temperature > 0"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
        }

    def probs(self, logits: Tensor) -> Tensor:
        """logits [n, V] -> float32 probabilities [n, V] after temperature, top-k, top-p."""
        from transformers.generation.logits_process import (
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        scores = logits.float()
        # The order and the skip conditions of GenerationMixin._get_logits_processor.
        if self.temperature != 1.0:
            scores = TemperatureLogitsWarper(self.temperature)(None, scores)
        if self.top_k:
            scores = TopKLogitsWarper(self.top_k)(None, scores)
        if self.top_p < 1.0:
            scores = TopPLogitsWarper(self.top_p)(None, scores)
        return scores.softmax(-1)

    def generator(self, device) -> torch.Generator:
        return torch.Generator(device=device).manual_seed(self.seed)


def draw(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One token per row of (unnormalised, non-negative) weights [n, V] -> [n]."""
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def rejection_step(
    drafts: Tensor, q: Tensor | None, p: Tensor, generator: torch.Generator
) -> tuple[int, int]:
    """Standard speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for one block.

    drafts [bs-1]: proposals, drafts[i] drawn from q[i] (the drafter's distribution for
    block slot i+1); p [bs, V]: the target's distribution after each block prefix (p[i]
    is for slot i+1, p[bs-1] is the bonus position). Draft i is accepted with probability
    min(1, p[i][x] / q[i][x]); at the first rejection the replacement is drawn from
    norm(max(0, p[i] - q[i])); after a fully accepted block the bonus is drawn from
    p[bs-1]. Returns (accepted drafts, the token appended after them). q is None only
    when there is nothing drafted (block size 1).
    """
    n = drafts.shape[0]
    if n:
        assert q is not None, "drafts need their proposal distribution q"
        px = p[:-1].gather(1, drafts[:, None])[:, 0]
        qx = q.gather(1, drafts[:, None])[:, 0]
        u = torch.rand(n, generator=generator, device=p.device, dtype=p.dtype)
        # u < px / qx without the division: qx > 0 since x was drawn from q.
        n_acc = int((u * qx < px).long().cumprod(0).sum())
    else:
        n_acc = 0
    if n_acc == n:
        return n_acc, int(draw(p[-1:], generator)[0])
    assert q is not None  # n_acc < n: something was drafted and rejected
    residual = (p[n_acc] - q[n_acc]).clamp_min(0)
    # All-zero only when p == q (then a rejection has probability 0; rounding aside).
    dist = residual if float(residual.sum()) > 0 else p[n_acc]
    return n_acc, int(draw(dist[None], generator)[0])
