"""Synthetic packed batches: uniform random tokens, no data or tokenizer needed."""

from __future__ import annotations

from typing import Any

import numpy as np

from dflash.data.packing import PackedBatch, RowPacker, check_layout, check_state_identity


class RandomStream:
    """Uniform random tokens in documents of random length, packed with no padding.

    Batch i is a pure function of (seed, rank, i): numpy default_rng([seed, rank, i]).
    Each row is filled exactly; the last document of a row is cut to fit. Every
    position is trainable. For smoke tests and benchmarks without data.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        seq_len: int,
        rows: int = 1,
        seed: int,
        min_doc_len: int,
        max_doc_len: int,
        rank: int = 0,
        world_size: int = 1,
        pad_id: int = 0,
    ) -> None:
        check_layout(seq_len, rows, seed, rank, world_size)
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if not 1 <= min_doc_len <= max_doc_len:
            raise ValueError(
                f"need 1 <= min_doc_len <= max_doc_len, got {min_doc_len}, {max_doc_len}"
            )
        self.vocab_size, self.seq_len, self.rows, self.seed = vocab_size, seq_len, rows, seed
        self.min_doc_len, self.max_doc_len = min_doc_len, max_doc_len
        # Rows are always filled exactly, so pad_id never appears; kept for a uniform API.
        self.rank, self.world_size, self.pad_id = rank, world_size, pad_id
        self.batch_index = self.samples = self.truncated = 0

    def batch_at(self, index: int) -> tuple[PackedBatch, int]:
        """Batch `index` and how many of its documents were cut to fit their row."""
        rng = np.random.default_rng([self.seed, self.rank, index])
        tokens = rng.integers(0, self.vocab_size, size=(self.rows, self.seq_len), dtype=np.int64)
        trainable = np.ones(self.seq_len, dtype=bool)
        packer = RowPacker(self.rows, self.seq_len, self.pad_id)
        cut = 0
        for r in range(self.rows):
            fill = 0
            while fill < self.seq_len:
                want = int(rng.integers(self.min_doc_len, self.max_doc_len + 1))
                n = min(want, self.seq_len - fill)
                packer.add(tokens[r, fill : fill + n], trainable[:n])
                fill, cut = fill + n, cut + int(n < want)
        return packer.build(), cut

    def __iter__(self) -> RandomStream:
        return self

    def __next__(self) -> PackedBatch:
        batch, cut = self.batch_at(self.batch_index)
        self.batch_index += 1
        self.samples += batch.n_docs
        self.truncated += cut
        return batch

    def state_dict(self) -> dict[str, Any]:
        # batch_index alone determines what comes next; the counters ride along so
        # stats() also survive a restore.
        return {
            "kind": "random",
            "seed": self.seed,
            "rank": self.rank,
            "batch_index": self.batch_index,
            "samples": self.samples,
            "truncated": self.truncated,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state_identity(
            "RandomStream", state, {"kind": "random", "seed": self.seed, "rank": self.rank}
        )
        self.batch_index = int(state["batch_index"])
        self.samples = int(state.get("samples", 0))
        self.truncated = int(state.get("truncated", 0))

    def stats(self) -> dict[str, int]:
        return {
            "samples": self.samples,
            "dropped_short": 0,
            "truncated": self.truncated,
            "bad_rows": 0,
            "epoch": 0,
            "batches": self.batch_index,
        }
