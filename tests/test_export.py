"""dflash.export: configs of either transformers generation load; conflicting keys are refused
with the field named; every writer (save_pretrained, checkpoints) writes the export format."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import Qwen3Config

from dflash import checkpoint as ckpt
from dflash.export import DrafterConfigError, config_from_dict, export_dict, normalize
from dflash.model import DFlashDraftModel, make_draft_config

# Qwen3-8B's RoPE, head_dim, depth, feature layers, mask id and block size; tiny widths.
Q8B_TARGET = dict(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=36,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=128,
    rope_theta=1e6,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
)
Q8B_DRAFT = dict(
    num_layers=5, block_size=16, mask_token_id=151669, target_layer_ids=[1, 9, 17, 25, 33]
)


def q8b_drafter_config():
    return make_draft_config(Qwen3Config(**Q8B_TARGET), **Q8B_DRAFT)


def sliding_drafter_config():
    """Two sliding layers after a full one, and a YaRN-scaled target RoPE."""
    target = Qwen3Config(
        **{**Q8B_TARGET, "rope_theta": 5e5},
        rope_scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 10240,
        },
    )
    return make_draft_config(
        target,
        num_layers=3,
        block_size=8,
        mask_token_id=151669,
        target_layer_ids=[1, 9, 17, 25, 33],
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
        sliding_window=64,
    )


def test_export_states_both_generations_and_the_attention_convention():
    d = export_dict(q8b_drafter_config())
    assert d["rope_theta"] == 1e6 and d["rope_parameters"]["rope_theta"] == 1e6
    assert d["rope_scaling"] is None and d["rope_parameters"]["rope_type"] == "default"
    assert d["is_causal"] is False
    assert d["layer_types"] == ["full_attention"] * 5
    assert d["use_sliding_window"] is False and d["sliding_window"] is None
    assert d["max_window_layers"] == 5
    assert d["block_size"] == 16 and d["num_target_layers"] == 36
    assert d["dflash_config"] == {
        "mask_token_id": 151669,
        "target_layer_ids": [1, 9, 17, 25, 33],
        "block_size": 16,
        "causal_in_block": [False] * 5,
    }
    s = export_dict(sliding_drafter_config())
    assert s["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 10240,
    }
    assert s["rope_parameters"]["rope_theta"] == s["rope_theta"] == 5e5
    assert s["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    assert s["use_sliding_window"] is True and s["max_window_layers"] == 1
    assert s["sliding_window"] == s["dflash_config"]["sliding_window"] == 64
    assert s["dflash_config"]["causal_in_block"] == [False, True, True]
    assert "is_causal" not in s  # one flag for every layer would be wrong for one of them
    # The export is a fixed point of the normaliser.
    for exported in (d, s):
        again = export_dict(config_from_dict(exported))
        assert {k: v for k, v in again.items() if k != "transformers_version"} == {
            k: v for k, v in exported.items() if k != "transformers_version"
        }


def test_save_pretrained_writes_the_export_and_loads_back(tmp_path):
    model = DFlashDraftModel(sliding_drafter_config())
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["rope_theta"] == 5e5 and "is_causal" not in written
    loaded = DFlashDraftModel.from_pretrained(tmp_path)
    assert loaded.config.layer_types == model.config.layer_types
    assert loaded.config.rope_parameters == model.config.rope_parameters
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def legacy_v4(d: dict) -> dict:
    """The same drafter as transformers 4.57 writes it: no rope_parameters."""
    d = copy.deepcopy(d)
    d.pop("rope_parameters")
    d["transformers_version"] = "4.57.1"
    return d


def plain_v5(d: dict) -> dict:
    """As transformers 5 writes it: rope_parameters only, no stated attention convention."""
    d = copy.deepcopy(d)
    for k in ("rope_theta", "rope_scaling", "is_causal"):
        d.pop(k, None)
    d["dflash_config"].pop("causal_in_block")
    d["dflash_config"].pop("block_size")
    return d


@pytest.mark.parametrize("make", [q8b_drafter_config, sliding_drafter_config])
def test_either_generation_loads_to_the_same_config(make):
    d = export_dict(make())
    ref = normalize(d)
    assert normalize(legacy_v4(d)) == ref
    if "sliding_attention" not in d["layer_types"]:  # sliding needs causal_in_block stated
        assert normalize(plain_v5(d)) == ref
    cfg = config_from_dict(legacy_v4(d))
    assert cfg.rope_parameters == ref["rope_parameters"]


def _tamper(d: dict, path: str, value) -> dict:
    d = copy.deepcopy(d)
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    if value is KeyError:
        node.pop(last)
    else:
        node[last] = value
    return d


@pytest.mark.parametrize(
    "make, path, value, field",
    [
        (q8b_drafter_config, "rope_theta", 10000.0, "rope_theta"),
        (
            q8b_drafter_config,
            "rope_scaling",
            {"rope_type": "linear", "factor": 2.0},
            "rope_scaling",
        ),
        (sliding_drafter_config, "rope_scaling", None, "rope_scaling"),
        (q8b_drafter_config, "block_size", 8, "block_size"),
        (q8b_drafter_config, "is_causal", True, "is_causal"),
        (
            q8b_drafter_config,
            "dflash_config.causal_in_block",
            [True] * 5,
            "dflash_config.causal_in_block",
        ),
        (q8b_drafter_config, "layer_types", ["full_attention"] * 4, "layer_types"),
        (
            q8b_drafter_config,
            "dflash_config.mask_token_id",
            KeyError,
            "dflash_config.mask_token_id",
        ),
        (sliding_drafter_config, "sliding_window", 128, "sliding_window"),
        (sliding_drafter_config, "is_causal", False, "is_causal"),
        (sliding_drafter_config, "use_sliding_window", False, "use_sliding_window"),
        (sliding_drafter_config, "max_window_layers", 2, "max_window_layers"),
        (
            sliding_drafter_config,
            "dflash_config.causal_in_block",
            KeyError,
            "dflash_config.causal_in_block",
        ),
        (
            sliding_drafter_config,
            "layer_types",
            ["sliding_attention", "sliding_attention", "full_attention"],
            "layer_types",
        ),
    ],
)
def test_disagreeing_keys_are_refused_naming_the_field(make, path, value, field):
    d = _tamper(export_dict(make()), path, value)
    with pytest.raises(DrafterConfigError, match=rf"^drafter config: {field}") as e:
        normalize(d)
    assert "\n" not in str(e.value)


def test_eval_refuses_a_conflicting_drafter_in_one_line(tmp_path, capsys):
    from dflash.cli import main

    drafter = tmp_path / "drafter"
    DFlashDraftModel(q8b_drafter_config()).save_pretrained(drafter)
    conf = json.loads((drafter / "config.json").read_text())
    conf["rope_theta"] = 10000.0
    (drafter / "config.json").write_text(json.dumps(conf))
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    capsys.readouterr()  # the save's progress bar
    rc = main(
        ["eval", "--target", str(tmp_path / "no-target"), "--drafter", str(drafter)]
        + ["--prompts", str(tmp_path / "p.jsonl")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert (
        len(err) == 1 and "rope_theta: 10000.0 disagrees with rope_parameters.rope_theta" in err[0]
    )


def test_resume_refuses_a_checkpoint_of_another_drafter(tmp_path):
    cfg = q8b_drafter_config()
    path = ckpt.save_checkpoint(tmp_path, 3, {"step": 3}, keep_last=2, drafter_config=cfg)
    assert json.loads((path / "config.json").read_text())["rope_theta"] == 1e6
    assert ckpt.load_checkpoint(path, cfg)["step"] == 3
    other = make_draft_config(Qwen3Config(**{**Q8B_TARGET, "rope_theta": 1e4}), **Q8B_DRAFT)
    with pytest.raises(ckpt.RunDirError, match="rope_parameters"):
        ckpt.load_checkpoint(path, other)


def test_eval_refuses_a_drafter_with_another_rope_than_its_target():
    from test_eval import tiny_pair

    from dflash.evaluate import check_pair
    from dflash.target import TargetMismatch

    model, tok, drafter = tiny_pair()
    check_pair(model, tok, drafter)  # the pair as trained fits
    raw = export_dict(drafter.config)
    raw["rope_theta"] = raw["rope_parameters"]["rope_theta"] = 1e6
    other = DFlashDraftModel(config_from_dict(raw))
    with pytest.raises(TargetMismatch, match="RoPE: drafter .*1000000.0.*, target .*10000.0"):
        check_pair(model, tok, other)


def test_plain_rope_stated_the_4x_way_loads():
    d = legacy_v4(export_dict(q8b_drafter_config()))
    d["rope_scaling"] = {"rope_type": "default"}
    assert normalize(d)["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
    d["rope_scaling"] = "linear"
    with pytest.raises(DrafterConfigError, match="rope_scaling: expected a dict or null"):
        normalize(d)
