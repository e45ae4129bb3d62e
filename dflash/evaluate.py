"""Evaluate a drafter by speculative decoding with its target: tau, histogram, speedup.

Greedy by default; with a Sampling of temperature > 0 the decode samples (docs/eval.md),
from one random stream seeded with its seed and drawn in prompt order.

Loading checks that drafter and target belong together before anything is decoded;
prompts are rendered with the target's chat template (generation prompt open) and
checked against the context length up front, so a bad prompt fails before any work.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dflash.data.sources import DataError
from dflash.sampling import Sampling
from dflash.spec_decode import (
    CachedDrafter,
    CachedTarget,
    first_mismatch,
    greedy_reference,
    speculative_generate,
)
from dflash.target import TargetMismatch, eos_ids_of


def load_pair(target_dir: str, drafter_dir: str, device: str = "cpu", drafter_state=None):
    """(target LM, tokenizer, drafter) from local directories, checked for compatibility.

    `drafter_state` (a state dict, e.g. from a training checkpoint) replaces the
    exported drafter weights: used to evaluate intermediate checkpoints.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from dflash.model_dflash2 import drafter_class

    # The drafter first: its config is normalised by dflash.export, and a config that
    # readers would build differently is refused before the (large) target loads. Its
    # `architectures` picks the class (DFlash or DFlash2).
    config = AutoConfig.from_pretrained(drafter_dir, local_files_only=True)
    drafter = drafter_class(config).from_pretrained(drafter_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        target_dir, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
    )
    if drafter_state is not None:
        drafter.load_state_dict(drafter_state)
    check_pair(model, tok, drafter, target_dir, drafter_dir)
    return model.to(device).eval(), tok, drafter.to(device).eval()  # type: ignore[arg-type]


def cached_drafter(drafter, embed_tokens, lm_head) -> CachedDrafter:
    """Decode-time drafting for `drafter`'s architecture (DFlash2 adds its convolutions
    and the candidate selector)."""
    from dflash.model_dflash2 import DFlash2DraftModel

    if isinstance(drafter, DFlash2DraftModel):
        from dflash.decode_dflash2 import CachedDFlash2Drafter

        return CachedDFlash2Drafter(drafter, embed_tokens, lm_head)
    return CachedDrafter(drafter, embed_tokens, lm_head)


def check_pair(model, tok, drafter, target_dir: str = "target", drafter_dir: str = "drafter"):
    """Raise TargetMismatch naming every way the drafter does not fit this target."""
    t, d = model.config, drafter.config
    rows = model.get_input_embeddings().weight.shape[0]
    problems = []
    if d.hidden_size != t.hidden_size:
        problems.append(f"hidden size: drafter {d.hidden_size}, target {t.hidden_size}")
    if d.vocab_size != rows:
        problems.append(f"vocabulary: drafter expects {d.vocab_size} rows, target has {rows}")
    if getattr(d, "num_target_layers", None) != t.num_hidden_layers:
        problems.append(
            f"target depth: drafter trained on {getattr(d, 'num_target_layers', None)} "
            f"layers, target has {t.num_hidden_layers}"
        )
    if max(drafter.target_layer_ids) >= t.num_hidden_layers:
        problems.append(
            f"layer ids: drafter reads {drafter.target_layer_ids}, target has "
            f"{t.num_hidden_layers} layers"
        )
    # The drafter is trained with the target's RoPE (make_draft_config copies it).
    d_rope, t_rope = dict(d.rope_parameters), dict(t.rope_parameters)
    if d_rope != t_rope:
        problems.append(f"RoPE: drafter {d_rope}, target {t_rope}")
    mask_id = drafter.mask_token_id
    if not len(tok) <= mask_id < rows:
        problems.append(
            f"mask token id {mask_id}: must be an embedding row (< {rows}) that the "
            f"tokenizer never produces (>= {len(tok)})"
        )
    if problems:
        raise TargetMismatch(
            f"drafter {drafter_dir} does not belong to target {target_dir}: "
            + "; ".join(problems)
            + ". Evaluate the drafter with the target it was trained on."
        )


@dataclass
class Prompt:
    id: str
    ids: list[int]
    truncated: int = 0  # tokens dropped from the left


def load_prompts(path: str, tok, limit: int | None = None) -> list[Prompt]:
    """Prompt rows as `dflash regen` reads them, tokenized with the generation prompt open."""
    from dflash.data.prompts import load_prompt_rows

    prompts = []
    for rid, messages in load_prompt_rows(path)[:limit]:
        ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        if not isinstance(ids, list):  # a BatchEncoding in some transformers versions
            ids = list(ids["input_ids"])
        prompts.append(Prompt(rid, list(ids)))
    return prompts


