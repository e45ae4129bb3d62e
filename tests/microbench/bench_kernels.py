"""Host-side hot spots of one training step, each at the tiny-cpu bench's shapes
(512-token rows x 2, block 8, 32 anchors) and at a larger packing size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dflash.anchors import sample_anchors
from dflash.data.packing import RowPacker
from dflash.loss import block_targets, chunked_loss
from dflash.visibility import dense_mask, document_causal_dense

ROWS, SEQ, BS, ANCHORS, HIDDEN, VOCAB = 2, 512, 8, 32, 64, 384


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB - 64, (ROWS, SEQ), generator=g)
    doc = torch.cumsum((torch.rand(ROWS, SEQ, generator=g) < 1 / 96).long(), dim=1)
    mask = torch.ones(ROWS, SEQ, dtype=torch.bool)
    anchors, valid = sample_anchors(mask, doc, BS, ANCHORS, generator=g)
    return ids, mask, doc, anchors, valid


def test_anchor_sampling(benchmark, batch):
    _, mask, doc, _, _ = batch
    g = torch.Generator().manual_seed(1)
    anchors, valid = benchmark(sample_anchors, mask, doc, BS, ANCHORS, generator=g)
    assert anchors.shape == (ROWS, ANCHORS) and bool(valid.any())


def test_drafter_mask_build(benchmark, batch):
    _, _, doc, anchors, valid = batch
    mask = benchmark(dense_mask, anchors, valid, doc, BS)
    assert mask.dtype == torch.bool


def test_target_document_causal_mask(benchmark, batch):
    mask = benchmark(document_causal_dense, batch[2])
    assert mask.dtype == torch.bool


def test_chunked_loss_forward_backward(benchmark, batch):
    ids, mask, _, anchors, valid = batch
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    targets = block_targets(ids, mask, anchors, valid, BS, 4.0)
    hidden = torch.randn(ROWS, ANCHORS * BS, HIDDEN, requires_grad=True)

    def step():
        loss, _ = chunked_loss(hidden, head, targets, BS, chunk_size=128)
        loss.backward()
        return loss

    loss = benchmark(step)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("seq_len", [512, 3072])
def test_row_packing(benchmark, seq_len):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 1000, size=int(n)) for n in rng.integers(32, 400, size=200)]

    def pack():
        packer = RowPacker(4, seq_len, 0)
        for d in docs:
            if not packer.add(d, np.ones(len(d), dtype=bool)):
                break
        return packer.build()

    out = benchmark(pack)
    assert out.n_tokens > 0
