"""Sampling eval (temperature > 0): lossless in distribution, shown by a chi-square test.

A tiny target with a 6-token vocabulary and a random 1-layer drafter: the joint of the
first three generated tokens over many draws of speculative decoding is compared with
the target's own sampling distribution of those tokens, computed exactly by enumerating
every prefix through the target (full forward passes, no cache, the same warpers). The
first token comes from the prefill; tokens 2 and 3 are drafted, accepted or rejected,
replaced from the residual, or the bonus, so every branch of the rule is in the joint.

The bound: the correct rule must give a p-value above ALPHA (a fixed seed, so the
outcome is deterministic; a correct sampler would fail at a random seed with probability
ALPHA), and two deliberately wrong rules (accept every draft; resample from p instead of
the residual on a rejection) must give one below POWER_BOUND, orders of magnitude
further out: the test could not pass a wrong rule by accident.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats
from test_eval import save_tiny_pair

import dflash.spec_decode as spec_decode
from dflash.model import DFlashDraftModel, make_draft_config
from dflash.sampling import Sampling, draw, rejection_step
from dflash.spec_decode import CachedDrafter, CachedTarget, speculative_generate

VOCAB, PROMPT, N_TOKENS, DRAWS = 6, [1, 2, 3, 4], 3, 1000
ALPHA, POWER_BOUND = 1e-3, 1e-8
CASES = {  # name: (sampling, block size)
    "t1-bs2": (Sampling(temperature=1.0), 2),
    "t0.9-topk4-topp0.95-bs4": (Sampling(temperature=0.9, top_p=0.95, top_k=4), 4),
}


@pytest.fixture(scope="module")
def pair():
    """Target and drafter over a 6-token vocabulary (the drafter's mask is row 5)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # initial logits are near uniform; sharpen them to entropy ~1 nat
        model.lm_head.weight.mul_(14)
    dcfg = make_draft_config(
        cfg, num_layers=1, block_size=4, mask_token_id=VOCAB - 1, target_layer_ids=[0, 1]
    )
    drafter = DFlashDraftModel(dcfg).eval()
    target = CachedTarget(model, [0, 1])
    cached = CachedDrafter(drafter, model.get_input_embeddings(), model.get_output_embeddings())
    return model, target, cached


@torch.no_grad()
def target_joint(model, sampling: Sampling) -> dict[tuple[int, ...], float]:
    """P(x1..xN) = prod_i p(x_i | prompt, x_<i), every prefix in one batched forward."""
    prefixes = list(itertools.product(range(VOCAB), repeat=N_TOKENS - 1))
    ids = torch.tensor([PROMPT + list(x) for x in prefixes])
    logits = model(input_ids=ids).logits[:, len(PROMPT) - 1 :]  # [prefixes, N, V]
    p = sampling.probs(logits.reshape(-1, VOCAB)).reshape(len(prefixes), N_TOKENS, VOCAB)
    p = p.double()
    joint = {}
    for j, x in enumerate(prefixes):
        head = float(torch.prod(p[j, torch.arange(N_TOKENS - 1), torch.tensor(x)]))
        for last in range(VOCAB):
            joint[(*x, last)] = head * float(p[j, -1, last])
    return joint


def draws(target, cached, sampling: Sampling, block_size: int, n: int = DRAWS):
    gen = torch.Generator().manual_seed(1234)
    counts, steps = Counter(), Counter()
    for _ in range(n):
        r = speculative_generate(
            target,
            cached,
            PROMPT,
            block_size=block_size,
            max_new_tokens=N_TOKENS,
            eos_ids=set(),
            sampling=sampling,
            generator=gen,
        )
        counts[tuple(r.output_ids)] += 1
        steps.update(r.accept_lengths)
    return counts, steps


def chi_square_pvalue(counts: Counter, probs: dict) -> float:
    """Goodness of fit of observed sequences to exact probabilities; cells expected below 5
    are pooled (the usual validity rule); any sequence the target cannot produce -> 0."""
    n = sum(counts.values())
    cells = sorted(set(probs) | set(counts))
    exp = np.array([probs.get(c, 0.0) for c in cells])
    exp *= n / exp.sum()
    obs = np.array([counts.get(c, 0) for c in cells], dtype=float)
    if obs[exp == 0].sum() > 0:
        return 0.0
    big = exp >= 5
    obs_b, exp_b = np.append(obs[big], obs[~big].sum()), np.append(exp[big], exp[~big].sum())
    if exp_b[-1] < 5:  # the pooled cell itself too small: fold it into the smallest big one
        k = int(np.argmin(exp_b[:-1]))
        obs_b[k], exp_b[k] = obs_b[k] + obs_b[-1], exp_b[k] + exp_b[-1]
        obs_b, exp_b = obs_b[:-1], exp_b[:-1]
    return float(stats.chisquare(obs_b, exp_b).pvalue)


@pytest.mark.parametrize("case", CASES)
def test_speculative_sampling_matches_target_sampling(pair, case):
    model, target, cached = pair
    sampling, bs = CASES[case]
    probs = target_joint(model, sampling)
    counts, steps = draws(target, cached, sampling, bs)
    pvalue = chi_square_pvalue(counts, probs)
    assert pvalue > ALPHA, f"{case}: chi-square p-value {pvalue:.3g}, counts {dict(counts)}"
    # Both branches were taken: rejections (0 accepted) and accepted drafts.
    assert steps[0] > 0 and sum(c for a, c in steps.items() if a > 0) > 0, steps


def accept_all(drafts, q, p, generator):
    """Wrong: every draft kept, so tokens 2.. follow the drafter, not the target."""
    return len(drafts), int(draw(p[-1:], generator)[0])


def resample_from_target(drafts, q, p, generator):
    """Wrong, subtly: the correct accept test, then a rejected draft is replaced by a draw
    from p instead of the residual max(0, p - q): tokens q over-proposes are too likely."""
    n_acc, _ = rejection_step(drafts, q, p, generator)
    return n_acc, int(draw(p[n_acc : n_acc + 1], generator)[0])


@pytest.mark.parametrize("wrong", [accept_all, resample_from_target], ids=lambda f: f.__name__)
def test_distribution_test_rejects_wrong_samplers(pair, monkeypatch, wrong):
    model, target, cached = pair
    sampling, bs = CASES["t1-bs2"]
    monkeypatch.setattr(spec_decode, "rejection_step", wrong)
    pvalue = chi_square_pvalue(
        draws(target, cached, sampling, bs)[0], target_joint(model, sampling)
    )
    assert pvalue < POWER_BOUND, f"{wrong.__name__} passed: p-value {pvalue:.3g}"


def test_block_size_one_is_plain_target_sampling(pair):
    """bs 1 through the same loop is the target's own autoregressive sampling."""
    model, target, _ = pair
    sampling = CASES["t0.9-topk4-topp0.95-bs4"][0]
    counts, steps = draws(target, None, sampling, 1, n=500)
    assert set(steps) == {0}
    assert chi_square_pvalue(counts, target_joint(model, sampling)) > ALPHA


def test_rejection_step_branches():
    """Hand-built p, q: certain acceptance, certain rejection, the residual, the bonus."""
    gen = torch.Generator().manual_seed(0)
    one_hot = torch.eye(4)
    # q == p: always accepted; the bonus comes from p[-1] (token 3).
    p = torch.stack([one_hot[1], one_hot[2], one_hot[3]])
    assert rejection_step(torch.tensor([1, 2]), p[:-1], p, gen) == (2, 3)
    # The draft has p 0: rejected; the residual max(0, p - q) is all on token 0.
    p0, q0 = torch.tensor([[0.5, 0.0, 0.5, 0.0]]), torch.tensor([[0.0, 0.5, 0.5, 0.0]])
    for _ in range(20):
        assert rejection_step(torch.tensor([1]), q0, torch.cat([p0, one_hot[3:]]), gen) == (0, 0)
    # No drafts (bs 1): a plain draw from p.
    assert rejection_step(torch.tensor([], dtype=torch.long), None, one_hot[2:3], gen) == (0, 2)


@pytest.mark.parametrize(
    "kw, flag",
    [
        ({"temperature": -0.5}, "--temperature -0.5"),
        ({"temperature": float("nan")}, "--temperature nan"),
        ({"temperature": 1.0, "top_p": 0.0}, "--top-p 0.0"),
        ({"temperature": 1.0, "top_p": 1.5}, "--top-p 1.5"),
        ({"temperature": 1.0, "top_k": -1}, "--top-k -1"),
        ({"top_k": 5}, "--temperature > 0"),
    ],
)
def test_sampling_validation(kw, flag):
    with pytest.raises(ValueError, match=flag.replace("+", r"\+")) as e:
        Sampling(**kw)
    assert "\n" not in str(e.value)


def test_greedy_default_is_unchanged(pair):
    """Sampling() (temperature 0) takes the greedy path: the same tokens as no sampling."""
    _, target, cached = pair
    kw = dict(block_size=4, max_new_tokens=8, eos_ids=set())
    plain = speculative_generate(target, cached, PROMPT, **kw)
    greedy = speculative_generate(target, cached, PROMPT, sampling=Sampling(), **kw)
    assert greedy.output_ids == plain.output_ids
    assert greedy.accept_lengths == plain.accept_lengths


def _eval_cli(*args: str) -> tuple[int, str, str]:
    from dflash.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["eval", *args])
    return rc, out.getvalue(), err.getvalue()


