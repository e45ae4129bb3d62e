"""The visibility rule: a brute-force reference, property tests over random packings,
and agreement of the two attention paths (dense SDPA and flex_attention)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash.anchors import sample_anchors
from dflash.model import attend
from dflash.visibility import dense_mask, document_causal_dense, flex_block_mask


def reference_visible(anchors, valid, doc_ids, bs, window=None):
    """Loop-by-loop statement of the rule of docs/algorithm.md#visibility, independent of `visible`."""
    bsz, n = anchors.shape
    s = doc_ids.shape[1]
    out = torch.zeros(bsz, n * bs, s + n * bs, dtype=torch.bool)
    for b in range(bsz):
        for j in range(n):
            if not valid[b, j]:
                continue
            a = int(anchors[b, j])
            for k in range(bs):
                q = j * bs + k
                for kv in range(s):
                    ok = doc_ids[b, kv] == doc_ids[b, a] and kv < a
                    if window is not None:
                        ok = ok and (a + k) - kv < window
                    out[b, q, kv] = ok
                for k2 in range(bs):
                    ok = True if window is None else (k2 <= k and k - k2 < window)
                    out[b, q, s + j * bs + k2] = ok
    return out


@st.composite
def packings(draw):
    bsz = draw(st.integers(1, 2))
    s = draw(st.integers(8, 40))
    bs = draw(st.integers(2, 5))
    rows = []
    for _ in range(bsz):
        lens, total = [], 0
        while total < s:
            n = draw(st.integers(1, 14))
            lens.append(min(n, s - total))
            total += lens[-1]
        pad = draw(st.integers(0, min(4, lens[-1] - 1))) if lens[-1] > 1 else 0
        doc = []
        for d, n in enumerate(lens):
            doc += [d] * n
        if pad:
            doc[-pad:] = [-1] * pad
        rows.append(doc)
    doc_ids = torch.tensor(rows)
    loss_mask = torch.tensor(draw(st.lists(st.booleans(), min_size=bsz * s, max_size=bsz * s)))
    loss_mask = loss_mask.view(bsz, s)
    max_anchors = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**16))
    window = draw(st.one_of(st.none(), st.integers(1, 6)))
    return doc_ids, loss_mask, bs, max_anchors, seed, window


@settings(max_examples=60, deadline=None)
@given(packings())
def test_dense_mask_equals_reference_rule(p):
    doc_ids, loss_mask, bs, max_anchors, seed, window = p
    gen = torch.Generator().manual_seed(seed)
    anchors, valid = sample_anchors(loss_mask, doc_ids, bs, max_anchors, generator=gen)
    got = dense_mask(anchors, valid, doc_ids, bs, window)[:, 0]
    assert torch.equal(got, reference_visible(anchors, valid, doc_ids, bs, window))


@settings(max_examples=60, deadline=None)
@given(packings())
def test_rule_invariants(p):
    """Stated directly: strict anchor, same document, own block only, padding sees nothing."""
    doc_ids, loss_mask, bs, max_anchors, seed, _ = p
    gen = torch.Generator().manual_seed(seed)
    anchors, valid = sample_anchors(loss_mask, doc_ids, bs, max_anchors, generator=gen)
    mask = dense_mask(anchors, valid, doc_ids, bs)[:, 0]
    s = doc_ids.shape[1]
    for b in range(anchors.shape[0]):
        for j in range(anchors.shape[1]):
            rows = mask[b, j * bs : (j + 1) * bs]
            if not valid[b, j]:
                assert not rows.any(), "padding block sees something"
                continue
            a = int(anchors[b, j])
            ctx = rows[:, :s].any(0).nonzero().flatten()
            assert (ctx < a).all(), "context at or after the anchor is visible"
            assert (doc_ids[b, ctx] == doc_ids[b, a]).all(), "another document is visible"
            blk = rows[:, s:].any(0).nonzero().flatten() // bs
            assert (blk == j).all(), "another block is visible"
            assert rows[:, s + j * bs : s + (j + 1) * bs].all(), "own block not fully visible"


def test_rule_catches_an_inclusive_anchor():
    """The reference is not vacuous: an off-by-one (kv <= anchor) differs from it."""
    doc_ids = torch.zeros(1, 16, dtype=torch.long)
    anchors, valid = torch.tensor([[5, 9]]), torch.tensor([[True, True]])
    ref = reference_visible(anchors, valid, doc_ids, 4)
    bad = ref.clone()
    bad[0, :4, 5] = True  # block 0 also sees its anchor's own context position
    assert not torch.equal(bad, dense_mask(anchors, valid, doc_ids, 4)[:, 0])


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("layout", ["one_doc", "packed", "padded"])
def test_dense_and_flex_paths_agree(layout, window):
    torch.manual_seed(0)
    bs, s, heads, kv_heads, d = 4, 32, 4, 2, 16
    doc = {
        "one_doc": [0] * s,
        "packed": [0] * 10 + [1] * 13 + [2] * 9,
        "padded": [0] * 12 + [1] * 14 + [-1] * 6,
    }[layout]
    doc_ids = torch.tensor([doc, doc[::-1] if layout == "one_doc" else doc])
    loss_mask = torch.ones_like(doc_ids, dtype=torch.bool)
    gen = torch.Generator().manual_seed(1)
    anchors, valid = sample_anchors(loss_mask, doc_ids, bs, 6, generator=gen)
    valid[1, -1] = False  # force a padding block
    q_len, kv_len = 6 * bs, s + 6 * bs
    q = torch.randn(2, heads, q_len, d)
    k = torch.randn(2, kv_heads, kv_len, d)
    v = torch.randn(2, kv_heads, kv_len, d)
    dense = attend(q, k, v, dense_mask(anchors, valid, doc_ids, bs, window), d**-0.5)
    flex = attend(q, k, v, flex_block_mask(anchors, valid, doc_ids, bs, window), d**-0.5)
    torch.testing.assert_close(dense, flex, atol=1e-5, rtol=1e-4)
    # padding block: zeros on both paths
    assert dense[1, :, -bs:].abs().max() == 0


def test_dense_path_gradients_are_finite_with_padding_blocks():
    doc_ids = torch.zeros(1, 12, dtype=torch.long)
    anchors, valid = torch.tensor([[3, 0]]), torch.tensor([[True, False]])
    mask = dense_mask(anchors, valid, doc_ids, 4)
    q = torch.randn(1, 2, 8, 8, requires_grad=True)
    k = torch.randn(1, 2, 20, 8, requires_grad=True)
    attend(q, k, k, mask, 8**-0.5).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert q.grad[0, :, 4:].abs().max() == 0  # the padding block got no gradient


def test_document_causal_mask():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1, -1]])
    m = document_causal_dense(doc_ids)[0, 0]
    assert m[2].tolist() == [True, True, True, False, False, False]
    assert m[4].tolist() == [False, False, False, True, True, False]
    assert m[5].tolist() == [False, False, False, False, False, True]
