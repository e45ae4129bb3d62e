"""The chunked loss's forward + backward, two ways, interleaved in one process (one thread,
CPU time): activation checkpointing per chunk (recomputes the chunk's logits in the
backward: the old path, still used for a trainable head) against the gradient computed in
the forward (dflash.loss._ChunkCE, the trainer's path: its LM head is frozen).

    .venv/bin/python bench/loss_backward.py [--repeats 7]

Prints one line per shape: both medians and their ratio; the gradients are checked equal.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.checkpoint import checkpoint

from dflash.loss import _chunk_ce, _ChunkCE

# rows x hidden x vocab (chunk): a tiny drafter's, and a larger one closer to real widths
SHAPES = [(512, 64, 8192, 512), (2048, 256, 32768, 1024)]


def loss_grad(kind: str, h, weight, labels, w, chunk: int) -> torch.Tensor:
    h = h.detach().requires_grad_(True)
    total = h.new_zeros(())
    for start in range(0, h.shape[0], chunk):
        sl = slice(start, start + chunk)
        if kind == "checkpointed":
            part, _ = checkpoint(_chunk_ce, h[sl], weight, labels[sl], w[sl], use_reentrant=False)
        else:
            part, _ = _ChunkCE.apply(h[sl], weight, labels[sl], w[sl])
        total = total + part
    total.backward()
    assert h.grad is not None
    return h.grad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    kinds = ("checkpointed", "in-forward")
    for n, hidden, vocab, chunk in SHAPES:
        g = torch.Generator().manual_seed(0)
        h = torch.randn(n, hidden, generator=g)
        weight = torch.randn(vocab, hidden, generator=g) * 0.05
        labels = torch.randint(0, vocab, (n,), generator=g)
        w = torch.rand(n, generator=g)
        a, b = (loss_grad(k, h, weight, labels, w, chunk) for k in kinds)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.repeats):
            for k in kinds if r % 2 == 0 else kinds[::-1]:  # alternate the order
                t = time.process_time()
                loss_grad(k, h, weight, labels, w, chunk)
                times[k].append(time.process_time() - t)
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        print(
            f"{n} x {hidden} x {vocab} (chunk {chunk}): checkpointed {med['checkpointed']:.1f} ms,"
            f" in-forward {med['in-forward']:.1f} ms, ratio {med['in-forward'] / med['checkpointed']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
