"""Infinite, resumable stream of PackedBatch from chat records (RandomStream re-exported).

Resumption is exact: `load_state_dict(s.state_dict())` on a fresh stream built with
the same arguments yields the very batches `s` would have yielded next. For real
data the state is (epoch, cursor into this rank's order, counters); a document that
did not fit in the last batch is not part of the state, because the cursor still
points at it and rendering is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dflash.data.packing import PackedBatch, RowPacker, check_layout, check_state_identity
from dflash.data.random_stream import RandomStream
from dflash.data.render import render
from dflash.data.sources import DataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from dflash.data.sources import RecordSet

__all__ = ["RandomStream", "SampleStream"]

_SAMPLE_COUNTERS = ("samples", "dropped_short", "truncated", "batches")
_SAMPLE_STATE = ("epoch", "cursor", "epoch_used", *_SAMPLE_COUNTERS)


class SampleStream:
    """Chat records -> rendered, filtered, greedily packed batches, forever.

    Epoch e visits `perm_e[rank::world_size]` where perm_e is a permutation of all
    records drawn from numpy's default_rng([seed, e]): ranks see disjoint shards
    and every epoch is reshuffled. Samples are rendered lazily, truncated to seq_len,
    and dropped if fewer than `min_loss_tokens` loss tokens remain.
    """

    def __init__(
        self,
        records: Sequence[list[dict[str, str]]] | RecordSet,
        tokenizer: PreTrainedTokenizerBase,
        *,
        seq_len: int,
        rows: int = 1,
        seed: int,
        min_loss_tokens: int,
        rank: int = 0,
        world_size: int = 1,
        pad_id: int | None = None,
    ) -> None:
        check_layout(seq_len, rows, seed, rank, world_size)
        if min_loss_tokens < 0:
            raise ValueError(f"min_loss_tokens must be >= 0, got {min_loss_tokens}")
        self.source = str(getattr(records, "source", "<records>"))
        if len(records) < world_size:
            raise DataError(
                f"{self.source} has {len(records)} records, fewer than world_size="
                f"{world_size}: some ranks would get no data. Use more data or fewer ranks."
            )
        if pad_id is None:
            pad_id = tokenizer.pad_token_id
            pad_id = tokenizer.eos_token_id if pad_id is None else pad_id
        if pad_id is None:
            raise DataError("tokenizer has neither pad_token_id nor eos_token_id; pass pad_id=")
        self.records, self.tokenizer = records, tokenizer
        self.seq_len, self.rows, self.seed = seq_len, rows, seed
        self.min_loss_tokens, self.rank, self.world_size = min_loss_tokens, rank, world_size
        self.pad_id = int(pad_id)
        self.epoch = self.cursor = self.epoch_used = 0
        self.samples = self.dropped_short = self.truncated = self.batches = 0
        self._order_epoch, self._order = -1, np.empty(0, dtype=np.int64)
        # Rendered sample at (epoch, cursor) that did not fit in the previous batch.
        self._pending: tuple[int, int, list[int], list[int], bool] | None = None

    def order(self, epoch: int) -> np.ndarray:
        """Record indices this rank visits in `epoch`, in order."""
        if self._order_epoch != epoch:
            perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.records))
            self._order_epoch, self._order = epoch, perm[self.rank :: self.world_size]
        return self._order

    def _peek(self) -> tuple[list[int], list[int], bool]:
        """Next usable sample (ids, mask, truncated) without consuming it."""
        while True:
            order = self.order(self.epoch)
            if self.cursor == len(order):
                if self.epoch_used == 0:
                    raise DataError(
                        f"{self.source}: no usable sample in epoch {self.epoch} on rank "
                        f"{self.rank}/{self.world_size}: all {len(order)} had fewer than "
                        f"min_loss_tokens={self.min_loss_tokens} loss tokens after "
                        f"truncation to seq_len={self.seq_len} ({self.dropped_short} dropped "
                        "so far). Lower min_loss_tokens, raise seq_len, or check that "
                        "records contain assistant turns."
                    )
                self.epoch, self.cursor, self.epoch_used = self.epoch + 1, 0, 0
                continue
            p = self._pending
            if p is not None and p[:2] == (self.epoch, self.cursor):
                return p[2], p[3], p[4]
            index = int(order[self.cursor])
            try:
                ids, mask = render(self.tokenizer, self.records[index])
            except DataError as e:
                raise DataError(f"{self.source}, record {index}: {e}") from None
            cut = len(ids) > self.seq_len
            ids, mask = ids[: self.seq_len], mask[: self.seq_len]
            if not ids or sum(mask) < self.min_loss_tokens:
                self.dropped_short += 1
                self.cursor += 1
                continue
            self._pending = (self.epoch, self.cursor, ids, mask, cut)
            return ids, mask, cut

    def __iter__(self) -> SampleStream:
        return self

    def __next__(self) -> PackedBatch:
        packer = RowPacker(self.rows, self.seq_len, self.pad_id)
        while not packer.full:
            ids, mask, cut = self._peek()
            if not packer.add(ids, mask):
                break  # stays pending: it opens the next batch
            # Counters move only when a sample is placed, so a state saved while a
            # sample is pending does not count it twice after a restore.
            self._pending = None
            self.cursor += 1
            self.epoch_used += 1
            self.samples += 1
            self.truncated += int(cut)
        self.batches += 1
        return packer.build()

    def _identity(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "n_records": len(self.records),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "sample",
            **self._identity(),
            **{k: getattr(self, k) for k in _SAMPLE_STATE},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state_identity("SampleStream", state, {"kind": "sample", **self._identity()})
        missing = [k for k in _SAMPLE_STATE if not isinstance(state.get(k), int)]
        if missing:
            raise ValueError(f"SampleStream state lacks integer field(s) {missing}")
        for k in _SAMPLE_STATE:
            setattr(self, k, int(state[k]))
        self._pending = None

    def stats(self) -> dict[str, int]:
        out = {k: getattr(self, k) for k in _SAMPLE_COUNTERS}
        return {**out, "bad_rows": int(getattr(self.records, "bad_rows", 0)), "epoch": self.epoch}
