"""Speculative decoding: acceptance rule, caches (drafter K/V, target crop), lossless, CLI."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from dflash.components import tiny_target_config
from dflash.data.tokenizer import build_tiny_tokenizer
from dflash.model import DFlashDraftModel, make_draft_config
from dflash.spec_decode import (
    CachedDrafter,
    CachedTarget,
    accept_length,
    first_mismatch,
    greedy_reference,
    speculative_generate,
)
from dflash.target import TargetMismatch, target_layer_ids
from dflash.visibility import dense_mask


def tiny_pair(block_size: int = 8, hidden: int | None = None, seed: int = 0):
    """Random tiny Qwen3 target (with the tiny ChatML tokenizer) and a 1-layer drafter."""
    from transformers import Qwen3ForCausalLM

    tok = build_tiny_tokenizer()
    cfg = tiny_target_config(len(tok))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    dcfg = make_draft_config(
        cfg if hidden is None else type(cfg)(**{**cfg.to_dict(), "hidden_size": hidden}),
        num_layers=1,
        block_size=block_size,
        mask_token_id=len(tok),
        target_layer_ids=target_layer_ids(cfg.num_hidden_layers, 5),
    )
    return model, tok, DFlashDraftModel(dcfg).eval()


def save_tiny_pair(root, **kw):
    model, tok, drafter = tiny_pair(**kw)
    model.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    return root / "target", root / "drafter"


@pytest.mark.parametrize(
    "draft, target_next, expected",
    [
        ([9, 1, 2, 3], [1, 2, 3, 4], 3),  # all drafts accepted, bonus 4
        ([9, 1, 2, 3], [1, 5, 3, 4], 1),  # slot 2 wrong: later matches do not count
        ([9, 7, 2, 3], [1, 2, 3, 4], 0),  # first draft wrong
        ([9], [1], 0),  # block size 1: nothing to accept
    ],
)
def test_accept_length_hand_built(draft, target_next, expected):
    assert accept_length(torch.tensor(draft), torch.tensor(target_next)) == expected


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2


def test_cached_drafter_matches_full_forward():
    """K/V cache filled in two chunks == the training forward over the whole context."""
    model, _, drafter = tiny_pair()
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    cached = CachedDrafter(drafter, emb, head)
    s, bs, k_h = 11, 8, 5 * model.config.hidden_size
    feats = torch.randn(1, s, k_h)
    pos = torch.arange(s).unsqueeze(0)
    cached.extend(feats[:, :7], pos[:, :7])
    cached.extend(feats[:, 7:], pos[:, 7:])
    block = cached.propose(anchor=42, anchor_pos=s, block_size=bs)

    ids = torch.full((1, bs), drafter.mask_token_id)
    ids[0, 0] = 42
    ctx_pos = torch.arange(s + 1).unsqueeze(0)  # anchor's slot is laid out, never visible
    mask = dense_mask(
        torch.tensor([[s]]),
        torch.ones(1, 1, dtype=torch.bool),
        torch.zeros(1, s + 1, dtype=torch.long),
        bs,
    )
    ctx = drafter.project_context(torch.cat([feats, torch.zeros(1, 1, k_h)], dim=1))
    with torch.no_grad():
        hidden = drafter(emb(ids), ctx, ctx_pos, s + torch.arange(bs).unsqueeze(0), mask)
    assert block[0] == 42
    assert torch.equal(block[1:], head(hidden)[0, 1:].argmax(-1))
    assert cached.length == s


def test_target_crop_equals_fresh_forward():
    model, _, _ = tiny_pair()
    t = CachedTarget(model, [1, 3])
    seq = torch.randint(0, 300, (1, 20))
    t(seq[:, :12])
    t(seq[:, 12:18])  # verify a 6-token block ...
    t.crop(14)  # ... of which the anchor and one draft were kept
    assert t.length == 14
    nxt, feats = t(seq[:, 14:20])
    t.reset()
    ref_next, ref_feats = t(seq)
    assert torch.equal(nxt, ref_next[14:])
    torch.testing.assert_close(feats, ref_feats[:, 14:], atol=1e-5, rtol=1e-5)


class OracleDrafter:
    """Proposes the target's true continuation with slot `wrong` corrupted: exercises
    partial acceptance and the crop after every rejection."""

    def __init__(self, reference: list[int], prompt_len: int, wrong: int):
        self.ref, self.p, self.wrong = reference, prompt_len, wrong

    def reset(self):
        pass

    def extend(self, feats, positions):
        pass

    def propose(self, anchor, anchor_pos, block_size):
        start = anchor_pos - self.p + 1  # index in the output of slot 1
        out = [anchor] + [
            self.ref[i] if i < len(self.ref) else 0 for i in range(start, start + block_size - 1)
        ]
        if self.wrong < block_size:
            out[self.wrong] = (out[self.wrong] + 1) % 300
        return torch.tensor(out)


@pytest.mark.parametrize("wrong", [1, 3, 99])
def test_lossless_with_partial_acceptance(wrong):
    model, _, _ = tiny_pair()
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    ref = greedy_reference(model, prompt, 30, eos_ids={0})
    t = CachedTarget(model, [1])
    r = speculative_generate(
        t,
        OracleDrafter(ref, len(prompt), wrong),
        prompt,
        block_size=6,
        max_new_tokens=30,
        eos_ids={0},
    )
    assert r.output_ids == ref
    expected = 5 if wrong == 99 else wrong - 1
    assert set(r.accept_lengths[:-1]) == {expected}  # the last step may hit the length cap


@pytest.mark.parametrize("block_size", [1, 4, 8])
def test_lossless_real_drafter(block_size):
    model, tok, drafter = tiny_pair()
    t = CachedTarget(model, drafter.target_layer_ids)
    cd = CachedDrafter(drafter, model.get_input_embeddings(), model.get_output_embeddings())
    for seed in range(3):
        prompt = torch.randint(
            0, 300, (5 + seed * 7,), generator=torch.Generator().manual_seed(seed)
        ).tolist()
        ref = greedy_reference(model, prompt, 24, eos_ids={tok.eos_token_id})
        r = speculative_generate(
            t, cd, prompt, block_size=block_size, max_new_tokens=24, eos_ids={tok.eos_token_id}
        )
        assert r.output_ids == ref
        # the prefill gives the first token; each step commits accepted + 1
        assert 1 + sum(a + 1 for a in r.accept_lengths) >= len(ref)
        if block_size > 1:  # drafter context covers exactly the target's committed cache
            assert cd.length == t.length


def _eval_cli(*args: str) -> tuple[int, str, str]:
    from dflash.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["eval", *args])
    return rc, out.getvalue(), err.getvalue()


def test_eval_cli_end_to_end(tmp_path):
    target, drafter = save_tiny_pair(tmp_path)
    prompts = tmp_path / "p.jsonl"
    rows = [
        {"id": "a", "prompt": "def total(values):"},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]},
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    args = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]
    rc, stdout, err = _eval_cli(
        *args,
        "--out",
        str(out),
        "--max-new-tokens",
        "12",
        "--check-lossless",
        "--speedup-prompts",
        "1",
        "--block-size",
        "4",
    )
    assert rc == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["lossless"] is True and summary["mismatches"] == []
    assert 1.0 <= summary["tau"] <= 4 and len(summary["accept_hist"]) == 4
    assert summary["speedup"] > 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in recs] == ["a", "1"]
    assert all(len(r["output_ids"]) == 12 or r["output_ids"][-1] in (336, 338) for r in recs)
    assert sum(len(r["accept_lengths"]) for r in recs) == sum(summary["accept_hist"])


def test_eval_rejects_mismatched_pair_before_decoding(tmp_path):
    target, _ = save_tiny_pair(tmp_path)
    _, _, other = tiny_pair(hidden=32)
    other.save_pretrained(tmp_path / "other")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "hi"}) + "\n")
    rc, stdout, err = _eval_cli(
        "--target", str(target), "--drafter", str(tmp_path / "other"), "--prompts", str(prompts)
    )
    assert rc == 1 and stdout == ""
    assert "hidden size: drafter 32, target 64" in err


def test_eval_long_prompt_error_or_reported_truncation(tmp_path):
    target, drafter = save_tiny_pair(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "long", "prompt": "word " * 5000}) + "\n")
    args = [
        "--target",
        str(target),
        "--drafter",
        str(drafter),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "4",
        "--speedup-prompts",
        "0",
    ]
    rc, _, err = _eval_cli(*args)
    assert rc == 1 and "prompt 'long' has" in err and "--truncate-prompts" in err
    rc, stdout, err = _eval_cli(*args, "--truncate-prompts")
    assert rc == 0, err
    assert json.loads(stdout.splitlines()[-1])["truncated_prompts"] == 1
    with pytest.raises(TargetMismatch):
        from dflash.evaluate import check_pair

        m, t, _ = tiny_pair()
        d = tiny_pair(block_size=4)[2]
        d.config.dflash_config = {**d.config.dflash_config, "mask_token_id": 5}
        check_pair(m, t, d)
