"""`dflash demo` pipeline: target (cached) -> regenerated data (cached) -> drafter via
`dflash.train.train` -> tau against step -> final eval with the lossless check -> plot.

Every stage is the real one: the target is an ordinary HF directory, the data is
written by `dflash regen`'s code and rendered by the trainer's chat-template path,
and the drafter is trained and evaluated exactly as `dflash train`/`dflash eval` do.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from dflash.demo.corpus import build_samples
from dflash.demo.recipe import Recipe


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


def prepare(recipe: Recipe, cache: Path, log=print) -> dict[str, Path]:
    """The cached target directory, its regenerated data and the held-out prompts."""
    from dflash.demo.tiny_lm import build_target
    from dflash.regen import LocalGenerator, regenerate

    root = cache / recipe.cache_key()
    root.mkdir(parents=True, exist_ok=True)
    paths = {
        "target": root / "target",
        "drafter_prompts": root / "drafter_prompts.jsonl",
        "eval_prompts": root / "eval_prompts.jsonl",
        "data": root / "regen.jsonl",
    }
    have_target = (paths["target"] / "config.json").exists()
    if not (have_target and paths["drafter_prompts"].exists() and paths["eval_prompts"].exists()):
        samples = build_samples(recipe.shares, recipe.prompt_chars, recipe.response_chars)
        rng = random.Random(recipe.seed)  # spread prompts over many files, reproducibly
        for split in ("drafter", "eval"):
            rng.shuffle(samples[split])
        rows = {k: [{"id": s["id"], "prompt": s["prompt"]} for s in v] for k, v in samples.items()}
        _write_jsonl(paths["drafter_prompts"], rows["drafter"][: recipe.regen_prompts])
        _write_jsonl(paths["eval_prompts"], rows["eval"])
    if have_target:
        log(f"[demo] reusing cached target {paths['target']}")
    else:
        log(f"[demo] training the target on {len(samples['target'])} stdlib chunks (cached after)")
        tmp = root / ".target.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        curve = build_target(
            tmp,
            samples["target"],
            vocab_size=recipe.vocab_size,
            hidden=recipe.target_hidden,
            layers=recipe.target_layers,
            steps=recipe.target_steps,
            batch=recipe.target_batch,
            seq_len=recipe.target_seq_len,
            lr=recipe.target_lr,
            seed=recipe.seed,
        )
        (tmp / "pretrain_log.json").write_text(json.dumps(curve))
        os.replace(tmp, paths["target"])  # atomic: a half-built target is never reused
    gen = LocalGenerator(str(paths["target"]), max_new_tokens=recipe.regen_max_new_tokens)
    stats = regenerate(
        str(paths["drafter_prompts"]), str(paths["data"]), gen, batch_size=recipe.regen_batch
    )
    log(f"[demo] regenerated data: {json.dumps(stats)} -> {paths['data']}")
    return paths


def train_drafter(
    recipe: Recipe, paths: dict[str, Path], run_dir: Path, arch: str = "dflash"
) -> Path:
    from dflash.config import TrainConfig
    from dflash.train import train

    every = max(1, recipe.draft_steps // recipe.checkpoints)
    out = run_dir / ("train" if arch == "dflash" else f"train-{arch}")
    cfg = TrainConfig(
        out=str(out),
        arch=arch,
        preset="tiny",
        target=str(paths["target"]),
        data=str(paths["data"]),
        max_steps=recipe.draft_steps,
        seq_len=recipe.draft_seq_len,
        block_size=recipe.block_size,
        max_anchors=recipe.draft_anchors,
        draft_layers=recipe.draft_layers,
        num_target_features=recipe.num_target_features,
        lr=recipe.draft_lr,
        seed=recipe.seed,
        save_every=every,
        keep_last=recipe.checkpoints + 1,
        log_every=max(1, recipe.draft_steps // 20),
        wandb="off",
        device="cpu",
        attn="sdpa",
    )
    if train(cfg)["interrupted"]:
        raise KeyboardInterrupt  # the cached target and data survive; a rerun reuses them
    return out


def tau_curve(recipe: Recipe, paths: dict[str, Path], train_dir: Path) -> list[tuple[int, float]]:
    """tau of every kept checkpoint on the first `curve_prompts` held-out prompts."""
    from dflash.checkpoint import list_checkpoints, load_checkpoint
    from dflash.evaluate import evaluate, load_pair, load_prompts

    model, tok, drafter = load_pair(str(paths["target"]), str(train_dir / "drafter"))
    prompts = load_prompts(str(paths["eval_prompts"]), tok, recipe.curve_prompts)
    points = []
    for ckpt in list_checkpoints(train_dir):
        state = load_checkpoint(ckpt)
        drafter.load_state_dict(state["model"])
        s = evaluate(
            model,
            tok,
            drafter,
            prompts,
            block_size=recipe.block_size,
            max_new_tokens=recipe.eval_max_new_tokens,
            progress=False,
        )
        points.append((int(state["step"]), s["tau"]))
        print(f"[demo] step {state['step']}: tau {s['tau']:.2f} on {len(prompts)} prompts")
    return points


def final_eval(
    recipe: Recipe, paths: dict[str, Path], train_dir: Path, out_path: Path
) -> dict[str, Any]:
    from dflash.evaluate import evaluate, load_pair, load_prompts

    model, tok, drafter = load_pair(str(paths["target"]), str(train_dir / "drafter"))
    prompts = load_prompts(str(paths["eval_prompts"]), tok, recipe.eval_prompts)
    return evaluate(
        model,
        tok,
        drafter,
        prompts,
        block_size=recipe.block_size,
        max_new_tokens=recipe.eval_max_new_tokens,
        check_lossless=True,
        speedup_prompts=min(recipe.speedup_prompts, len(prompts)),
        out_path=str(out_path),
    )


def run_demo(recipe: Recipe, cache: Path, run_dir: Path, arch: str = "dflash") -> dict[str, Any]:
    """The demo; `arch="dflash2"` also trains a DFlash2 drafter on the same data with the
    same budget and evaluates it on the same prompts ("dflash2" in the summary)."""
    from dflash.plots import plot_run

    t0, c0 = time.perf_counter(), time.process_time()
    times: dict[str, float] = {}

    def lap(name: str) -> None:
        times[name] = round(time.perf_counter() - t0 - sum(times.values()), 1)

    run_dir.mkdir(parents=True, exist_ok=True)
    paths = prepare(recipe, cache)
    lap("target_and_data_s")
    train_dir = train_drafter(recipe, paths, run_dir)
    lap("train_s")
    with torch.inference_mode():
        points = tau_curve(recipe, paths, train_dir)
        lap("tau_curve_s")
        summary = final_eval(recipe, paths, train_dir, run_dir / "eval.jsonl")
    lap("eval_s")
    second = None
    if arch != "dflash":
        second_dir = train_drafter(recipe, paths, run_dir, arch)
        lap(f"train_{arch}_s")
        with torch.inference_mode():
            s2 = final_eval(recipe, paths, second_dir, run_dir / f"eval-{arch}.jsonl")
        lap(f"eval_{arch}_s")
        keys = ("tau", "accept_hist", "lossless", "speedup", "prompts", "block_size")
        second = {"arch": arch, "drafter": str(second_dir / "drafter")}
        second |= {k: s2[k] for k in keys}
    plot = plot_run(train_dir, points, run_dir / "demo.png", recipe.block_size)
    summary |= {
        "tau_curve": points,
        "plot": str(plot),
        "target": str(paths["target"]),
        "drafter": str(train_dir / "drafter"),
        "eval_prompts": str(paths["eval_prompts"]),
        "times": times,
        "total_s": round(time.perf_counter() - t0, 1),
        # CPU seconds of this process (all threads): the cost on a machine shared with
        # other work, where wall time also counts waiting for a core.
        "cpu_s": round(time.process_time() - c0, 1),
        "recipe": recipe.to_dict(),
    }
    if second is not None:
        summary[arch] = second
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
