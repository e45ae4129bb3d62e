"""The DFlash2 selector loss (dflash.loss_dflash2) against a slot-by-slot hand computation."""

import pytest
import torch
import torch.nn.functional as F

from dflash.export_dflash2 import DFlash2Settings
from dflash.loss import block_targets, chunked_loss
from dflash.loss_dflash2 import dflash2_loss, predecessors, selector_loss, training_candidates
from dflash.model_dflash2 import CandidateSelector

BS, K, V, H = 4, 4, 12, 8


def test_predecessors_are_the_previous_tokens_of_the_block():
    labels = torch.tensor([[10, 11, 12, 13, 20, 21, 22, 23]])
    assert predecessors(labels, BS).tolist() == [[10, 10, 11, 12, 20, 20, 21, 22]]


def test_training_candidates():
    ids = torch.tensor([[5, 6, 7], [5, 6, 7]])
    labels = torch.tensor([6, 9])
    cand, index, labelled = training_candidates(ids, labels, "inject")
    assert cand.tolist() == [[5, 6, 7], [5, 6, 9]]  # 9 replaces the weakest candidate
    assert index.tolist() == [1, 2] and labelled.tolist() == [True, True]
    cand, index, labelled = training_candidates(ids, labels, "exclude")
    assert cand.tolist() == ids.tolist() and labelled.tolist() == [True, False]
    assert index[0] == 1


def setup(seed=2):  # a seed where 5 of the 8 counted slots have the true token in the top-k
    g = torch.Generator().manual_seed(seed)
    sel = CandidateSelector(V, H, rank=4, top_k=K, std=0.5)
    with torch.no_grad():
        sel.successor_codebook.normal_(0, 1.0, generator=g)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    input_ids = torch.randint(0, V, (1, 12), generator=g)
    loss_mask = torch.ones(1, 12, dtype=torch.long)
    loss_mask[0, 9] = 0
    anchors, valid = torch.tensor([[1, 5, 8]]), torch.tensor([[True, True, True]])
    targets = block_targets(input_ids, loss_mask, anchors, valid, BS, gamma=2.0)
    hidden = torch.randn(1, 3 * BS, H, generator=g, requires_grad=True)
    return sel, head, targets, hidden


def by_hand(sel, head, targets, hidden, missing):
    """Per slot: top-k unary candidates, the true token injected (or the slot dropped),
    scored after the true predecessor, CE on its index, decay-weighted mean."""
    labels, w = targets.labels[0], targets.weights[0]
    num = den = 0.0
    for i in range(labels.numel()):
        if w[i] == 0:
            continue
        logits = head(hidden[0, i])
        top = logits.topk(K).indices.tolist()
        gold, prev = int(labels[i]), int(labels[i - 1])
        if gold not in top:
            if missing == "exclude":
                continue
            top[-1] = gold
        ids = torch.tensor(top)
        gate = sel.predecessor_codebook[prev] * sel.hidden_projection(hidden[0, i])
        scores = logits[ids] + sel.successor_codebook[ids] @ gate
        num = num + w[i] * F.cross_entropy(scores[None], torch.tensor([top.index(gold)]))
        den = den + w[i]
    return num / den


@pytest.mark.parametrize("missing", ["inject", "exclude"])
def test_selector_loss_is_the_definition(missing):
    sel, head, targets, hidden = setup()
    got, stats = selector_loss(hidden, head, sel, targets, BS, missing=missing, chunk_size=5)
    want = by_hand(sel, head, targets, hidden, missing)
    torch.testing.assert_close(got, want)
    assert stats["covered"][0] == 0 and stats["covered"].sum() <= targets.counted.sum()
    # Gradients reach the selector's three tensors and the drafter output.
    got.backward()
    for p in (sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0
    assert hidden.grad.abs().sum() > 0


def test_not_vacuous_some_targets_are_injected():
    sel, head, targets, hidden = setup()
    _, stats = selector_loss(hidden, head, sel, targets, BS)
    assert 0 < stats["covered"].sum() < targets.counted.sum()
    inject = selector_loss(hidden, head, sel, targets, BS)[0]
    exclude = selector_loss(hidden, head, sel, targets, BS, missing="exclude")[0]
    assert not torch.isclose(inject, exclude)


def test_dflash2_loss_adds_the_weighted_selector_term():
    sel, head, targets, hidden = setup()
    with torch.no_grad():
        total, stats = dflash2_loss(hidden, head, sel, targets, BS, alpha=0.5)
        unary, _ = chunked_loss(hidden, head, targets, BS)
        sel_loss, _ = selector_loss(hidden, head, sel, targets, BS)
    torch.testing.assert_close(total, unary + 0.5 * sel_loss)
    assert {"correct", "count", "selector_correct", "covered", "selector_loss"} <= set(stats)
    with pytest.raises(ValueError, match="alpha -1"):
        dflash2_loss(hidden, head, sel, targets, BS, alpha=-1)
    with pytest.raises(ValueError, match="missing='drop'"):
        selector_loss(hidden, head, sel, targets, BS, missing="drop")
    assert DFlash2Settings().selector_top_k == 16
