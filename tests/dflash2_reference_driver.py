# mypy: ignore-errors
# (type-checked here, `dflash` would be ours; this file runs against z-lab's package)
"""z-lab's published decoder (PyPI `dflash==0.1.0`) run on our exported DFlash2 drafter.

Runs INSIDE that package's own environment (torch 2.13.0, transformers 5.15.0), started
by tests/test_dflash2_reference.py as `python -I -c SOURCE REQUEST.json`; never imported
by the project (its import package is also called `dflash`).

REQUEST.json: {"drafters": [{"path": dir, "inputs": file.safetensors, "outputs":
file.safetensors, "cases": n, "decode": bool}, ...], "target": dir, "prompts": [[ids...]...],
"max_new_tokens": n}. Each drafter's inputs hold, per case j: "j.target_hidden" [1, S, k*H], "j.noise_embedding" [1, L, H],
"j.position_ids" [1, S+L], "j.anchor" [1]; and "lm_head" [V, H].
outputs gets, per case: "j.hidden" (their forward), "j.logits" (their compute_logits),
"j.tokens" and "j.candidates" (their greedy CandidateSelector walk over slots 1..L-1).
Prints one JSON line: per drafter, what their loader read and, for those that decode, per
prompt of the greedy decode the new tokens, `acceptance_lengths`, and each step's drafted
tokens with its block length.
"""

import json
import sys
import time
from importlib import metadata

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import dflash
from dflash import model as zlab_model
from dflash.model import DFlash2DraftModel, dflash_generate


def load_drafter(path):
    draft, info = DFlash2DraftModel.from_pretrained(
        path,
        attn_implementation="sdpa",
        dtype=torch.float32,
        local_files_only=True,
        output_loading_info=True,
    )
    return draft.eval(), info


def forward_cases(draft, spec) -> None:
    inputs = load_file(spec["inputs"])
    head = torch.nn.Linear(inputs["lm_head"].shape[1], inputs["lm_head"].shape[0], bias=False)
    head.weight.data.copy_(inputs["lm_head"])
    out = {}
    with torch.inference_mode():
        for j in range(spec["cases"]):
            hidden = draft(
                target_hidden=inputs[f"{j}.target_hidden"],
                noise_embedding=inputs[f"{j}.noise_embedding"],
                position_ids=inputs[f"{j}.position_ids"],
            )
            out[f"{j}.hidden"] = hidden
            out[f"{j}.logits"] = draft.compute_logits(hidden, head)
            tokens, candidates, _ = draft.propose(hidden[:, 1:], inputs[f"{j}.anchor"], head, 0.0)
            out[f"{j}.tokens"] = tokens
            out[f"{j}.candidates"] = candidates
    save_file({k: v.clone().contiguous() for k, v in out.items()}, spec["outputs"])


def load_target(path):
    return AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="sdpa", dtype=torch.float32, local_files_only=True
    ).eval()


def decode(draft, target, req) -> list[dict]:
    drafts = []
    propose = draft.propose

    # Observation only: record what their decoder drafted each step, then return it.
    def recording_propose(hidden, anchor_ids, head, temperature):
        tokens, candidates, q = propose(hidden, anchor_ids, head, temperature)
        drafts.append({"block": int(hidden.shape[1]) + 1, "tokens": tokens[0].tolist()})
        return tokens, candidates, q

    draft.propose = recording_propose
    results = []
    for ids in req["prompts"]:
        drafts.clear()
        out = dflash_generate(
            draft,
            target,
            torch.tensor([ids], dtype=torch.long),
            req["max_new_tokens"],
            None,
            temperature=0.0,
            return_stats=True,
        )
        results.append(
            {
                "output_ids": out.output_ids[0, out.num_input_tokens :].tolist(),
                "acceptance_lengths": list(out.acceptance_lengths),
                "drafts": list(drafts),
            }
        )
    return results


def reading(draft, info) -> dict:
    layer = draft.layers[0]
    attn = [lay.self_attn for lay in draft.layers]
    return {
        "drafter_class": type(draft).__name__,
        "loading": {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs"},
        "block_size": draft.block_size,
        "mask_token_id": draft.mask_token_id,
        "target_layer_ids": list(draft.target_layer_ids),
        "conv_kernel_size": layer.attention_conv.kernel_size,
        "conv_group_size": layer.attention_conv.group_size,
        "selector_top_k": draft.candidate_selector.top_k,
        "selector_rank": draft.candidate_selector.hidden_projection.out_features,
        "is_causal": [a.is_causal for a in attn],
        "sliding_window": [a.sliding_window for a in attn],
    }


def main() -> None:
    with open(sys.argv[1]) as f:
        req = json.load(f)
    # return_stats=True times with torch.cuda.synchronize(), which raises without a GPU;
    # only the clock is replaced (as in tests/reference_decoder_driver.py).
    zlab_model._cuda_time = time.perf_counter
    target = load_target(req["target"])
    rows = []
    for spec in req["drafters"]:
        torch.manual_seed(0)
        draft, info = load_drafter(spec["path"])
        forward_cases(draft, spec)
        row = {"reading": reading(draft, info)}
        if spec["decode"]:
            row["results"] = decode(draft, target, req)
        rows.append(row)
    versions = {d: metadata.version(d) for d in ("dflash", "torch", "transformers")}
    print(
        json.dumps(
            {
                "dflash_file": dflash.__file__,
                "versions": versions,
                "drafters": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
