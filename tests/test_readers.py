"""Exported drafter configs read by real transformers generations, each in its own venv.

Every field a loader uses must read back as written under transformers 4.57.1 (the
reference decoder's pin on its main branch and what many servers run), 5.15.1 and the
locked version. The reader builds what a loader builds from the config: AutoConfig, the
Qwen3 rotary embedding (its inv_freq shows the RoPE base and head_dim actually used) and
the per-layer attention modules (their sliding window). The environments are built with
uv from its cache (tests/isolated_env.py); the first build takes about a minute each.
"""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest
from isolated_env import isolated_python, run_json
from test_export import q8b_drafter_config, sliding_drafter_config
from transformers import Qwen3Config

from dflash.model import DFlashDraftModel

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.10.0"  # already in the uv cache from the project's cu128 sync

READER = r"""
import json, sys
import transformers
from transformers import AutoConfig
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding

out = {"transformers": transformers.__version__, "drafters": {}}
for d in sys.argv[1:]:
    c = AutoConfig.from_pretrained(d, local_files_only=True)
    rot = Qwen3RotaryEmbedding(c)
    out["drafters"][d] = {
        "model_type": c.model_type,
        "architectures": c.architectures,
        "inv_freq": rot.inv_freq.double().tolist(),
        "attention_scaling": float(rot.attention_scaling),
        "rope_type": getattr(rot, "rope_type", None),
        "layer_windows": [
            Qwen3Attention(c, i).sliding_window for i in range(c.num_hidden_layers)
        ],
        **{
            k: getattr(c, k, None)
            for k in (
                "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps",
                "layer_types", "sliding_window", "use_sliding_window", "max_window_layers",
                "block_size", "num_target_layers", "dflash_config", "is_causal",
            )
        },
    }
print(json.dumps(out))
"""


def locked_transformers() -> str:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (version,) = [p["version"] for p in lock["package"] if p["name"] == "transformers"]
    return version


READERS = ["4.57.1", "5.15.1", "locked"]


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    dirs = {}
    for name, make in (("q8b", q8b_drafter_config), ("sliding", sliding_drafter_config)):
        DFlashDraftModel(make()).save_pretrained(root / name)
        dirs[name] = root / name
    # The failure this export prevents: a config as transformers 5 alone writes it.
    Qwen3Config(**{**q8b_drafter_config().to_dict(), "rope_theta": 1e6}).save_pretrained(
        root / "plain-v5"
    )
    dirs["plain-v5"] = root / "plain-v5"
    return dirs


@pytest.fixture(scope="module")
def readings(drafters):
    got = {}
    for reader in READERS:
        version = locked_transformers() if reader == "locked" else reader
        python = isolated_python(f"transformers-{version}", [f"transformers=={version}", TORCH])
        out = run_json(python, READER, *[str(p) for p in drafters.values()])
        assert out["transformers"] == version
        got[reader] = {name: out["drafters"][str(p)] for name, p in drafters.items()}
    return got


def default_inv_freq(theta: float, head_dim: int) -> list[float]:
    return [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]