def fit_context(prompts: list[Prompt], limit: int, truncate: bool) -> None:
    """Every prompt must leave room for the output; truncate from the left or refuse."""
    for p in prompts:
        if len(p.ids) <= limit:
            continue
        if not truncate:
            raise DataError(
                f"prompt {p.id!r} has {len(p.ids)} tokens; with the requested output it must "
                f"fit in {limit} (the target's max_position_embeddings minus max new tokens "
                "and one block). Lower --max-new-tokens, or pass --truncate-prompts."
            )
        p.truncated = len(p.ids) - limit
        p.ids = p.ids[-limit:]


def check_sampling(sampling: Sampling, check_lossless: bool) -> None:
    if check_lossless and not sampling.greedy:
        raise ValueError(
            "--check-lossless compares with greedy generate, so it needs --temperature 0; "
            "sampling is lossless in distribution (docs/eval.md)"
        )


def evaluate(
    model,
    tok,
    drafter,
    prompts: list[Prompt],
    *,
    block_size: int,
    max_new_tokens: int,
    check_lossless: bool = False,
    speedup_prompts: int = 0,
    out_path: str | None = None,
    progress: bool = True,
    sampling: Sampling | None = None,
) -> dict[str, Any]:
    """Decode every prompt speculatively; returns the summary (and writes per-prompt JSONL)."""
    if not 1 <= block_size <= drafter.block_size:
        raise ValueError(
            f"--block-size {block_size} must be in 1..{drafter.block_size} (the trained size)"
        )
    sampling = sampling or Sampling()
    check_sampling(sampling, check_lossless)
    layer_ids = drafter.target_layer_ids
    target = CachedTarget(model, layer_ids)
    cached = cached_drafter(drafter, model.get_input_embeddings(), model.get_output_embeddings())
    eos = eos_ids_of(tok, model)
    hist = [0] * block_size
    n_tokens, seconds, mismatches, rows = 0, 0.0, [], []
    gen = None if sampling.greedy else sampling.generator(model.device)
    for p in tqdm(prompts, desc=f"eval bs{block_size}", disable=not progress, dynamic_ncols=True):
        r = speculative_generate(
            target,
            cached,
            p.ids,
            block_size=block_size,
            max_new_tokens=max_new_tokens,
            eos_ids=eos,
            sampling=sampling,
            generator=gen,
        )
        for a in r.accept_lengths:
            hist[a] += 1
        n_tokens, seconds = n_tokens + len(r.output_ids), seconds + r.seconds
        row: dict[str, Any] = {"id": p.id, "prompt_tokens": len(p.ids), "truncated": p.truncated}
        row |= {"output_ids": r.output_ids, "accept_lengths": r.accept_lengths}
        row |= sampling.as_dict()
        if check_lossless:
            ref = greedy_reference(model, p.ids, max_new_tokens, eos)
            row["first_mismatch"] = first_mismatch(r.output_ids, ref)
            if row["first_mismatch"] is not None:
                mismatches.append({"id": p.id, "position": row["first_mismatch"]})
        rows.append(row)
    steps = sum(hist)
    summary: dict[str, Any] = {
        "block_size": block_size,
        "prompts": len(prompts),
        "tau": sum((a + 1) * c for a, c in enumerate(hist)) / max(steps, 1),
        "accept_hist": hist,
        "output_tokens": n_tokens,
        "ms_per_token": 1000 * seconds / max(n_tokens, 1),
        "truncated_prompts": sum(p.truncated > 0 for p in prompts),
        **sampling.as_dict(),
    }
    if speedup_prompts:
        base = prompts[:speedup_prompts]
        summary |= speedup(
            target, cached, base, block_size, max_new_tokens, eos, progress, sampling
        )
    if check_lossless:
        summary["lossless"] = not mismatches
        summary["mismatches"] = mismatches
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        with open(out_path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return summary


def speedup(
    target, cached, prompts, block_size, max_new_tokens, eos, progress, sampling=None
) -> dict[str, Any]:
    """Time per output token at bs 1 / at bs, same loop, same prompts, timed back to back
    (with the same sampling settings, each run from a fresh stream of the same seed)."""
    sampling, per = sampling or Sampling(), {}
    for bs in (1, block_size):
        t0, n = time.perf_counter(), 0
        gen = None if sampling.greedy else sampling.generator(target.model.device)
        for p in tqdm(prompts, desc=f"timing bs{bs}", disable=not progress, dynamic_ncols=True):
            r = speculative_generate(
                target,
                cached,
                p.ids,
                block_size=bs,
                max_new_tokens=max_new_tokens,
                eos_ids=eos,
                sampling=sampling,
                generator=gen,
            )
            n += len(r.output_ids)
        per[bs] = (time.perf_counter() - t0) / max(n, 1)
    return {
        "speedup": per[1] / per[block_size],
        "ms_per_token_bs1": 1000 * per[1],
        "ms_per_token_timed": 1000 * per[block_size],
        "speedup_prompts": len(prompts),
    }
