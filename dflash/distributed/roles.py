"""Who does what: ranks -> roles, and the deterministic batch routing between them.

Global ranks [0, D) are drafters, [D, D + T) are targets: drafter 0 is global rank 0,
the rank that writes checkpoints, metrics and the exported drafter (transformers'
save_pretrained writes on global rank 0 only). Optimizer step s trains the
M = D * grad_accum global micro-batches g in [s*M, (s+1)*M): exactly the micro-batches a
single process with grad_accum = M would see at step s. Batch g is
  - produced by target  g % T            (round robin: every target does M/T per step),
  - trained by drafter  (g % M) // A     (contiguous: drafter d owns micro-batches
                                          [d*A, (d+1)*A) of every step, A = grad_accum).
Both sides walk their batches in increasing g, and p2p messages on one link arrive in
the order they were sent, so every message is matched without any handshake, each
drafter receives exactly A batches per step, and the multiset trained per step does not
depend on T. Deadlock freedom: the smallest g not yet received is always sendable (its
target has finished every smaller g, and the drafter's collectives only need smaller g).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


def default_split(world: int) -> tuple[int, int]:
    """(targets, drafters) for `world` devices when the flags leave it open: 3/8 drafters,
    i.e. 5 targets + 3 drafters on 8 GPUs."""
    if world < 2:
        raise ValueError(f"a pipeline needs >= 2 ranks, got {world}")
    drafters = max(1, round(world * 3 / 8))
    return world - drafters, drafters


def resolve_split(targets: int, drafters: int, world: int) -> tuple[int, int]:
    """Fill in --targets/--drafters left at 0 and check they add up to the world size."""
    if targets == 0 and drafters == 0:
        return default_split(world)
    targets = targets or world - drafters
    drafters = drafters or world - targets
    if targets < 1 or drafters < 1 or targets + drafters != world:
        raise ValueError(
            f"--targets {targets} + --drafters {drafters} must equal the world size {world} "
            "(torchrun --nnodes x --nproc-per-node), with at least one of each"
        )
    return targets, drafters


@dataclass(frozen=True)
class Layout:
    targets: int  # T
    drafters: int  # D
    accum: int  # A, micro-batches per drafter per optimizer step

    @property
    def per_step(self) -> int:  # M
        return self.drafters * self.accum

    @property
    def world(self) -> int:
        return self.targets + self.drafters

    def role(self, rank: int) -> tuple[str, int]:
        """('target', t) or ('drafter', d) of a global rank."""
        if rank < self.drafters:
            return "drafter", rank
        return "target", rank - self.drafters

    def name(self, rank: int) -> str:
        role, i = self.role(rank)
        return f"rank {rank} ({role} {i})"

    def target_rank(self, t: int) -> int:
        return self.drafters + t

    def drafter_rank(self, d: int) -> int:
        return d

    def target_of(self, g: int) -> int:
        return g % self.targets

    def drafter_of(self, g: int) -> int:
        return (g % self.per_step) // self.accum

    def target_batches(self, t: int, start_step: int, end_step: int) -> Iterator[tuple[int, int]]:
        """(g, drafter) that target t produces for steps [start_step, end_step), in order."""
        lo, hi = start_step * self.per_step, end_step * self.per_step
        first = lo + (t - lo) % self.targets
        for g in range(first, hi, self.targets):
            yield g, self.drafter_of(g)

    def drafter_batches(self, d: int, step: int) -> list[tuple[int, int]]:
        """(g, target) that drafter d trains at optimizer step `step`, in order."""
        base = step * self.per_step + d * self.accum
        return [(g, self.target_of(g)) for g in range(base, base + self.accum)]
