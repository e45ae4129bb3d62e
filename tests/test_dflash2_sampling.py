"""Speculative sampling with a DFlash2 drafter is lossless in distribution.

The DFlash2 proposal is the selector's walk, sampled: slot i's draft is drawn from
softmax(score / T) over its k candidates, given the draft of slot i-1. Spread over the
vocabulary (zero outside the candidates) that is the q rejection sampling divides by
(dflash.decode_dflash2.CachedDFlash2Drafter.sample). The harness, the exact target
joint and the chi-square bound are tests/test_sampling_eval.py's, with a random DFlash2
drafter (k = 3 of 6 tokens, so the residual also lands outside the candidates).
"""

from __future__ import annotations

import pytest
import test_sampling_eval
import torch
from test_sampling_eval import ALPHA, POWER_BOUND, VOCAB, chi_square_pvalue, draws, target_joint

from dflash.decode_dflash2 import CachedDFlash2Drafter
from dflash.export_dflash2 import DFlash2Settings
from dflash.model_dflash2 import DFlash2DraftModel, make_dflash2_config
from dflash.sampling import Sampling

pair = test_sampling_eval.pair  # the fixture: their tiny target, in this module too
SAMPLING, BLOCK = Sampling(temperature=0.9, top_p=0.95, top_k=4), 4


@pytest.fixture(scope="module")
def dflash2_pair(pair):
    model, target, _ = pair
    settings = DFlash2Settings(
        conv_kernel_size=2, conv_group_size=16, selector_rank=4, selector_top_k=3
    )
    cfg = make_dflash2_config(
        model.config,
        settings=settings,
        num_layers=1,
        block_size=BLOCK,
        mask_token_id=VOCAB - 1,
        target_layer_ids=[0, 1],
    )
    torch.manual_seed(0)
    drafter = DFlash2DraftModel(cfg).eval()
    with torch.no_grad():  # away from the identity / zero-successor init
        for p in (
            drafter.candidate_selector.successor_codebook,
            drafter.layers[0].mlp_conv.base_kernel,
        ):
            p.normal_(0.0, 1.0)
    cached = CachedDFlash2Drafter(drafter, model.get_input_embeddings(), model.lm_head)
    return model, target, cached


@pytest.mark.slow  # 1000 decodes, 13-30 s on the 2-core machine
def test_dflash2_speculative_sampling_matches_target_sampling(dflash2_pair):
    model, target, cached = dflash2_pair
    counts, steps = draws(target, cached, SAMPLING, BLOCK)
    pvalue = chi_square_pvalue(counts, target_joint(model, SAMPLING))
    print(f"chi-square p-value {pvalue:.3g}")
    assert pvalue > ALPHA, f"chi-square p-value {pvalue:.3g}, counts {dict(counts)}"
    assert steps[0] > 0 and sum(c for a, c in steps.items() if a > 0) > 0, steps


@pytest.mark.slow
def test_a_wrong_proposal_is_caught(dflash2_pair, monkeypatch):
    """Dividing by a q the drafts were not drawn from (uniform over the candidates, the
    selector's scores ignored) breaks losslessness, and the same bound sees it."""
    model, target, cached = dflash2_pair
    sample = CachedDFlash2Drafter.sample

    def wrong(self, anchor, anchor_pos, block_size, s, gen):
        block, q = sample(self, anchor, anchor_pos, block_size, s, gen)
        return block, (q > 0).float() / (q > 0).sum(-1, keepdim=True)

    monkeypatch.setattr(CachedDFlash2Drafter, "sample", wrong)
    counts, _ = draws(target, cached, SAMPLING, BLOCK)
    pvalue = chi_square_pvalue(counts, target_joint(model, SAMPLING))
    print(f"wrong proposal: chi-square p-value {pvalue:.3g}")
    assert pvalue < POWER_BOUND