def test_eval_cli_sampling_records_settings_and_reproduces(tmp_path):
    target, drafter = save_tiny_pair(tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"x {i}"}) + "\n" for i in range(2)))
    base = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]
    base += ["--max-new-tokens", "10", "--block-size", "4", "--speedup-prompts", "1"]
    flags = ["--temperature", "1.5", "--top-p", "0.9", "--top-k", "20"]
    outs = []
    for seed in ("3", "3", "4"):
        out = tmp_path / f"out{len(outs)}.jsonl"
        rc, stdout, err = _eval_cli(*base, *flags, "--seed", seed, "--out", str(out))
        assert rc == 0, err
        summary = json.loads(stdout.splitlines()[-1])
        settings = {"temperature": 1.5, "top_p": 0.9, "top_k": 20, "seed": int(seed)}
        assert {k: summary[k] for k in settings} == settings
        assert 1.0 <= summary["tau"] <= 4 and summary["speedup"] > 0
        assert "sampled at temperature 1.5" in err
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert all({k: r[k] for k in settings} == settings for r in rows)
        outs.append([r["output_ids"] for r in rows])
    assert outs[0] == outs[1]  # the same seed reproduces
    assert outs[0] != outs[2]  # another seed samples something else


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "--temperature -1.0: must be"),
        (["--temperature", "1", "--top-p", "0"], "--top-p 0.0: must be in (0, 1]"),
        (["--temperature", "1", "--top-k", "-2"], "--top-k -2: must be"),
        (["--temperature", "1", "--check-lossless"], "--check-lossless compares with greedy"),
    ],
)
def test_eval_cli_rejects_bad_sampling_before_loading(tmp_path, args, message):
    # The paths do not exist: the error must come from the flags, before any loading.
    rc, stdout, err = _eval_cli(
        "--target", "nowhere", "--drafter", "nowhere", "--prompts", "nowhere", *args
    )
    assert rc == 1 and stdout == ""
    assert err.startswith("dflash eval: ") and message in err and err.count("\n") == 1
