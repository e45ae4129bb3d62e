import pytest
import torch

from dflash.anchors import eligible_anchors, sample_anchors


def test_eligible_requires_loss_mask_same_document_and_room():
    doc = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, -1, -1]])
    lm = torch.ones_like(doc, dtype=torch.bool)
    lm[0, 5] = False
    elig = eligible_anchors(lm, doc, 3)
    # doc 0: 0,1 (block 0..2, 1..3); doc 1: 4,6 (5 has no loss mask, 7 runs into padding)
    assert elig[0].nonzero().flatten().tolist() == [0, 1, 4, 6]


@pytest.mark.parametrize("max_anchors", [1, 4, 64])
def test_static_shape_sorted_unique_and_eligible(max_anchors):
    gen = torch.Generator().manual_seed(0)
    doc = torch.tensor([[0] * 10 + [1] * 20, [0] * 25 + [-1] * 5])
    lm = torch.rand(2, 30, generator=gen) > 0.3
    anchors, valid = sample_anchors(lm, doc, 4, max_anchors, generator=gen)
    assert anchors.shape == valid.shape == (2, max_anchors)
    elig = eligible_anchors(lm, doc, 4)
    for b in range(2):
        chosen = anchors[b][valid[b]]
        assert torch.equal(chosen, chosen.sort().values)
        assert chosen.unique().numel() == chosen.numel()
        assert elig[b, chosen].all()
        assert valid[b].sum() == min(max_anchors, int(elig[b].sum()))
        # invalid slots sit at the end
        assert not valid[b, int(valid[b].sum()) :].any()


def test_deterministic_given_generator_state():
    doc = torch.zeros(1, 50, dtype=torch.long)
    lm = torch.ones(1, 50, dtype=torch.bool)
    a1 = sample_anchors(lm, doc, 4, 8, generator=torch.Generator().manual_seed(3))
    a2 = sample_anchors(lm, doc, 4, 8, generator=torch.Generator().manual_seed(3))
    a3 = sample_anchors(lm, doc, 4, 8, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a1[0], a2[0]) and not torch.equal(a1[0], a3[0])


def test_no_eligible_position_gives_all_invalid():
    doc = torch.tensor([[0, 0, 1, 1, 2, 2]])
    anchors, valid = sample_anchors(torch.ones_like(doc, dtype=torch.bool), doc, 4, 3)
    assert not valid.any() and (anchors == 0).all()
