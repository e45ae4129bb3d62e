"""Packed batches: documents laid end to end in a fixed [rows, seq_len] token budget.

Fixed shapes keep compiled code from recompiling. Per token we carry the document
id within its row (the target forward must be document-causal and anchor blocks
must not cross documents) and the position within its document (RoPE restarts at 0
for each document, as if it had been run alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

PAD_DOC = -1  # doc_ids value on padding


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # int64 [R, T]; pad_id on padding
    loss_mask: torch.Tensor  # bool  [R, T]; False on padding
    doc_ids: torch.Tensor  # int64 [R, T]; 0, 1, 2, ... per document within a row, -1 = padding
    positions: torch.Tensor  # int64 [R, T]; 0.. within each document, 0 on padding
    n_docs: int  # documents in the whole batch (all rows)
    n_tokens: int  # non-padding tokens in the whole batch

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=non_blocking)

        return PackedBatch(
            move(self.input_ids),
            move(self.loss_mask),
            move(self.doc_ids),
            move(self.positions),
            self.n_docs,
            self.n_tokens,
        )


def check_layout(seq_len: int, rows: int, seed: int, rank: int, world_size: int) -> None:
    """Validate the arguments every stream shares (seed >= 0: numpy SeedSequence)."""
    if seq_len < 1 or rows < 1:
        raise ValueError(f"need seq_len >= 1 and rows >= 1, got seq_len={seq_len} rows={rows}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")


def check_state_identity(kind: str, state: dict[str, Any], expected: dict[str, Any]) -> None:
    """Raise ValueError if a saved stream state belongs to a differently built stream."""
    # A cursor is only meaningful for the order it indexes: refuse a state saved for
    # another seed, shard or dataset instead of silently resuming somewhere else.
    for key, value in expected.items():
        if state.get(key) != value:
            raise ValueError(
                f"{kind} state was saved with {key}={state.get(key)!r}, this stream has "
                f"{key}={value!r}; resume with the same data, seed, rank and world_size."
            )


class RowPacker:
    """Greedy first-come packing into `rows` rows of `seq_len` tokens.

    Documents go into the current row in the order given. If one does not fit in
    what is left of the row, the row is closed (the rest is padding) and the document
    opens the next row; if there is no next row, `add` returns False and the document
    is NOT placed (the caller carries it to the next batch). A row filled exactly is
    closed at once, so `full` is known without looking at the next document.
    """

    def __init__(self, rows: int, seq_len: int, pad_id: int) -> None:
        if rows < 1 or seq_len < 1:
            raise ValueError(f"need rows >= 1 and seq_len >= 1, got rows={rows} seq_len={seq_len}")
        self.rows, self.seq_len = rows, seq_len
        self._ids = np.full((rows, seq_len), pad_id, dtype=np.int64)
        self._mask = np.zeros((rows, seq_len), dtype=bool)
        self._doc = np.full((rows, seq_len), PAD_DOC, dtype=np.int64)
        self._pos = np.zeros((rows, seq_len), dtype=np.int64)
        self._row = 0  # current (open) row; == rows once every row is closed
        self._fill = 0  # tokens used in the current row
        self._row_docs = 0  # documents in the current row
        self.n_docs = 0
        self.n_tokens = 0

    @property
    def full(self) -> bool:
        return self._row >= self.rows

    def add(self, ids: Sequence[int] | np.ndarray, mask: Sequence[int] | np.ndarray) -> bool:
        """Place one document; False if the batch has no room for it (nothing placed)."""
        n = len(ids)
        if n != len(mask):
            raise ValueError(f"ids and mask lengths differ: {n} vs {len(mask)}")
        if not 1 <= n <= self.seq_len:
            raise ValueError(f"document length {n} outside [1, seq_len={self.seq_len}]")
        if self.full:
            return False
        if n > self.seq_len - self._fill:
            self._next_row()
            if self.full:
                return False
        r, a, b = self._row, self._fill, self._fill + n
        self._ids[r, a:b] = ids
        self._mask[r, a:b] = np.asarray(mask, dtype=bool)
        self._doc[r, a:b] = self._row_docs
        self._pos[r, a:b] = np.arange(n)
        self._fill, self._row_docs = b, self._row_docs + 1
        self.n_docs += 1
        self.n_tokens += n
        if self._fill == self.seq_len:
            self._next_row()
        return True

    def _next_row(self) -> None:
        self._row, self._fill, self._row_docs = self._row + 1, 0, 0

    def build(self) -> PackedBatch:
        """The batch so far; unfilled rows are all padding."""
        return PackedBatch(
            input_ids=torch.from_numpy(self._ids.copy()),
            loss_mask=torch.from_numpy(self._mask.copy()),
            doc_ids=torch.from_numpy(self._doc.copy()),
            positions=torch.from_numpy(self._pos.copy()),
            n_docs=self.n_docs,
            n_tokens=self.n_tokens,
        )
