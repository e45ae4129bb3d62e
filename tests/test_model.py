"""Drafter checkpoint format, target-layer and mask-token rules, and the target wrapper."""

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import Qwen3ForCausalLM

from dflash.model import DFlashDraftModel, make_draft_config
from dflash.target import TargetFeatures, TargetMismatch, choose_mask_token_id, target_layer_ids
from dflash.visibility import dense_mask, flex_block_mask

PER_LAYER = [
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
]


def expected_keys(n_layers):
    keys = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    return keys | {f"layers.{i}.{k}" for i in range(n_layers) for k in PER_LAYER}


def test_target_layer_ids_rule():
    assert target_layer_ids(36) == [1, 9, 17, 25, 33]  # Qwen3-8B
    assert target_layer_ids(8) == [1, 2, 3, 4, 5]
    with pytest.raises(TargetMismatch, match="at least 8 layers"):
        target_layer_ids(7)


def test_mask_token_rule():
    assert choose_mask_token_id(151669, 151936) == 151669  # Qwen3
    with pytest.raises(TargetMismatch, match="no usable mask row"):
        choose_mask_token_id(128, 128)
    assert choose_mask_token_id(128, 128, requested=5) == 5
    with pytest.raises(TargetMismatch, match="outside"):
        choose_mask_token_id(100, 128, requested=128)


def test_checkpoint_format(tmp_path, tiny_qwen3_config):
    cfg = make_draft_config(
        tiny_qwen3_config, num_layers=2, block_size=8, mask_token_id=120, target_layer_ids=[1, 5]
    )
    model = DFlashDraftModel(cfg)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert set(load_file(tmp_path / "model.safetensors")) == expected_keys(2)
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["architectures"] == ["DFlashDraftModel"]
    assert conf["model_type"] == "qwen3"
    assert conf["num_hidden_layers"] == 2
    assert conf["hidden_size"] == tiny_qwen3_config.hidden_size
    assert conf["block_size"] == 8
    assert conf["num_target_layers"] == 8
    assert conf["dflash_config"] == {
        "mask_token_id": 120,
        "target_layer_ids": [1, 5],
        "block_size": 8,
        "causal_in_block": [False, False],
    }
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_target_wrapper_stops_early_and_is_document_causal(tiny_qwen3_config):
    tiny_qwen3_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    lm = Qwen3ForCausalLM(tiny_qwen3_config).eval()
    target = TargetFeatures(lm, [1, 3])
    assert len(target.layers) == 4  # layers after the deepest needed one are never run
    ids = torch.randint(0, 128, (1, 20))
    doc = torch.tensor([[0] * 8 + [1] * 12])
    pos = torch.tensor([list(range(8)) + list(range(12))])
    feats = target(ids, pos, doc)
    out = torch.full_like(feats, float("nan"))  # a pipeline target writes into its message
    assert target(ids, pos, doc, out=out) is out and torch.equal(out, feats)
    ref = []
    for part in (ids[:, :8], ids[:, 8:]):  # each document alone through plain HF
        hs = lm(part, output_hidden_states=True).hidden_states
        ref.append(torch.cat([hs[2], hs[4]], dim=-1))  # layer i output = hidden_states[i+1]
    torch.testing.assert_close(feats, torch.cat(ref, dim=1), atol=1e-5, rtol=1e-4)


def test_drafter_dense_and_flex_paths_agree(tiny_qwen3_config):
    torch.manual_seed(0)
    cfg = make_draft_config(
        tiny_qwen3_config, num_layers=2, block_size=4, mask_token_id=120, target_layer_ids=[1, 2]
    )
    model = DFlashDraftModel(cfg).eval()
    doc = torch.tensor([[0] * 10 + [1] * 14])
    pos = torch.tensor([list(range(10)) + list(range(14))])
    anchors, valid = torch.tensor([[2, 12, 16]]), torch.tensor([[True, True, False]])
    ctx = model.project_context(torch.randn(1, 24, 128))
    blocks = torch.randn(1, 12, 64)
    bpos = (pos.gather(1, anchors).unsqueeze(-1) + torch.arange(4)).view(1, -1)
    with torch.no_grad():
        a = model(blocks, ctx, pos, bpos, dense_mask(anchors, valid, doc, 4))
        b = model(blocks, ctx, pos, bpos, flex_block_mask(anchors, valid, doc, 4))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
