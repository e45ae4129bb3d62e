"""z-lab's published decoder (PyPI `dflash==0.1.0`) decodes our exported drafter exactly as
`dflash eval` does: the same tokens and the same tokens per verify step, greedy, on CPU.

Their package runs in its own uv environment with the versions its wheel pins, as a
subprocess (tests/reference_decoder_driver.py); it is never imported here, and it could
not be: its import package is also called `dflash`.

Step counts: `dflash eval` records accepted drafts per step (a), z-lab records tokens
committed per step (a + 1 for the bonus), cut to what still fits in max_new_tokens or
ends at a stop token. `committed_per_step` converts ours to theirs; the test then
asserts equality, step by step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shutil
from pathlib import Path

import pytest
from isolated_env import isolated_python, run_json

# Requires-Dist of dflash-0.1.0-py3-none-any.whl (its METADATA), the Linux `local` extra
# included: that extra is what its transformers backend imports.
ZLAB_PINS = (
    "torch==2.13.0",
    "transformers==5.15.0",
    "jinja2==3.1.6",
    "tqdm==4.70.0",
    "datasets==5.0.1",
    "requests==2.34.2",
)
ZLAB_DECODER = "dflash==0.1.0"
DRIVER = Path(__file__).with_name("reference_decoder_driver.py")
MAX_NEW_TOKENS = 40
PROMPTS = 4


def recipe():
    """The demo's quick recipe with a target trained long enough to be predictable.

    With QUICK's 60 target steps the drafter learns little more than a bigram (accepts
    at most one draft, and decodes the same when fed the wrong layers), so the
    comparison would not see how either side reads context or attends in the block.
    100 target and 100 drafter steps accept up to full blocks."""
    from dflash.demo.recipe import QUICK

    return dataclasses.replace(QUICK, target_steps=100, draft_steps=100)


def committed_per_step(accept_lengths: list[int], n_output: int) -> list[int]:
    """Our accepted-drafts-per-step as tokens committed per step, capped at the output.

    The first output token comes from the prefill, not from a step; every step then adds
    a + 1 tokens, and the last step keeps only what fits (max_new_tokens, stop token).
    """
    left, steps = n_output - 1, []
    for a in accept_lengths:
        steps.append(min(a + 1, left))
        left -= steps[-1]
    assert left == 0, "steps do not add up to the output"
    return steps


def test_committed_per_step():
    assert committed_per_step([2, 0, 3], 1 + 3 + 1 + 4) == [3, 1, 4]
    assert committed_per_step([2, 5], 1 + 3 + 2) == [3, 2]  # last step cut by the budget
    assert committed_per_step([], 1) == []  # the prefill token was a stop token
    with pytest.raises(AssertionError):
        committed_per_step([1], 5)


@pytest.fixture(scope="module")
def zlab_python() -> Path:
    return isolated_python("zlab-dflash-0.1.0", ZLAB_PINS, no_deps=(ZLAB_DECODER,))


def variant(drafter: Path, out: Path, edit) -> Path:
    """The same weights with `edit(config)` applied: a drafter that must decode differently."""
    shutil.copytree(drafter, out)
    conf = json.loads((out / "config.json").read_text())
    edit(conf)
    (out / "config.json").write_text(json.dumps(conf))
    return out


def shift_layers(conf: dict) -> None:
    """Target layers i-1: what a reader that forgets the embedding output at
    hidden_states[0] would feed the drafter."""
    dcfg = conf["dflash_config"]
    dcfg["target_layer_ids"] = [i - 1 for i in dcfg["target_layer_ids"]]


def causal_blocks(conf: dict) -> None:
    """z-lab's reader applies a top-level is_causal to every layer: causal blocks."""
    conf["is_causal"] = True


