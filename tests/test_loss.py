import math

import pytest
import torch
from torch import nn

from dflash.loss import block_targets, chunked_loss, default_gamma, slot_weights


def test_slot_weights_and_gamma_table():
    w = slot_weights(4, 2.0)
    assert w[0] == 0
    assert w[1:].tolist() == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0)])
    assert (default_gamma(16), default_gamma(10), default_gamma(8)) == (7.0, 5.0, 4.0)
    with pytest.raises(ValueError, match="--loss-gamma"):
        default_gamma(12)


def test_targets_no_shift_slot0_excluded_and_masked():
    ids = torch.arange(100, 112).view(1, 12)
    lm = torch.ones(1, 12, dtype=torch.bool)
    lm[0, 6] = False
    anchors, valid = torch.tensor([[2, 4, 0]]), torch.tensor([[True, True, False]])
    t = block_targets(ids, lm, anchors, valid, 4, gamma=4.0)
    assert t.labels.view(3, 4)[0].tolist() == [102, 103, 104, 105]  # token[a + k]
    w = t.weights.view(3, 4)
    assert w[:, 0].abs().sum() == 0  # slot 0 is the given anchor
    assert w[1, 2] == 0  # loss_mask[4 + 2] is off
    assert w[2].abs().sum() == 0  # invalid anchor
    assert w[0, 1] == 1.0


def _reference_loss(hidden, head, targets):
    logits = head(hidden.reshape(-1, hidden.shape[-1])).float()
    ce = nn.functional.cross_entropy(logits, targets.labels.reshape(-1), reduction="none")
    w = targets.weights.reshape(-1)
    return (ce * w).sum() / w.sum()


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen-head", "trainable-head"])
@pytest.mark.parametrize("chunk", [3, 7, 1000])
def test_chunked_equals_full_loss_and_grad(chunk, frozen):
    torch.manual_seed(0)
    head = nn.Linear(16, 50, bias=False).requires_grad_(not frozen)
    ids = torch.randint(0, 50, (2, 20))
    lm = torch.rand(2, 20) > 0.2
    anchors = torch.tensor([[0, 5, 9], [2, 8, 0]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    t = block_targets(ids, lm, anchors, valid, 4, gamma=4.0)
    h1 = torch.randn(2, 12, 16, requires_grad=True)
    h2 = h1.detach().clone().requires_grad_(True)
    loss, stats = chunked_loss(h1, head, t, 4, chunk_size=chunk)
    ref = _reference_loss(h2, head, t)
    torch.testing.assert_close(loss, ref)
    loss.backward()
    ref.backward()
    torch.testing.assert_close(h1.grad, h2.grad)
    if not frozen:  # a trainable head gets its gradient too (the checkpointed path)
        assert head.weight.grad is not None
    assert stats["count"][0] == 0 and stats["count"].sum() == t.counted.sum()


def test_accuracy_counts_per_slot():
    head = nn.Linear(4, 4, bias=False)
    head.weight.data = torch.eye(4)
    ids = torch.tensor([[0, 1, 2, 3, 0, 1]])
    anchors, valid = torch.tensor([[0]]), torch.tensor([[True]])
    t = block_targets(ids, torch.ones_like(ids, dtype=torch.bool), anchors, valid, 4, 4.0)
    hidden = torch.eye(4)[[0, 1, 3, 3]].view(1, 4, 4) * 10  # slot 2 predicts 3, label 2
    _, stats = chunked_loss(hidden, head, t, 4)
    assert stats["correct"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert stats["count"].tolist() == [0.0, 1.0, 1.0, 1.0]
