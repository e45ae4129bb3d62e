"""One repeat of vLLM speculators' DFlash training step, in speculators' own environment.

Run by bench/peer_step.py as `PEER_PYTHON -I bench/peer_speculators.py SCRATCH OUT`, with
the interpreter of an isolated venv holding speculators==0.9.0 (its pins differ from
ours). It imports only the standard library, torch and speculators' public API, so the
project need not be importable here.

SCRATCH holds what bench/peer_step.py prepared for both sides: spec.json (shapes,
optimizer settings, step counts) and inputs.pt (the packed row, the target's features,
the drafter's initial weights under our key names, the frozen embedding and LM head).
Their step is what speculators' own Trainer runs per batch (train/trainer.py,
`train_epoch`): `model(**batch, **train_call_kwargs)`, zero_grad, backward,
clip_grad_norm_(1.0), optimizer step; the kwargs come from their
`DFlashDraftModel.get_trainer_kwargs` and the optimizer from their `build_optimizers`.

CPU settings, each a pitfall of speculators' defaults on a machine without CUDA (each
failure below was seen with this environment on a CPU-only host):
  * the Trainer itself cannot run: with no GPU, torch.accelerator still reports "cuda"
    (a CUDA build of torch), so Trainer.setup_model moves the model to LOCAL_RANK, i.e.
    cuda:0 ("Found no NVIDIA driver"). This script runs the same calls as its step.
  * attention: `_attn_implementation = "sdpa"`. The default "simple_flex_attention"
    builds its BlockMask with a torch.compile'd create_block_mask; inductor's CPU
    backend needs setuptools, which is not among their dependencies with torch 2.10
    ("InductorError: No module named 'setuptools'"). With setuptools added it compiles
    (about 100 s on a loaded 2-core host) and runs flex_attention eagerly, torch's
    unfused CPU reference. "sdpa" makes their model build a dense boolean mask with
    torch's create_mask and call transformers' SDPA, as ours does on CPU.
  * loss: `loss_implementation="eager"`. The default "fused" loss is a Triton kernel:
    "RuntimeError: 0 active drivers ([]). There should only be one."
  * loss function: "ce" (hard labels: the argmax of the verifier's logits) instead of
    the default "kl_div", so both sides compute a position-decayed cross-entropy.
  * precision: fp32. The Trainer's autocast("cuda", bfloat16) does nothing to CPU
    tensors; ours runs fp32 on CPU too.
Their forward is torch.compile'd only when CUDA is available (conditional_torch_compile),
so on CPU both sides run eagerly.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

T0 = time.perf_counter()

# bench/peer_step.py's module level is the standard library only, so its helpers load here.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_step import peak_rss_mib, profiled  # noqa: E402


def build_model(spec: dict, inputs: dict, attn: str = "sdpa"):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import Qwen3Config

    layer_cfg = Qwen3Config(**spec["drafter_config"])
    layer_cfg._attn_implementation = attn  # see the module doc: their default is flex
    bs = spec["shapes"]["block_size"]
    config = DFlashSpeculatorConfig(
        transformer_layer_config=layer_cfg,
        draft_vocab_size=layer_cfg.vocab_size,  # full vocabulary: no t2d/d2t mapping
        block_size=bs,
        aux_hidden_state_layer_ids=spec["target_layer_ids"],
        mask_token_id=spec["mask_token_id"],
        speculators_config=SpeculatorsConfig(
            algorithm="dflash",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=bs - 1)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["Qwen3ForCausalLM"]),
        ),
    )
    model = DFlashDraftModel(config)
    # Their verifier-owned weights (embedding, LM heads, final norm) normally come from
    # the verifier checkpoint; here they are the same frozen tensors our side uses, and
    # the trainable weights are our drafter's initial ones (the key names coincide).
    state = dict(inputs["drafter"])
    state["embed_tokens.weight"] = inputs["embed"]
    state["lm_head.weight"] = inputs["lm_head"]
    state["verifier_lm_head.weight"] = inputs["lm_head"]
    state["verifier_norm.weight"] = inputs["verifier_norm"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    buffers = {name for name, _ in model.named_buffers()}
    missing = [k for k in missing if k not in buffers]
    if missing or unexpected:
        raise RuntimeError(f"weights do not match: missing {missing}, unexpected {unexpected}")
    return model


def main(scratch: str, out: str, profile: str | None = None) -> None:
    import torch

    spec = json.loads((Path(scratch) / "spec.json").read_text())
    torch.set_num_threads(spec["threads"])
    from speculators.models.dflash import DFlashDraftModel
    from speculators.train.optimizers import build_optimizers
    from speculators.train.trainer import TrainerConfig

    t_import = time.perf_counter()
    inputs = torch.load(Path(scratch) / "inputs.pt", weights_only=True)
    torch.manual_seed(spec["seed"])
    model = build_model(spec, inputs)
    model.train()
    train_kwargs, _ = DFlashDraftModel.get_trainer_kwargs(
        loss_fn="ce",
        loss_implementation="eager",
        dflash_decay_gamma=spec["gamma"],
        max_anchors=spec["shapes"]["max_anchors"],
    )
    opt_cfg = TrainerConfig(
        lr=spec["lr"], num_epochs=1, save_path=scratch, weight_decay=spec["weight_decay"]
    )
    optimizers = build_optimizers(model, opt_cfg)
    batch = {
        "hidden_states": inputs["feats"],
        "input_ids": inputs["input_ids"],
        "loss_mask": inputs["loss_mask"].long(),
        "verifier_last_hidden_states": inputs["last_hidden"],
        "document_ids": inputs["doc_ids"],
        "position_ids": inputs["positions"],
    }
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    t_build = time.perf_counter()
    rss_build = peak_rss_mib()

    def one_step(i: int) -> dict:
        t0, c0 = time.perf_counter(), time.process_time()
        _, loss, _metrics = model(**batch, **train_kwargs)
        c_fwd = time.process_time()
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        c_bwd = time.process_time()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec["grad_clip"])
        for opt in optimizers:
            opt.step()
        c_end = time.process_time()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise RuntimeError(f"speculators step {i}: loss is not finite ({value})")
        stages = {"forward": c_fwd - c0, "backward": c_bwd - c_fwd, "optimizer": c_end - c_bwd}
        return {"wall_s": time.perf_counter() - t0, "cpu_s": c_end - c0,
                "stages_cpu_s": stages, "loss": value}  # fmt: skip

    warmup = [one_step(i) for i in range(spec["warmup"])]
    with profiled(profile):
        steps = [one_step(i) for i in range(spec["warmup"], spec["warmup"] + spec["steps"])]
    result = {
        "side": "speculators",
        "torch": torch.__version__,
        "trainable_params": trainable,
        "import_s": t_import - T0,
        "build_s": t_build - t_import,
        "rss_after_build_mib": rss_build,
        "peak_rss_mib": peak_rss_mib(),
        "warmup": warmup,
        "steps": steps,
    }
    Path(out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: peer_speculators.py SCRATCH OUT [PROFILE] (run by bench/peer_step.py)")
    main(*sys.argv[1:])
