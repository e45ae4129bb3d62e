"""DFlash2 drafter: the in-block convolutions, the selector walk, the export format."""

import json

import pytest
import torch
from safetensors.torch import load_file
from test_model import expected_keys

from dflash.export import DrafterConfigError
from dflash.export_dflash2 import DFlash2Settings, published_weight_names, settings_of
from dflash.model import DFlashDraftModel, make_draft_config
from dflash.model_dflash2 import (
    DFlash2DraftModel,
    GroupedDynamicConv,
    block_causal_conv,
    drafter_class,
    make_dflash2_config,
)
from dflash.visibility import dense_mask

SETTINGS = DFlash2Settings(
    conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=5
)
BS = 4


def config(tiny, settings=SETTINGS):
    return make_dflash2_config(
        tiny,
        settings=settings,
        num_layers=2,
        block_size=BS,
        mask_token_id=120,
        target_layer_ids=[1, 5],
    )


def randomize(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def naive_conv(x, delta, base, block_len):
    """out[i, c] = sum_t (base[t, c] + delta[i, t, c // group]) * x[i - t, c], in-block."""
    q, h = x.shape[1], x.shape[2]
    group = h // delta.shape[-1]
    out = torch.zeros_like(x)
    for i in range(q):
        for t in range(base.shape[0]):
            if i % block_len - t < 0:
                continue
            for c in range(h):
                out[0, i, c] += (base[t, c] + delta[0, i, t, c // group]) * x[0, i - t, c]
    return out


def test_conv_is_the_formula():
    g = torch.Generator().manual_seed(0)
    x, delta, base = (torch.randn(s, generator=g) for s in ((1, 8, 8), (1, 8, 3, 2), (3, 8)))
    torch.testing.assert_close(block_causal_conv(x, delta, base, 4), naive_conv(x, delta, base, 4))


@pytest.mark.parametrize("side", ["prepare", "finish"])
def test_conv_is_causal_within_the_block(side):
    """Slot i of a block reads slots i-K+1..i of that block only: changing slot j moves
    slots j..j+K-1 of its block and nothing else, on either side of the sublayer."""
    torch.manual_seed(0)
    conv = randomize(GroupedDynamicConv(64, 3, 16))
    n_blocks, q = 3, 3 * BS
    x = torch.randn(1, q, 64)
    taps = torch.randn(1, q, 3, 4)

    def run(inp):
        if side == "prepare":
            return conv.prepare(inp, BS)[0]
        return conv.finish(inp, taps, BS)

    base = run(x)
    for j in range(q):
        y = x.clone()
        y[0, j] += 1.0
        moved = (run(y) - base).abs().amax(-1)[0] > 0
        block, slot = divmod(j, BS)
        want = torch.zeros(q, dtype=torch.bool)
        want[j : block * BS + min(BS, slot + 3)] = True
        assert torch.equal(moved, want), (j, moved.tolist())
    assert n_blocks * BS == q


def test_fresh_dflash2_computes_dflash(tiny_qwen3_config):
    """Identity-initialised convolutions and a zero successor codebook: a fresh DFlash2
    drafter with DFlash's weights has DFlash's output and proposes DFlash's argmax."""
    torch.manual_seed(0)
    d2 = DFlash2DraftModel(config(tiny_qwen3_config)).eval()
    d1 = DFlashDraftModel(
        make_draft_config(
            tiny_qwen3_config,
            num_layers=2,
            block_size=BS,
            mask_token_id=120,
            target_layer_ids=[1, 5],
        )
    ).eval()
    missing = d2.load_state_dict(randomize(d1).state_dict(), strict=False)
    assert not missing.unexpected_keys
    assert set(missing.missing_keys) == published_weight_names(d2.config)
    anchors = torch.tensor([[2, 5]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    mask = dense_mask(anchors, valid, torch.zeros(1, 8, dtype=torch.long), BS)
    args = (torch.randn(1, 2 * BS, 64), torch.randn(1, 8, 64), torch.arange(8)[None])
    pos = (anchors.unsqueeze(-1) + torch.arange(BS)).view(1, -1)
    with torch.no_grad():
        h1, h2 = d1(*args, pos, mask), d2(*args, pos, mask)
        torch.testing.assert_close(h2, h1)
        head = torch.nn.Linear(64, 128, bias=False)
        tokens, _, _ = d2.propose(h2[:, 1:BS], torch.tensor([3]), head)
        assert torch.equal(tokens, head(h2[:, 1:BS]).argmax(-1))


def test_packed_blocks_equal_separate_blocks(tiny_qwen3_config):
    """The training layout (A blocks in one call) computes what A decode-time calls do."""
    torch.manual_seed(0)
    d2 = randomize(DFlash2DraftModel(config(tiny_qwen3_config))).eval()
    anchors, ctx_len = [2, 5, 7], 9
    ctx = torch.randn(1, ctx_len, 64)
    embeds = torch.randn(1, 3 * BS, 64)
    pos = (torch.tensor(anchors)[:, None] + torch.arange(BS)).view(1, -1)
    doc = torch.zeros(1, ctx_len, dtype=torch.long)

    def mask(a):
        t = torch.tensor([a])
        return dense_mask(t, torch.ones_like(t, dtype=torch.bool), doc, BS)

    with torch.no_grad():
        packed = d2(embeds, ctx, torch.arange(ctx_len)[None], pos, mask(anchors))
        for j, a in enumerate(anchors):
            sl = slice(j * BS, (j + 1) * BS)
            alone = d2(embeds[:, sl], ctx, torch.arange(ctx_len)[None], pos[:, sl], mask([a]))
            torch.testing.assert_close(packed[:, sl], alone, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="neither one block nor whole blocks"):
        d2.block_length(BS + 1)
    assert d2.block_length(BS - 1) == BS - 1


def test_selector_walk_follows_predecessors(tiny_qwen3_config):
    """Greedy walk == a hand-rolled argmax of unary + <P[prev] * W h, S[cand]> per slot."""
    torch.manual_seed(0)
    d2 = randomize(DFlash2DraftModel(config(tiny_qwen3_config)))
    sel = d2.candidate_selector
    hidden, head = torch.randn(2, 3, 64), torch.nn.Linear(64, 128, bias=False)
    anchors = torch.tensor([4, 9])
    with torch.no_grad():
        tokens, cand, q = d2.propose(hidden, anchors, head)
        logits = head(hidden)
        for b in range(2):
            prev = int(anchors[b])
            for i in range(3):
                top = logits[b, i].topk(5)
                gate = sel.predecessor_codebook[prev] * sel.hidden_projection(hidden[b, i])
                score = top.values + sel.successor_codebook[top.indices] @ gate
                prev = int(top.indices[score.argmax()])
                assert int(tokens[b, i]) == prev
        assert q is None and cand.shape == (2, 3, 5)
        # Sampling: a proposal over the k candidates per slot, and tokens drawn from them.
        g = torch.Generator().manual_seed(0)
        tokens, cand, q = d2.propose(hidden, anchors, head, temperature=0.7, generator=g)
        torch.testing.assert_close(q.sum(-1), torch.ones(2, 3))
        assert (cand == tokens.unsqueeze(-1)).any(-1).all()


def test_export_format(tmp_path, tiny_qwen3_config):
    torch.manual_seed(0)
    model = randomize(DFlash2DraftModel(config(tiny_qwen3_config)))
    model.save_pretrained(tmp_path)
    names = set(load_file(tmp_path / "model.safetensors"))
    assert names == expected_keys(2) | published_weight_names(model.config)
    assert "candidate_selector.predecessor_codebook" in names  # no ".weight": as published
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["architectures"] == ["DFlash2DraftModel"]
    assert {k: conf["dflash_config"][k] for k in SETTINGS.as_dict()} == SETTINGS.as_dict()
    back = DFlash2DraftModel.from_pretrained(tmp_path)
    assert drafter_class(back.config) is DFlash2DraftModel
    for (k, a), b in zip(model.state_dict().items(), back.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_settings_are_validated(tiny_qwen3_config):
    with pytest.raises(
        DrafterConfigError, match="conv_group_size: 24 does not divide hidden_size 64"
    ):
        config(tiny_qwen3_config, DFlash2Settings(conv_group_size=24, selector_rank=8))
    with pytest.raises(DrafterConfigError, match="conv_kernel_size: 5 taps exceed block_size 4"):
        config(tiny_qwen3_config, DFlash2Settings(conv_kernel_size=5))
    with pytest.raises(DrafterConfigError, match="selector_top_k: 200 exceeds vocab_size 128"):
        config(tiny_qwen3_config, DFlash2Settings(selector_top_k=200))
    with pytest.raises(DrafterConfigError, match="selector_rank: expected a positive integer"):
        DFlash2Settings(selector_rank=0)
    raw = config(tiny_qwen3_config).to_dict()
    assert settings_of({**raw, "selector_rank": 8}) == SETTINGS  # a top-level copy that agrees
    with pytest.raises(DrafterConfigError, match="selector_rank: 16 disagrees with dflash_config"):
        settings_of({**raw, "selector_rank": 16})
    del raw["dflash_config"]["conv_kernel_size"]
    with pytest.raises(DrafterConfigError, match="dflash_config.conv_kernel_size: missing"):
        settings_of(raw)
    plain = make_draft_config(
        tiny_qwen3_config, num_layers=1, block_size=BS, mask_token_id=120, target_layer_ids=[1]
    )
    assert drafter_class(plain) is DFlashDraftModel


def test_draft_step_drives_dflash2(tiny_qwen3_config):
    """DraftStep (the trainer's forward) runs a DFlash2 drafter unchanged; the selector
    loss on its output trains the convolutions and the selector."""
    from dflash.data.packing import PackedBatch
    from dflash.draft_step import DraftStep
    from dflash.loss import block_targets
    from dflash.loss_dflash2 import dflash2_loss

    torch.manual_seed(0)
    d2 = randomize(DFlash2DraftModel(config(tiny_qwen3_config)))
    embed, head = torch.nn.Embedding(128, 64), torch.nn.Linear(64, 128, bias=False)
    step = DraftStep(d2, embed, head, gamma=4.0, loss_chunk=7, attn="sdpa")
    ids = torch.randint(0, 120, (1, 16))
    batch = PackedBatch(
        input_ids=ids,
        loss_mask=torch.ones(1, 16, dtype=torch.bool),
        doc_ids=torch.zeros(1, 16, dtype=torch.long),
        positions=torch.arange(16)[None],
        n_docs=1,
        n_tokens=16,
    )
    feats = torch.randn(1, 16, 128)
    anchors, valid = torch.tensor([[2, 6, 11]]), torch.ones(1, 3, dtype=torch.bool)
    loss, stats = step(batch, feats, anchors, valid)
    assert torch.isfinite(loss) and stats["count"].sum() == 9
    block_ids, block_pos = step.block_inputs(ids, batch.positions, anchors)
    mask = step.masks(anchors, valid, batch.doc_ids)
    hidden = d2(embed(block_ids), d2.project_context(feats), batch.positions, block_pos, mask)
    targets = block_targets(ids, batch.loss_mask, anchors, valid, BS, 4.0)
    total, _ = dflash2_loss(hidden, head, d2.candidate_selector, targets, BS)
    total.backward()
    conv = d2.layers[0].attention_conv
    assert (
        conv.base_kernel.grad.abs().sum() > 0 and conv.kernel_projection.weight.grad.abs().sum() > 0
    )
    assert d2.candidate_selector.successor_codebook.grad.abs().sum() > 0


def test_cached_drafting_is_the_forward(tiny_qwen3_config):
    """CachedDFlash2Drafter (eval's cached context K/V) drafts what forward + propose
    draft over the same context; sampling returns a proposal over the vocabulary that
    lives on each slot's candidates."""
    from types import SimpleNamespace

    from dflash.decode_dflash2 import CachedDFlash2Drafter

    torch.manual_seed(0)
    d2 = randomize(DFlash2DraftModel(config(tiny_qwen3_config))).eval()
    embed, head = torch.nn.Embedding(128, 64), torch.nn.Linear(64, 128, bias=False)
    cached = CachedDFlash2Drafter(d2, embed, head)
    feats, s = torch.randn(1, 6, 128), 6
    cached.extend(feats[:, :4], torch.arange(4)[None])
    cached.extend(feats[:, 4:], torch.arange(4, 6)[None])  # two extends, as decoding does
    block = cached.propose(anchor=7, anchor_pos=s, block_size=BS)
    with torch.no_grad():
        ids = torch.tensor([[7] + [d2.mask_token_id] * (BS - 1)])
        mask = torch.ones(1, 1, BS, s + BS, dtype=torch.bool)  # the whole context, the block
        ctx = d2.project_context(feats)
        hidden = d2(embed(ids), ctx, torch.arange(s)[None], s + torch.arange(BS)[None], mask)
        want, _, _ = d2.propose(hidden[:, 1:], torch.tensor([7]), head)
    assert block[0] == 7 and torch.equal(block[1:], want[0])
    g = torch.Generator().manual_seed(0)
    block, q = cached.sample(7, s, BS, SimpleNamespace(temperature=0.8), g)
    torch.testing.assert_close(q.sum(-1), torch.ones(BS - 1))
    assert ((q > 0).sum(-1) <= SETTINGS.selector_top_k).all()
    assert (q.gather(-1, block[1:, None]) > 0).all()
    with pytest.raises(TypeError, match="selector walk"):
        cached.logits(7, s, BS)
    with pytest.raises(ValueError, match="greedy drafting is propose"):
        cached.sample(7, s, BS, SimpleNamespace(temperature=0.0), g)


def test_dense_and_flex_paths_agree(tiny_qwen3_config):
    """The trainer's two attention paths (dense bool mask, flex BlockMask) drive DFlash2
    alike, across documents and with an invalid (padding) block."""
    from dflash.visibility import flex_block_mask

    torch.manual_seed(0)
    d2 = randomize(DFlash2DraftModel(config(tiny_qwen3_config))).eval()
    doc = torch.tensor([[0] * 10 + [1] * 14])
    pos = torch.tensor([list(range(10)) + list(range(14))])
    anchors, valid = torch.tensor([[2, 12, 16]]), torch.tensor([[True, True, False]])
    ctx = d2.project_context(torch.randn(1, 24, 128))
    blocks = torch.randn(1, 12, 64)
    bpos = (pos.gather(1, anchors).unsqueeze(-1) + torch.arange(BS)).view(1, -1)
    with torch.no_grad():
        a = d2(blocks, ctx, pos, bpos, dense_mask(anchors, valid, doc, BS))
        b = d2(blocks, ctx, pos, bpos, flex_block_mask(anchors, valid, doc, BS))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