def sliding_drafter(out: Path) -> Path:
    """An untrained export with a sliding layer: only its reading is compared."""
    from transformers import Qwen3Config

    from dflash.config import TINY_TARGET
    from dflash.model import DFlashDraftModel, make_draft_config

    target = Qwen3Config(vocab_size=128, tie_word_embeddings=False, **TINY_TARGET)
    config = make_draft_config(
        target,
        num_layers=2,
        block_size=4,
        mask_token_id=100,
        target_layer_ids=[1, 2],
        layer_types=["full_attention", "sliding_attention"],
        sliding_window=4,
    )
    DFlashDraftModel(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def decoded(zlab_python, tmp_path_factory):
    """One demo-recipe run decoded by `dflash eval` and, in one subprocess, by z-lab."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dflash.demo.stages import prepare, train_drafter
    from dflash.evaluate import load_prompts
    from dflash.target import eos_ids_of

    root = tmp_path_factory.mktemp("reference")
    # The demo pipeline: a tiny local target, its regenerated data, a trained drafter.
    paths = prepare(recipe(), root / "cache", log=lambda *_: None)
    target, prompts = paths["target"], paths["eval_prompts"]
    drafter = train_drafter(recipe(), paths, root / "run") / "drafter"
    rows = ours(target, drafter, prompts, root / "eval.jsonl")
    # The very ids `dflash eval` decoded, and its stop set, go to their decoder.
    tok = AutoTokenizer.from_pretrained(target, local_files_only=True)
    stop = eos_ids_of(tok, AutoModelForCausalLM.from_pretrained(target, local_files_only=True))
    prompt_ids = [p.ids for p in load_prompts(str(prompts), tok, PROMPTS)]
    assert [len(p) for p in prompt_ids] == [r["prompt_tokens"] for r in rows]
    request = {
        "target": str(target),
        "prompts": prompt_ids,
        "max_new_tokens": MAX_NEW_TOKENS,
        "stop_token_ids": sorted(stop),
        "block_size": None,  # the drafter's own
        "drafters": [
            {"path": str(drafter), "decode": True},
            {"path": str(variant(drafter, root / "shifted", shift_layers)), "decode": True},
            {"path": str(variant(drafter, root / "causal", causal_blocks)), "decode": True},
            {"path": str(sliding_drafter(root / "sliding")), "decode": False},
        ],
    }
    (root / "request.json").write_text(json.dumps(request))
    ref = run_json(zlab_python, DRIVER.read_text(), str(root / "request.json"))
    assert ref["versions"] == {"dflash": "0.1.0", "torch": "2.13.0", "transformers": "5.15.0"}
    assert "site-packages" in ref["dflash_file"]  # their package, from their environment
    return {"drafter": drafter, "rows": rows, "ref": ref, "sliding": root / "sliding"}


def ours(target: Path, drafter: Path, prompts: Path, out: Path) -> list[dict]:
    from dflash.cli import main

    args = ["eval", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]
    args += ["--limit", str(PROMPTS), "--max-new-tokens", str(MAX_NEW_TOKENS)]
    args += ["--speedup-prompts", "0", "--out", str(out)]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(args) == 0, err.getvalue()
    return [json.loads(line) for line in out.read_text().splitlines()]


def same_steps(rows: list[dict], results: list[dict]) -> bool:
    return all(
        got["acceptance_lengths"]
        == committed_per_step(row["accept_lengths"], len(row["output_ids"]))
        for row, got in zip(rows, results, strict=True)
    )


@pytest.mark.slow  # a ~3 GB environment on a cold uv cache, a demo target, two decoders
def test_zlab_decoder_matches_dflash_eval(decoded):
    rows, mine = decoded["rows"], decoded["ref"]["drafters"][0]
    # Their loader read our export completely and as written.
    assert mine["loading"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    conf = json.loads((decoded["drafter"] / "config.json").read_text())
    assert mine["drafter_class"] == conf["architectures"][0]
    assert mine["block_size"] == conf["block_size"]
    assert mine["mask_token_id"] == conf["dflash_config"]["mask_token_id"]
    assert mine["target_layer_ids"] == conf["dflash_config"]["target_layer_ids"]
    assert mine["rope_parameters"]["rope_theta"] == conf["rope_theta"]
    assert mine["is_causal"] == [False] * conf["num_hidden_layers"]  # bidirectional blocks

    for row, got in zip(rows, mine["results"], strict=True):
        assert got["output_ids"] == row["output_ids"], row["id"]
        expected = committed_per_step(row["accept_lengths"], len(row["output_ids"]))
        assert got["acceptance_lengths"] == expected, row["id"]
    # Not a vacuous match: a trained drafter, whose blocks are accepted deep into the block.
    accepted = [a for row in rows for a in row["accept_lengths"]]
    assert sum(a > 0 for a in accepted) >= 5 and max(accepted) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("index, what", [(1, "other target layers"), (2, "causal blocks")])
def test_step_comparison_catches_a_drafter_read_differently(decoded, index, what):
    """A drafter read differently keeps the target's tokens (both decoders are lossless)
    but changes the drafts: the step-for-step comparison must see that, or it proves
    nothing about how z-lab reads our export."""
    rows, other = decoded["rows"], decoded["ref"]["drafters"][index]
    if what == "causal blocks":
        assert other["is_causal"] == [True] * len(other["is_causal"])
    else:
        ids = decoded["ref"]["drafters"][0]["target_layer_ids"]
        assert other["target_layer_ids"] == [i - 1 for i in ids]
    assert [r["output_ids"] for r in other["results"]] == [r["output_ids"] for r in rows]
    assert not same_steps(rows, other["results"]), what


@pytest.mark.slow
def test_zlab_reads_sliding_drafter_attention_as_trained(decoded):
    """z-lab's reader (dflash 0.1.0, dflash/model.py lines 365-366) applies a top-level
    is_causal to every layer; the export writes none when a layer slides, so it derives
    causal = (layer type is sliding_attention), as we train."""
    sliding = decoded["ref"]["drafters"][3]
    conf = json.loads((decoded["sliding"] / "config.json").read_text())
    windows = [
        conf["sliding_window"] if t == "sliding_attention" else None for t in conf["layer_types"]
    ]
    assert sliding["sliding_window"] == windows
    assert sliding["is_causal"] == conf["dflash_config"]["causal_in_block"]
