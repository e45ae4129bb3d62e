"""Greedy speculative decoding with z-lab's published decoder (PyPI `dflash==0.1.0`).

Runs INSIDE that package's own environment (its pins: torch 2.13.0, transformers 5.15.0),
never in the project venv: there `import dflash` is z-lab's package, not ours. The test
(tests/test_reference_decoder.py) starts it with `python -I -c SOURCE REQUEST.json`, so
neither the repository nor PYTHONPATH is on sys.path.

REQUEST.json: {"drafters": [{"path": dir, "decode": bool}, ...], and for the drafters
that decode: "target": dir, "prompts": [[ids...], ...], "max_new_tokens": n,
"stop_token_ids": [...], "block_size": n | null}.
Prints one JSON line: per drafter, what their loader made of its config (so a mismatch
can be traced to a field) and, when it decodes, per prompt the new token ids and z-lab's
`acceptance_lengths` (tokens committed per verify step: accepted drafts + the bonus).
"""

import json
import sys
import time
from importlib import metadata

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import dflash
from dflash import model as zlab_model
from dflash.model import DFlash2DraftModel, DFlashDraftModel, dflash_generate


# Their `benchmark.load_transformers_models`, minus its hard-coded bfloat16 and cuda:0:
# `dflash eval` decodes in float32 on CPU, and the same weights in another dtype would
# decode differently for reasons that have nothing to do with the decoder.
def load_target(target_dir: str):
    return AutoModelForCausalLM.from_pretrained(
        target_dir, attn_implementation="sdpa", dtype=torch.float32, local_files_only=True
    ).eval()


def load_drafter(drafter_dir: str):
    config = AutoConfig.from_pretrained(drafter_dir, local_files_only=True)
    cls = (
        DFlash2DraftModel
        if "DFlash2DraftModel" in (config.architectures or [])
        else DFlashDraftModel
    )
    draft, info = cls.from_pretrained(
        drafter_dir,
        attn_implementation="sdpa",
        dtype=torch.float32,
        local_files_only=True,
        output_loading_info=True,
    )
    return draft.eval(), info


def decode(draft, target, req) -> list[dict]:
    results = []
    for ids in req["prompts"]:
        out = dflash_generate(
            draft,
            target,
            torch.tensor([ids], dtype=torch.long),
            req["max_new_tokens"],
            req["stop_token_ids"],
            temperature=0.0,
            block_size=req.get("block_size"),
            return_stats=True,
        )
        new = out.output_ids[0, out.num_input_tokens :].tolist()
        results.append({"output_ids": new, "acceptance_lengths": list(out.acceptance_lengths)})
    return results


def reading(draft, info) -> dict:
    attn = [layer.self_attn for layer in draft.layers]
    return {
        "drafter_class": type(draft).__name__,
        "loading": {k: sorted(map(str, v)) for k, v in info.items() if k != "error_msgs"},
        "block_size": draft.block_size,
        "mask_token_id": draft.mask_token_id,
        "target_layer_ids": list(draft.target_layer_ids),
        "rope_parameters": getattr(draft.config, "rope_parameters", None),
        "is_causal": [a.is_causal for a in attn],
        "sliding_window": [a.sliding_window for a in attn],
    }


def main() -> None:
    with open(sys.argv[1]) as f:
        req = json.load(f)
    # return_stats=True is the only way dflash_generate returns acceptance_lengths, and it
    # times with `_cuda_time` (torch.cuda.synchronize()), which raises "Found no NVIDIA
    # driver" without a GPU. Only the clock is replaced; no decoding code is touched.
    zlab_model._cuda_time = time.perf_counter
    target = load_target(req["target"]) if any(d["decode"] for d in req["drafters"]) else None
    drafters = []
    for spec in req["drafters"]:
        torch.manual_seed(0)
        draft, info = load_drafter(spec["path"])
        row = reading(draft, info)
        if spec["decode"]:
            row["results"] = decode(draft, target, req)
        drafters.append(row)
    versions = {d: metadata.version(d) for d in ("dflash", "torch", "transformers")}
    print(json.dumps({"dflash_file": dflash.__file__, "versions": versions, "drafters": drafters}))


if __name__ == "__main__":
    main()
