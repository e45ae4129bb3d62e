"""The pipeline's wire format (dflash/distributed/p2p.py): one message per batch, the
metadata then the features, packed and read back without a copy. The transfer itself is
tested by the real torchrun jobs in test_pipeline.py."""

from __future__ import annotations

import pytest
import torch

from dflash.data.packing import PackedBatch
from dflash.distributed.p2p import HEADER, Wire, pack_meta, unpack_meta
from dflash.distributed.telemetry import COUNTERS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, seq, feat_dim", [(2, 5, 3), (1, 7, 6)])
def test_one_message_holds_the_metadata_then_the_features(dtype, rows, seq, feat_dim):
    wire = Wire(rows, seq, feat_dim, dtype)
    message = wire.empty("cpu")
    meta_bytes = (HEADER + 4 * rows * seq) * 8
    offset = wire.feat_offset
    assert meta_bytes <= offset < meta_bytes + 256 and offset % 256 == 0
    assert message.numel() == offset + rows * seq * feat_dim * dtype.itemsize
    meta, feats = wire.split(message)
    assert meta.numel() == HEADER + 4 * rows * seq and meta.data_ptr() == message.data_ptr()
    assert feats.shape == (rows, seq, feat_dim) and feats.dtype == dtype
    assert feats.data_ptr() - message.data_ptr() == offset  # as aligned as a tensor of its own
    g = torch.Generator().manual_seed(0)
    batch = PackedBatch(
        input_ids=torch.randint(0, 1000, (rows, seq), generator=g),
        loss_mask=torch.rand(rows, seq, generator=g) > 0.5,
        doc_ids=torch.randint(-1, 3, (rows, seq), generator=g),
        positions=torch.randint(0, seq, (rows, seq), generator=g),
        n_docs=3,
        n_tokens=rows * seq - 1,
    )
    counters = list(range(10, 10 + len(COUNTERS)))
    assert pack_meta(batch, 42, counters, meta) is meta  # written in place, into the message
    want = torch.randn(rows, seq, feat_dim, generator=g).to(dtype)
    feats.copy_(want)  # the target's forward writes here (TargetFeatures(out=...))
    # What the drafter reads back from a received copy of the bytes.
    header, ids, mask, docs, pos = unpack_meta(wire.split(message.clone())[0], rows, seq)
    assert header.tolist() == [42, rows * seq - 1, 3, *counters]
    for got, ref in ((ids, batch.input_ids), (mask, batch.loss_mask), (docs, batch.doc_ids)):
        assert torch.equal(got, ref)
    assert torch.equal(pos, batch.positions)
    assert torch.equal(wire.split(message.clone())[1], want)