def assert_close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b)
    assert all(math.isclose(x, y, rel_tol=1e-5) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("reader", READERS)
def test_8b_shaped_export_reads_back_as_written(readings, drafters, reader):
    r = readings[reader]["q8b"]
    written = json.loads((drafters["q8b"] / "config.json").read_text())
    assert_close(r["inv_freq"], default_inv_freq(1e6, 128))  # RoPE base 1e6, head_dim 128
    assert r["attention_scaling"] == 1.0
    assert r["head_dim"] == 128 and r["num_hidden_layers"] == 5
    assert r["layer_types"] == ["full_attention"] * 5
    assert r["layer_windows"] == [None] * 5 and r["sliding_window"] is None
    assert r["block_size"] == 16 and r["num_target_layers"] == 36
    assert r["dflash_config"] == written["dflash_config"]
    assert r["dflash_config"]["mask_token_id"] == 151669
    assert r["dflash_config"]["target_layer_ids"] == [1, 9, 17, 25, 33]
    assert r["is_causal"] is False
    assert r["architectures"] == ["DFlashDraftModel"] and r["model_type"] == "qwen3"
    for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert r[k] == written[k], k


@pytest.mark.slow
@pytest.mark.parametrize("reader", READERS)
def test_sliding_window_export_reads_back_as_written(readings, reader):
    r = readings[reader]["sliding"]
    assert r["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    assert r["layer_windows"] == [None, 64, 64]
    assert r["sliding_window"] == 64 and r["use_sliding_window"] is True
    assert r["max_window_layers"] == 1
    assert r["dflash_config"]["causal_in_block"] == [False, True, True]
    assert r["block_size"] == 8 and r["is_causal"] is None  # per layer only: causal_in_block
    # YaRN: every generation builds the same scaled frequencies and attention scale.
    assert r["rope_type"] == "yarn"
    assert r["attention_scaling"] == pytest.approx(0.1 * math.log(4.0) + 1.0)
    assert_close(r["inv_freq"], readings["locked"]["sliding"]["inv_freq"])
    assert r["inv_freq"] != pytest.approx(default_inv_freq(5e5, 128))


@pytest.mark.slow
def test_the_readers_can_tell_the_difference(readings):
    """Without the legacy keys 4.57.1 builds RoPE base 10000: the check above can fail."""
    assert_close(readings["4.57.1"]["plain-v5"]["inv_freq"], default_inv_freq(1e4, 128))
    assert_close(readings["locked"]["plain-v5"]["inv_freq"], default_inv_freq(1e6, 128))


TARGET_READER = r"""
import json, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=torch.float32)
cfg = AutoConfig.from_pretrained(d, local_files_only=True)
messages = [{"role": "user", "content": "def total(values):"}]
text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
ids = tok(text, add_special_tokens=False)["input_ids"]
with torch.no_grad():
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
print(json.dumps({
    "tokenizer": type(tok).__name__,
    "len": len(tok),
    "special": sorted(tok.all_special_tokens),
    "prompt_ids": ids,
    "generated": out[0].tolist(),
    "decoded": tok.decode(out[0].tolist(), skip_special_tokens=True),
    "rope_base": float(model.model.rotary_emb.inv_freq[1].double() ** (-cfg.head_dim / 2)),
    "vocab_size": cfg.vocab_size,
}))
"""


@pytest.fixture(scope="module")
def demo_target(tmp_path_factory):
    """A demo-style target directory, as `dflash demo` writes it (tiny and fast)."""
    from dflash.demo.tiny_lm import build_target

    corpus = [
        {"prompt": f"What is {a} plus {b}?", "response": f"{a} plus {b} is {a + b}."}
        for a in range(8)
        for b in range(4)
    ]
    out = tmp_path_factory.mktemp("demo") / "target"
    build_target(
        out,
        corpus,
        vocab_size=300,
        hidden=32,
        layers=2,
        steps=3,
        batch=2,
        seq_len=32,
        lr=1e-3,
        seed=0,
    )
    return out


@pytest.mark.slow
def test_demo_target_loads_in_transformers_4_57(demo_target):
    """4.57.1 loads tokenizer and model and decodes exactly what the locked version does."""
    assert json.loads((demo_target / "config.json").read_text())["rope_theta"] == 10000.0
    got = {}
    for version in ("4.57.1", locked_transformers()):
        python = isolated_python(f"transformers-{version}", [f"transformers=={version}", TORCH])
        got[version] = run_json(python, TARGET_READER, str(demo_target))
    old, new = got["4.57.1"], got[locked_transformers()]
    assert old["tokenizer"] == "PreTrainedTokenizerFast"
    assert old["special"] == ["<|endoftext|>", "<|im_end|>", "<|im_start|>"]
    for k in ("len", "special", "prompt_ids", "generated", "decoded", "vocab_size"):
        assert old[k] == new[k], k
    assert len(old["generated"]) > len(old["prompt_ids"])
    assert old["rope_base"] == pytest.approx(10000.0, rel=1e-5)


WRITER = r"""
import json, sys
from pathlib import Path
from transformers import AutoConfig, Qwen3Config

out = Path(sys.argv[1])
for src in sys.argv[2:]:
    # A config re-saved by this generation (a loader that saves what it loaded) ...
    AutoConfig.from_pretrained(src, local_files_only=True).save_pretrained(out / f"resaved-{Path(src).name}")
# ... and one written from scratch by another trainer on this generation, in its own spelling.
fields = json.loads((Path(sys.argv[2]) / "config.json").read_text())
major = int(__import__("transformers").__version__.split(".")[0])
drop = ("rope_parameters",) if major < 5 else ("rope_theta", "rope_scaling")
Qwen3Config(**{k: v for k, v in fields.items() if k not in drop}).save_pretrained(out / "fresh")
print(json.dumps(sorted(p.name for p in out.iterdir())))
"""


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["4.57.1", "5.15.1"])
def test_configs_written_by_either_generation_load_as_ours(drafters, writer, tmp_path):
    from dflash.export import export_dict, load_config

    python = isolated_python(f"transformers-{writer}", [f"transformers=={writer}", TORCH])
    srcs = [drafters["q8b"], drafters["sliding"]]
    names = run_json(python, WRITER, str(tmp_path), *map(str, srcs))
    assert names == ["fresh", "resaved-q8b", "resaved-sliding"]
    for written, src in (
        ("resaved-q8b", "q8b"),
        ("resaved-sliding", "sliding"),
        ("fresh", "q8b"),
    ):
        raw = json.loads((tmp_path / written / "config.json").read_text())
        assert raw["transformers_version"] == writer
        if written == "fresh":  # each generation's own spelling only
            assert ("rope_parameters" in raw) == (writer != "4.57.1")
            assert ("rope_theta" in raw) == (writer == "4.57.1")
        got, want = (
            export_dict(load_config(tmp_path / written)),
            export_dict(load_config(drafters[src])),
        )
        for k in ("transformers_version",):
            got.pop(k), want.pop(k)
        assert got == want, (
            written,
            {k for k in got.keys() | want.keys() if got.get(k) != want.get(k)},
        )
