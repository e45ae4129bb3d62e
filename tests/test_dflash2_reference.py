"""z-lab's published decoder (PyPI `dflash==0.1.0`, `DFlash2DraftModel`) reads our exported
DFlash2 drafter as we build it: the same forward outputs, the same greedy selector walk,
and the same greedy speculative decode, step by step, draft by draft.

Tiny DFlash2 drafters are built from config with random weights (fixed seed; every
tensor random, so the convolutions and the selector are far from their identity init),
then trained for TRAIN_STEPS steps by the trainer's own step (dflash.step.train_step:
DraftStep with the DFlash2 loss, AdamW) and exported by the trainer's own export
(dflash.checkpoint.export_drafter), and loaded by their decoder in its own environment
(tests/isolated_env.py, the pins of tests/test_reference_decoder.py): one with full
attention layers, and one with a sliding-window layer (as the published drafters have).

Forward: our packed training layout (three blocks in one call, dflash.visibility's
masks) against their decode-time forward of each block alone, with the context that
block may see; and one short block (their last block near max_new_tokens).
Decode (the full-attention drafter; eval refuses sliding ones): a random tiny target,
ours = dflash.spec_decode.speculative_generate with the drafter `dflash eval` picks
(dflash.evaluate.cached_drafter), theirs = dflash_generate.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from isolated_env import isolated_python, run_json
from safetensors.torch import load_file, save_file
from test_reference_decoder import ZLAB_DECODER, ZLAB_PINS, committed_per_step

from dflash.checkpoint import export_drafter

DRIVER = Path(__file__).with_name("dflash2_reference_driver.py")
BLOCK = 4
ANCHORS = [3, 7, 10]  # three packed blocks over a 12-token context
CTX = 12
SHORT = 3  # a block cut to 3 slots
MAX_NEW_TOKENS = 24
HOT = [11, 23, 57, 74]
WINDOW = 5  # smaller than the context: the sliding layer's window bites
TRAIN_STEPS = 3
# Decoded: full attention (what `dflash eval` serves). Forward only: a sliding layer
# (the published drafters slide; eval refuses sliding drafters).
VARIANTS = {
    "drafter": ["full_attention", "full_attention"],
    "sliding": ["full_attention", "sliding_attention"],
}
RTOL = 1e-5  # of the largest magnitude: float32, the same ops in another order and torch


def build(tmp: Path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dflash.config import TINY_TARGET
    from dflash.export_dflash2 import DFlash2Settings
    from dflash.model_dflash2 import DFlash2DraftModel, make_dflash2_config

    torch.manual_seed(0)
    tcfg = Qwen3Config(vocab_size=128, tie_word_embeddings=False, **TINY_TARGET)
    target = Qwen3ForCausalLM(tcfg).eval()
    with torch.no_grad():
        # Logits of a few units, with HOT tokens far ahead of the rest: the target then
        # decodes among them, and so does the drafter (same head), which then has drafts
        # accepted by chance: the comparison covers steps that commit several tokens.
        scale = torch.full((128, 1), 2.0)
        scale[HOT] = 40.0
        target.lm_head.weight.mul_(scale)
    target.save_pretrained(tmp / "target")
    settings = DFlash2Settings(
        conv_kernel_size=3, conv_group_size=16, selector_rank=8, selector_top_k=6
    )
    drafters = {}
    for name, layers in VARIANTS.items():
        sliding = "sliding_attention" in layers
        cfg = make_dflash2_config(
            tcfg,
            settings=settings,
            num_layers=len(layers),
            block_size=BLOCK,
            mask_token_id=127,
            target_layer_ids=[1, 5],
            layer_types=layers,
            sliding_window=WINDOW if sliding else None,
        )
        drafter = DFlash2DraftModel(cfg).eval()
        with torch.no_grad():
            for pname, p in drafter.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_(1 + 0.2 * torch.randn_like(p))
                elif pname.endswith("base_kernel"):
                    p.normal_(0.0, 0.7)
                elif "codebook" in pname:
                    p.normal_(0.0, 1.0)
                else:
                    p.normal_(0.0, 0.15)
        train_briefly(target, drafter, settings, tmp / f"run-{name}")
        export_drafter(drafter, tmp / f"run-{name}")  # -> run-NAME/drafter/, as `dflash train`
        drafters[name] = drafter.eval()
    return target, drafters


def train_briefly(target, drafter, settings, out: Path) -> None:
    """TRAIN_STEPS steps of the trainer's step on random packed rows of the target's
    vocabulary (the Run is assembled by hand: the target is this test's, not a preset's)."""
    from dflash.components import build_draft_step, build_optimizer
    from dflash.config import TrainConfig
    from dflash.data.random_stream import RandomStream
    from dflash.run import Run
    from dflash.step import train_step
    from dflash.target import TargetFeatures

    cfg = TrainConfig(
        out=str(out), arch="dflash2", block_size=BLOCK, seq_len=32, max_anchors=4,
        max_steps=TRAIN_STEPS, min_doc_len=8, max_doc_len=32, lr=1e-3, warmup_ratio=0.0, loss_gamma=2.0,
        device="cpu", wandb="off", **settings.as_dict(),
    )  # fmt: skip
    features = TargetFeatures(target, drafter.target_layer_ids)
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    run = Run(cfg, "single", torch.device("cpu"), torch.float32, "sdpa", None, features)
    run.drafter, run.step_fn = drafter, build_draft_step(cfg, drafter, features, run.device, "sdpa")
    run.opt, run.sched = build_optimizer(cfg, drafter.parameters())
    run.gen = torch.Generator()
    run.stream = RandomStream(
        vocab_size=drafter.mask_token_id, seq_len=32, seed=0, min_doc_len=8, max_doc_len=32
    )
    drafter.train()
    for step in range(TRAIN_STEPS):
        assert torch.isfinite(train_step(run, step).loss)
    # The selector and the convolutions were trained too (the DFlash2 loss reached them).
    moved = {k for k, v in drafter.state_dict().items() if not torch.equal(v, before[k])}
    assert any("candidate_selector" in k for k in moved), moved
    assert any("attention_conv" in k for k in moved), moved


def masks(drafter, anchors: torch.Tensor, block_size: int):
    """The training masks (dflash.visibility) of one row, per layer type when one slides."""
    from dflash.visibility import dense_mask

    args = (anchors, torch.ones_like(anchors, dtype=torch.bool), torch.zeros(1, CTX).long())
    full = dense_mask(*args, block_size)
    if "sliding_attention" not in drafter.config.layer_types:
        return full
    window = drafter.config.sliding_window
    return {"full_attention": full, "sliding_attention": dense_mask(*args, block_size, window)}


def forward_cases(target, drafter):
    """Our forward on the packed layout, and the per-block inputs for theirs."""
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, CTX, 2 * 64, generator=g)
    tokens = torch.randint(0, 127, (1, CTX), generator=g)
    embed, head = target.get_input_embeddings(), target.lm_head
    anchors = torch.tensor([ANCHORS])
    cases, ours = {}, []

    def block(anchor: int, length: int):
        ids = torch.full((1, length), drafter.mask_token_id)
        ids[0, 0] = tokens[0, anchor]
        return ids

    with torch.no_grad():
        ids = torch.cat([block(a, BLOCK) for a in ANCHORS], dim=1)
        pos = (anchors.unsqueeze(-1) + torch.arange(BLOCK)).view(1, -1)
        ctx = drafter.project_context(feats)
        packed = drafter(
            embed(ids), ctx, torch.arange(CTX)[None], pos, masks(drafter, anchors, BLOCK)
        )
        blocks = [packed[:, j * BLOCK : (j + 1) * BLOCK] for j in range(len(ANCHORS))]
        # The short block: one block of SHORT slots at the last anchor, on its own.
        a = ANCHORS[-1]
        short_ids = block(a, SHORT)
        short_mask = masks(drafter, anchors[:, -1:], SHORT)
        short_pos = a + torch.arange(SHORT)[None]
        blocks.append(
            drafter(embed(short_ids), ctx, torch.arange(CTX)[None], short_pos, short_mask)
        )
        spans = [(a, BLOCK) for a in ANCHORS] + [(a, SHORT)]
        for j, ((a, length), hidden) in enumerate(zip(spans, blocks, strict=True)):
            anchor = tokens[0, a : a + 1]
            tok, cand, _ = drafter.propose(hidden[:, 1:], anchor, head)
            ours.append(
                {"hidden": hidden, "logits": head(hidden), "tokens": tok, "candidates": cand}
            )
            cases[f"{j}.target_hidden"] = feats[:, :a]
            cases[f"{j}.noise_embedding"] = embed(block(a, length))
            cases[f"{j}.position_ids"] = torch.arange(a + length)[None]
            cases[f"{j}.anchor"] = anchor
        cases["lm_head"] = head.weight
    return cases, ours


def our_decode(target_dir: Path, drafter, prompts):
    from transformers import AutoModelForCausalLM

    from dflash.evaluate import cached_drafter
    from dflash.spec_decode import CachedTarget, speculative_generate

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    target = CachedTarget(model, drafter.target_layer_ids)
    drafts: list[list[int]] = []

    cached = cached_drafter(drafter, model.get_input_embeddings(), model.lm_head)
    propose = cached.propose

    def recording(anchor, anchor_pos, block_size):  # observation only
        block = propose(anchor, anchor_pos, block_size)
        drafts.append(block[1:].tolist())
        return block

    cached.propose = recording  # type: ignore[method-assign]
    rows = []
    for ids in prompts:
        drafts.clear()
        res = speculative_generate(
            target,
            cached,
            ids,
            block_size=BLOCK,
            max_new_tokens=MAX_NEW_TOKENS,
            eos_ids=set(),
        )
        rows.append(
            {"output_ids": res.output_ids, "accept": res.accept_lengths, "drafts": list(drafts)}
        )
    return rows


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash2_reference")
    target, drafters = build(root)
    specs, ours = [], {}
    for name, drafter in drafters.items():
        cases, ours[name] = forward_cases(target, drafter)
        save_file({k: v.clone().contiguous() for k, v in cases.items()}, root / f"{name}.in")
        spec = {"path": str(root / f"run-{name}" / "drafter"), "inputs": str(root / f"{name}.in")}
        spec.update(outputs=str(root / f"{name}.out"), cases=len(ours[name]))
        specs.append({**spec, "decode": name == "drafter"})
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 127, (n,), generator=g).tolist() for n in (5, 7, 9)]
    request = {
        "drafters": specs,
        "target": str(root / "target"),
        "prompts": prompts,
        "max_new_tokens": MAX_NEW_TOKENS,
    }
    (root / "request.json").write_text(json.dumps(request))
    python = isolated_python("zlab-dflash-0.1.0", ZLAB_PINS, no_deps=(ZLAB_DECODER,))
    ref = run_json(python, DRIVER.read_text(), str(root / "request.json"))
    assert ref["versions"] == {"dflash": "0.1.0", "torch": "2.13.0", "transformers": "5.15.0"}
    assert "site-packages" in ref["dflash_file"]  # their package, from their environment
    return {
        "root": root,
        "ref": dict(zip(drafters, ref["drafters"], strict=True)),
        "ours": ours,
        "theirs": {name: load_file(root / f"{name}.out") for name in drafters},
        "decoded": our_decode(root / "target", drafters["drafter"], prompts),
    }


@pytest.mark.slow  # their ~3 GB environment on a cold uv cache
@pytest.mark.parametrize("name", VARIANTS)
def test_zlab_reads_the_export_completely(compared, name):
    reading = compared["ref"][name]["reading"]
    conf = json.loads((compared["root"] / f"run-{name}" / "drafter" / "config.json").read_text())
    assert reading["loading"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    assert reading["drafter_class"] == conf["architectures"][0] == "DFlash2DraftModel"
    dcfg = conf["dflash_config"]
    for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
        assert reading[key] == dcfg[key], key
    assert reading["block_size"] == BLOCK
    assert reading["mask_token_id"] == dcfg["mask_token_id"]
    assert reading["target_layer_ids"] == dcfg["target_layer_ids"]
    # Attention as trained: bidirectional full layers, causal windowed sliding ones.
    slides = [t == "sliding_attention" for t in VARIANTS[name]]
    assert reading["is_causal"] == slides == dcfg["causal_in_block"]
    assert reading["sliding_window"] == [WINDOW if s else None for s in slides]


def max_abs(compared, name: str, what: str) -> tuple[float, float]:
    """(max |ours - theirs|, max |ours|) over the cases."""
    theirs, ours = compared["theirs"][name], compared["ours"][name]
    diff = max((o[what] - theirs[f"{j}.{what}"]).abs().max().item() for j, o in enumerate(ours))
    return diff, max(o[what].abs().max().item() for o in ours)


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_forward_outputs_match(compared, name):
    for what in ("hidden", "logits"):
        diff, scale = max_abs(compared, name, what)
        print(f"{name} {what}: max abs difference {diff:.3g} (largest |value| {scale:.3g})")
        assert diff <= RTOL * scale, what
    # Not a vacuous match: the outputs are far from zero and differ between blocks.
    ours = compared["ours"][name]
    assert all(o["logits"].abs().max() > 1.0 for o in ours)
    assert (ours[0]["logits"] - ours[1]["logits"]).abs().max() > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_selector_walk_matches(compared, name):
    theirs, ours = compared["theirs"][name], compared["ours"][name]
    for j, mine in enumerate(ours):
        assert torch.equal(mine["tokens"], theirs[f"{j}.tokens"]), j
        # Same candidate sets (their top-k is unsorted, ours best first).
        got = theirs[f"{j}.candidates"].sort(-1).values
        assert torch.equal(mine["candidates"].sort(-1).values, got), j
    # The selector changed at least one pick from the per-slot argmax: the pair term matters.
    argmax = [o["logits"][:, 1:].argmax(-1) for o in ours]
    assert any(not torch.equal(a, o["tokens"]) for a, o in zip(argmax, ours, strict=True))


@pytest.mark.slow
def test_greedy_decode_identical(compared):
    results = compared["ref"]["drafter"]["results"]
    compared_drafts = 0
    for ours, theirs in zip(compared["decoded"], results, strict=True):
        assert theirs["output_ids"] == ours["output_ids"]
        assert theirs["acceptance_lengths"] == committed_per_step(
            ours["accept"], len(ours["output_ids"])
        )
        # Every full-size block drafted the same tokens (theirs shrinks the last blocks
        # to what fits in max_new_tokens; ours always drafts full blocks).
        for mine, step in zip(ours["drafts"], theirs["drafts"], strict=False):
            if step["block"] == BLOCK:
                assert step["tokens"] == mine
                compared_drafts += 1
    accepted = [a for row in compared["decoded"] for a in row["accept"]]
    print(f"compared {compared_drafts} drafted blocks; accepted per step {accepted}")
    assert compared_drafts >= 10
    # Steps that committed drafts too (not only bonus tokens): the context cache after
    # accepted drafts is compared as well.
    assert sum(a > 0 for a in accepted) >= 5 and max(accepted) >= 2
